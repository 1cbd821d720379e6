// Fused softmax attention with one or two maps on the CPU (formulas in
// difftx/ops/attention.hpp), in the manner of FlashAttention-2: memory linear
// in N, no N x N matrix ever stored.
//
// Forward: one parallel region packs the keys and values of every (batch
// row, key/value group) pair (a float copy the size of k and v), then takes
// items (pair, block of 64 queries, head), largest first. Each item streams the
// key/value blocks once; for each map it keeps the running row maximum, row
// sum and an accumulator of P·V (two accumulators for differential attention,
// since the backward needs O_2 on its own); skips key blocks wholly after the
// queries (causal); finally O = O_1 - λ O_2 and the log-sum-exp of every row.
//
// Backward, per pair and block of 64 keys: dK and dV of the block stay in the
// thread's tiles while every query block of every head of the group that sees
// these keys passes by; probabilities are recomputed from the saved
// log-sum-exp. When the pairs keep every thread busy (a multiple of the thread
// count, or at least 4 per thread), each thread takes whole pairs and owns
// their dQ; else the threads share a pair's key blocks, each with a dQ
// accumulator, summed at the end.
//
// Operands are converted into A-typed copies laid out for tile_product (keys
// and values also transposed), padded to whole blocks with zeros; masked and
// padded entries get probability 0.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "difftx/ops/attention.hpp"
#include "difftx/ops/logit_quantization.hpp"
#include "difftx/policy/simd/attention_int8.hpp"
#include "difftx/policy/simd/common.hpp"
#include "difftx/policy/simd/gemm.hpp"
#include "difftx/policy/simd/tile.hpp"

namespace difftx {

namespace simd_detail {

constexpr index_t attention_block = 64;  // queries and keys per tile; a multiple of every vector width

inline index_t round_up(index_t n, index_t to) { return (n + to - 1) / to * to; }

// The keys and values of one (batch row, group), as A, in whole blocks (zero
// past the last key). The transposed copies are stored block by block, so the
// tile a product reads is contiguous (a row stride of n_pad floats would put
// every row of a tile in the same L1 set whenever n_pad is a multiple of 1024).
template <class A>
struct packed_keys {
  index_t n_pad = 0, maps = 1;
  bool for_backward = false;  // which copies reset sized: kt, k, vt for the backward, else kt, v
  aligned_vector<A> kt;  // [blocks][Maps][d][Bs]  S = Q · kt
  aligned_vector<A> k;   // [Maps][n_pad][d]       dQ = dS · k          (backward)
  aligned_vector<A> v;   // [n_pad][dv]            O += P · v           (forward)
  aligned_vector<A> vt;  // [blocks][dv][Bs]       dP = dO · vt          (backward)
  // The tile of kt / vt for key block kb (map m).
  const A* kt_tile(index_t kb, index_t m, index_t d) const { return kt.data() + ((kb * maps + m) * d) * attention_block; }
  const A* vt_tile(index_t kb, index_t dv) const { return vt.data() + kb * dv * attention_block; }

  // Sized for N keys; pack_key_block writes every element, so nothing is zeroed here.
  void reset(index_t N, index_t Maps, index_t d, index_t dv, bool backward) {
    n_pad = round_up(N, attention_block);
    maps = Maps;
    for_backward = backward;
    auto sized = [](aligned_vector<A>& buffer, index_t size) { buffer.resize(static_cast<std::size_t>(size)); };
    sized(kt, Maps * d * n_pad);
    sized(k, for_backward ? Maps * n_pad * d : 0);
    sized(v, for_backward ? 0 : n_pad * dv);
    sized(vt, for_backward ? dv * n_pad : 0);
  }
};

// Rows [t0, t0 + rows) of a tensor (row t0 at first, one row every stride
// values, width values each) as the block [Bs][width] of A at dst, zero past
// the last row.
template <class T>
accum_t<T>* pack_block_rows(const T* first, index_t stride, index_t rows, index_t width, accum_t<T>* dst) {
  pack_rows(first, stride, rows, width, dst, width);
  std::fill(dst + rows * width, dst + attention_block * width, accum_t<T>(0));
  return dst;
}

// Key block kb of (batch row b, group j) into out, a block of rows at a time,
// so every write is sequential (a key at a time, the transposed copies took a
// cache line per element and 5% of the backward). Rows without a row-major
// home (the forward's keys, the backward's values) go through `staging`.
template <int Maps, class T>
void pack_key_block(cview<T, 5> k, cview<T, 4> v, index_t b, index_t j, index_t kb, packed_keys<accum_t<T>>& out,
                    std::vector<accum_t<T>>& staging) {
  using A = accum_t<T>;
  using rows_map = Eigen::Map<Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
  constexpr index_t Bs = attention_block;
  const index_t N = k.extent(1), G = k.extent(2), d = k.extent(4), dv = v.extent(3), t0 = kb * Bs;
  const index_t keys = std::min(Bs, N - t0);
  auto scratch = [&](index_t width) {
    staging.resize(static_cast<std::size_t>(Bs * width));
    return staging.data();
  };
  auto transposed_into = [&](A* rows, index_t width, A* tile) { rows_map(tile, width, Bs) = rows_map(rows, Bs, width).transpose(); };
  for (index_t m = 0; m < Maps; ++m) {
    A* rows = pack_block_rows(k.data() + (((b * N + t0) * G + j) * Maps + m) * d, G * Maps * d, keys, d,
                              out.for_backward ? out.k.data() + (m * out.n_pad + t0) * d : scratch(d));
    transposed_into(rows, d, out.kt.data() + (kb * Maps + m) * d * Bs);
  }
  const T* first_value = v.data() + ((b * N + t0) * G + j) * dv;
  if (out.for_backward)
    transposed_into(pack_block_rows(first_value, G * dv, keys, dv, scratch(dv)), dv, out.vt.data() + kb * dv * Bs);
  else
    pack_block_rows(first_value, G * dv, keys, dv, out.v.data() + t0 * dv);
}

// One pair's keys, queries and output gradients, packed for the backward.
template <class A>
struct packed_pair {
  packed_keys<A> keys;
  aligned_vector<A> q;    // [r][Maps][n_pad][d], scaled by 1/sqrt(d)
  aligned_vector<A> d_o;  // [r][n_pad][dv]
};

// A thread's tiles for the backward of one key block.
template <class A>
struct backward_tiles {
  aligned_vector<A> probabilities, weight, dp, ds, dk, dv;
  backward_tiles(index_t maps, index_t d, index_t dv_size)
      : probabilities(static_cast<std::size_t>(maps * attention_block * attention_block)),
        weight(static_cast<std::size_t>(maps == 2 ? attention_block * attention_block : 0)),
        dp(static_cast<std::size_t>(attention_block * attention_block)),
        ds(dp.size()),
        dk(static_cast<std::size_t>(maps * attention_block * d)),
        dv(static_cast<std::size_t>(attention_block * dv_size)) {}
};

// How many keys of key block t0 row i may see: 0 for padded rows.
inline index_t visible_keys(index_t i, index_t t0, index_t N, bool causal) {
  if (i >= N) return 0;
  const index_t end = causal ? std::min(i + 1, N) : N;
  return std::clamp<index_t>(end - t0, 0, attention_block);
}

template <class A>
A row_max(const A* x, index_t n) {
  using V = vec<A>;
  constexpr index_t W = V::size;
  V vm(-std::numeric_limits<A>::infinity());
  index_t t = 0;
  for (; t + W <= n; t += W) vm = xsimd::max(vm, V::load_unaligned(x + t));
  alignas(64) A lanes[W];
  vm.store_aligned(lanes);
  A m = lanes[0];
  for (index_t l = 1; l < W; ++l) m = std::max(m, lanes[l]);
  for (; t < n; ++t) m = std::max(m, x[t]);
  return m;
}

// x[0, n) *= factor
template <class A>
void scale_in_place(A* x, index_t n, A factor) {
  using V = vec<A>;
  constexpr index_t W = V::size;
  index_t i = 0;
  for (; i + W <= n; i += W) (V::load_unaligned(x + i) * V(factor)).store_unaligned(x + i);
  for (; i < n; ++i) x[i] *= factor;
}

// Asks for n values from first on into L2, for writing. dQ's accumulator is
// too large for L2 (n_pad·d per head and map); without this its tile arrived
// from L3 only when the dQ product loaded it, which then ran 20% slower than
// the other products.
template <class A>
void prefetch_tile([[maybe_unused]] const A* first, [[maybe_unused]] index_t n) {
#if defined(__GNUC__)
  for (index_t e = 0; e < n; e += index_t(64 / sizeof(A))) __builtin_prefetch(first + e, 1, 2);
#endif
}

// out = x + a y on Bs x Bs tiles (a whole number of vectors).
template <class A>
void add_scaled_tile(const A* x, A a, const A* y, A* out) {
  using V = vec<A>;
  for (index_t e = 0; e < attention_block * attention_block; e += V::size)
    simd_detail::multiply_add(V(a), V::load_unaligned(y + e), V::load_unaligned(x + e)).store_unaligned(out + e);
}

// p[t] = exp(p[t] - shift) for t < n, in place.
template <class A>
void exponentiate_row(A* p, index_t n, A shift) {
  using V = vec<A>;
  constexpr index_t W = V::size;
  index_t t = 0;
  for (; t + W <= n; t += W) xsimd::exp(V::load_unaligned(p + t) - V(shift)).store_unaligned(p + t);
  for (; t < n; ++t) p[t] = std::exp(p[t] - shift);
}
// The same for a tile row: then 0 for t in [n, attention_block).
template <class A>
void exponentiate(A* s, index_t n, A shift) {
  exponentiate_row(s, n, shift);
  std::fill(s + n, s + attention_block, A(0));
}

// The forward below; with qk = int8 the score tiles come from tile_kernel
// (attention_int8.hpp), or from the float product on the int8 values when it
// is nullptr (the tests pass a model of the instruction).
template <int Maps, class T>
void fused_attention_forward(const policy::simd& p, cview<T, 5> q, cview<T, 5> k, cview<T, 4> v,
                             cview<accum_t<T>, 1> lambda, bool causal, TensorView<T, 4> o, TensorView<T, 4> o2,
                             TensorView<accum_t<T>, 4> lse, int logit_bits, inference_dtype qk,
                             score_tile_fn tile_kernel) {
  using A = accum_t<T>;
  constexpr index_t Bs = attention_block;
  const index_t B = q.extent(0), N = q.extent(1), H = q.extent(2), G = k.extent(2), d = q.extent(4);
  const index_t r = H / G, dv = v.extent(3), blocks = round_up(N, Bs) / Bs;
  const A scale = A(1) / std::sqrt(static_cast<A>(d));
  const A lam = Maps == 2 ? lambda(0) : A(0);
  const index_t pairs = B * G;  // (batch row, key/value group)
  std::vector<packed_keys<A>> keys(static_cast<std::size_t>(pairs));
  for (auto& pair_keys : keys) pair_keys.reset(N, Maps, d, dv, false);
  const bool int8_qk = qk == inference_dtype::int8;
  if constexpr (!std::is_same_v<A, float>) tile_kernel = nullptr;  // the VNNI tile computes in float
  const bool tiled = int8_qk && tile_kernel != nullptr;
  std::vector<int8_keys<A>> keys8(int8_qk ? static_cast<std::size_t>(pairs) : 0);
  for (auto& pair_keys : keys8) pair_keys.reset(round_up(N, Bs), Maps, d, tiled);
  const index_t d4 = (d + 3) / 4;

  // One parallel region: pack every pair's keys, then every (pair, query block,
  // head) item, so that short sequences still give each thread several items.
#pragma omp parallel num_threads(thread_count(p))
  {
    aligned_vector<A> q_tile(static_cast<std::size_t>(Maps * Bs * d)), s(static_cast<std::size_t>(Bs * Bs)),
        acc(static_cast<std::size_t>(Maps * Bs * dv)), running_max(static_cast<std::size_t>(Maps * Bs)),
        running_sum(static_cast<std::size_t>(Maps * Bs));
    std::vector<A> row_scratch;
    std::vector<detail::logit_grid<A>> grids(static_cast<std::size_t>(Maps * Bs));  // inactive unless quantizing
    std::vector<A> q_steps(int8_qk ? static_cast<std::size_t>(Maps * Bs) : 0);
    aligned_vector<std::int8_t> q8(tiled ? static_cast<std::size_t>(Maps * Bs * 4 * d4) : 0);
#pragma omp for schedule(static)
    for (index_t block = 0; block < pairs * blocks; ++block) {
      const index_t pair = block / blocks;
      auto& pair_keys = keys[static_cast<std::size_t>(pair)];
      pack_key_block<Maps, T>(k, v, pair / G, pair % G, block % blocks, pair_keys, row_scratch);
      if (int8_qk)
        for (index_t m = 0; m < Maps; ++m)
          keys8[static_cast<std::size_t>(pair)].quantize_block(block % blocks, m, pair_keys.kt.data() + ((block % blocks) * Maps + m) * d * Bs);
    }
    // S_m for key block kb into s: the float product, or int8 (ops/attention.hpp).
    auto score_tile = [&](const packed_keys<A>& pair_keys, const int8_keys<A>* pair_keys8, index_t kb, index_t m) {
      if constexpr (std::is_same_v<A, float>)
        if (tiled) {
          tile_kernel(d4, q8.data() + m * Bs * 4 * d4, pair_keys8->k8_of(kb, m), pair_keys8->corr_of(kb, m),
                      q_steps.data() + m * Bs, pair_keys8->steps_of(kb, m), s.data());
          return;
        }
      tile_product<a_layout::rows>(Bs, Bs, d, q_tile.data() + m * Bs * d, d, pair_keys.kt_tile(kb, m, d), Bs, s.data(),
                                   Bs, false);
      if (int8_qk) scale_scores(s.data(), q_steps.data() + m * Bs, pair_keys8->steps_of(kb, m));
    };

    // Items from the last query block down: with a causal mask they are the largest.
#pragma omp for schedule(dynamic, 1)
    for (index_t item = 0; item < blocks * pairs * r; ++item) {
      const index_t qb = blocks - 1 - item / (pairs * r), pair = item / r % pairs, b = pair / G, j = pair % G;
      const index_t h = j * r + item % r, i0 = qb * Bs;
      const index_t rows = std::min(Bs, N - i0);
      const packed_keys<A>& pair_keys = keys[static_cast<std::size_t>(pair)];
      const int8_keys<A>* pair_keys8 = int8_qk ? &keys8[static_cast<std::size_t>(pair)] : nullptr;
      std::fill(q_tile.begin(), q_tile.end(), A(0));
      for (index_t i = 0; i < rows; ++i)
        for (index_t m = 0; m < Maps; ++m) {
          const A* row = accum_row(q.data() + (((b * N + i0 + i) * H + h) * Maps + m) * d, d, row_scratch);
          for (index_t c = 0; c < d; ++c) q_tile[static_cast<std::size_t>((m * Bs + i) * d + c)] = row[c] * scale;
        }
      if (int8_qk)
        for (index_t m = 0; m < Maps; ++m)
          quantize_query_tile(q_tile.data() + m * Bs * d, rows, d, d4, q_steps.data() + m * Bs,
                              tiled ? q8.data() + m * Bs * 4 * d4 : nullptr);
      std::fill(acc.begin(), acc.end(), A(0));
      std::fill(running_max.begin(), running_max.end(), -std::numeric_limits<A>::infinity());
      std::fill(running_sum.begin(), running_sum.end(), A(0));

      const index_t kb_end = causal ? qb + 1 : blocks;
      if (logit_bits != logits_unquantized) {  // every row's largest |logit|, then its grid
        std::fill(running_max.begin(), running_max.end(), A(0));
        for (index_t kb = 0; kb < kb_end; ++kb)
          for (index_t m = 0; m < Maps; ++m) {
            score_tile(pair_keys, pair_keys8, kb, m);
            for (index_t i = 0; i < rows; ++i) {
              A& largest = running_max[static_cast<std::size_t>(m * Bs + i)];
              largest = std::max(largest, detail::largest_magnitude(s.data() + i * Bs, visible_keys(i0 + i, kb * Bs, N, causal)));
            }
          }
        for (index_t mi = 0; mi < Maps * Bs; ++mi)
          grids[static_cast<std::size_t>(mi)] = detail::logit_grid<A>(running_max[static_cast<std::size_t>(mi)], logit_bits);
        std::fill(running_max.begin(), running_max.end(), -std::numeric_limits<A>::infinity());
      }
      for (index_t kb = 0; kb < kb_end; ++kb) {
        const index_t t0 = kb * Bs;
        for (index_t m = 0; m < Maps; ++m) {
          A* acc_m = acc.data() + m * Bs * dv;
          score_tile(pair_keys, pair_keys8, kb, m);
          for (index_t i = 0; i < rows; ++i) {
            A* s_row = s.data() + i * Bs;
            const index_t visible = visible_keys(i0 + i, t0, N, causal);
            const auto mi = static_cast<std::size_t>(m * Bs + i);
            grids[mi].apply(s_row, visible);
            const A new_max = std::max(running_max[mi], row_max(s_row, visible));
            exponentiate(s_row, visible, new_max);
            if (new_max > running_max[mi]) {  // else the old terms keep their scale
              const A rescale = std::exp(running_max[mi] - new_max);  // 0 on the first block
              running_sum[mi] *= rescale;
              scale_in_place(acc_m + i * dv, dv, rescale);
              running_max[mi] = new_max;
            }
            running_sum[mi] += sum(s_row, visible);
          }
          for (index_t i = rows; i < Bs; ++i) std::fill(s.begin() + i * Bs, s.begin() + (i + 1) * Bs, A(0));
          tile_product<a_layout::rows>(Bs, dv, Bs, s.data(), Bs, pair_keys.v.data() + t0 * dv, dv, acc_m, dv, true);
        }
      }

      for (index_t i = 0; i < rows; ++i) {
        const index_t row = ((b * N + i0 + i) * H + h) * dv;
        for (index_t m = 0; m < Maps; ++m) {
          const auto mi = static_cast<std::size_t>(m * Bs + i);
          lse(b, h, m, i0 + i) = running_max[mi] + std::log(running_sum[mi]);
          scale_in_place(acc.data() + (m * Bs + i) * dv, dv, A(1) / running_sum[mi]);
        }
        A* o_first = acc.data() + i * dv;
        if constexpr (Maps == 2) {
          const A* o_second = acc.data() + (Bs + i) * dv;
          from_accum(o_second, dv, o2.data() + row);
          for (index_t c = 0; c < dv; ++c) o_first[c] -= lam * o_second[c];
        }
        from_accum(o_first, dv, o.data() + row);
      }
    }
  }
}

}  // namespace simd_detail

// q [B,N,H,Maps,d], k [B,N,G,Maps,d], v [B,N,G,dv], lambda [1] (Maps = 2)
//   -> o [B,N,H,dv]; saved o2 [B,N,H,dv] (Maps = 2), lse [B,H,Maps,N]
// logit_bits: 16, or the logits quantized to 4..8 bits (ops/logit_quantization.hpp):
// each item then sweeps its keys twice, first for every row's largest |logit|.
// qk = int8: Q·Kᵀ on int8 queries and keys (ops/attention.hpp, attention_int8.hpp).
template <int Maps, class T>
  requires supported_by<policy::simd, T>
void attention_forward(const policy::simd& p, cview<T, 5> q, cview<T, 5> k, cview<T, 4> v,
                       cview<accum_t<T>, 1> lambda, bool causal, TensorView<T, 4> o, TensorView<T, 4> o2,
                       TensorView<accum_t<T>, 4> lse, int logit_bits = logits_unquantized,
                       inference_dtype qk = inference_dtype::same) {
  using A = accum_t<T>;
  constexpr std::string_view where = "attention_forward";
  detail::check_attention<Maps>(where, memory_space::host, q, k, v, lambda, o, o2, lse, "o");
  detail::check_logit_bits<A>(where, logit_bits);
  detail::check_qk_dtype<A>(where, qk, q.extent(4));
  simd_detail::fused_attention_forward<Maps, T>(p, q, k, v, lambda, causal, o, o2, lse, logit_bits, qk,
                                                simd_detail::int8_score_tile<A>());
}

// do [B,N,H,dv] -> dq [B,N,H,Maps,d], dk [B,N,G,Maps,d], dv [B,N,G,dv], dlambda [1] (all assigned)
template <int Maps, class T>
  requires supported_by<policy::simd, T>
void attention_backward(const policy::simd& p, cview<T, 5> q, cview<T, 5> k, cview<T, 4> v,
                        cview<accum_t<T>, 1> lambda, bool causal, cview<T, 4> o, cview<T, 4> o2,
                        cview<accum_t<T>, 4> lse, cview<T, 4> d_o, TensorView<T, 5> dq, TensorView<T, 5> dk,
                        TensorView<T, 4> dv, TensorView<accum_t<T>, 1> dlambda) {
  using namespace simd_detail;
  using A = accum_t<T>;
  constexpr std::string_view where = "attention_backward";
  detail::check_attention_backward<Maps>(where, memory_space::host, q, k, v, lambda, o, o2, lse, d_o, dq, dk, dv,
                                         dlambda);
  constexpr index_t Bs = attention_block;
  const index_t B = q.extent(0), N = q.extent(1), H = q.extent(2), G = k.extent(2), d = q.extent(4);
  const index_t r = H / G, dv_size = v.extent(3), n_pad = round_up(N, Bs), blocks = n_pad / Bs;
  const A scale = A(1) / std::sqrt(static_cast<A>(d));
  const A lam = Maps == 2 ? lambda(0) : A(0);
  const A coeff[2] = {A(1), -lam};  // the weight of each map in O
  const int threads = thread_count(p);

  // D_m = rowsum(dO ⊙ O_m) per row, with O_1 = O + λ O_2; dλ = -Σ D_2.
  std::vector<A> rowsum_do_o(static_cast<std::size_t>(B * H * Maps * N));
  A dlambda_total(0);
#pragma omp parallel num_threads(threads) reduction(+ : dlambda_total)
  {
    std::vector<A> scratch_do, scratch_o, scratch_o2;
#pragma omp for schedule(static)
    for (index_t row = 0; row < B * N * H; ++row) {
      const index_t b = row / (N * H), i = row / H % N, h = row % H;
      const A* g = accum_row(d_o.data() + row * dv_size, dv_size, scratch_do);
      const A* out = accum_row(o.data() + row * dv_size, dv_size, scratch_o);
      auto& first = rowsum_do_o[static_cast<std::size_t>(((b * H + h) * Maps) * N + i)];
      first = dot(g, out, dv_size);
      if constexpr (Maps == 2) {
        const A* second = accum_row(o2.data() + row * dv_size, dv_size, scratch_o2);
        const A d2 = dot(g, second, dv_size);
        first += lam * d2;
        rowsum_do_o[static_cast<std::size_t>(((b * H + h) * Maps + 1) * N + i)] = d2;
        dlambda_total -= d2;
      }
    }
  }
  if constexpr (Maps == 2) dlambda(0) = dlambda_total;

  // Per (batch row, group) pair: its keys, queries and output gradients packed
  // as A, then per key block of 64: dK and dV of the block stay in the thread's
  // tiles while every query block of every head of the group that sees these
  // keys passes by, and dQ's contributions go to a [r][Maps][n_pad][d] accumulator.
  const index_t pairs = B * G;
  auto reset = [&](packed_pair<A>& packed) {  // pack_block writes every element
    packed.keys.reset(N, Maps, d, dv_size, true);
    packed.q.resize(static_cast<std::size_t>(r * Maps * n_pad * d));  // scaled by 1/sqrt(d)
    packed.d_o.resize(static_cast<std::size_t>(r * n_pad * dv_size));
  };
  // Block kb of the pair's keys, queries and output gradients (zero past N).
  auto pack_block = [&](index_t pair, index_t kb, packed_pair<A>& packed, std::vector<A>& scratch) {
    const index_t b = pair / G, j = pair % G, t0 = kb * Bs, rows = std::min(Bs, N - t0);
    pack_key_block<Maps, T>(k, v, b, j, kb, packed.keys, scratch);
    for (index_t hl = 0; hl < r; ++hl) {
      const index_t h = j * r + hl;
      for (index_t m = 0; m < Maps; ++m)
        scale_in_place(pack_block_rows(q.data() + (((b * N + t0) * H + h) * Maps + m) * d, H * Maps * d, rows, d,
                                       packed.q.data() + ((hl * Maps + m) * n_pad + t0) * d),
                       rows * d, scale);
      pack_block_rows(d_o.data() + ((b * N + t0) * H + h) * dv_size, H * dv_size, rows, dv_size,
                      packed.d_o.data() + (hl * n_pad + t0) * dv_size);
    }
  };
  auto key_block = [&](index_t pair, const packed_pair<A>& packed, index_t kb, A* dq_acc, backward_tiles<A>& tiles) {
    const index_t b = pair / G, j = pair % G, t0 = kb * Bs;
    const packed_keys<A>& keys = packed.keys;
    A *probabilities = tiles.probabilities.data(), *weight = tiles.weight.data(), *dp = tiles.dp.data(),
      *ds = tiles.ds.data(), *dk_tile = tiles.dk.data(), *dv_tile = tiles.dv.data();
    std::fill(tiles.dk.begin(), tiles.dk.end(), A(0));
    std::fill(tiles.dv.begin(), tiles.dv.end(), A(0));
    for (index_t hl = 0; hl < r; ++hl) {
      const index_t h = j * r + hl;
      for (index_t qb = causal ? kb : 0; qb < blocks; ++qb) {
        const index_t i0 = qb * Bs;
        const A* do_tile = packed.d_o.data() + (hl * n_pad + i0) * dv_size;
        for (index_t m = 0; m < Maps; ++m) prefetch_tile(dq_acc + ((hl * Maps + m) * n_pad + i0) * d, Bs * d);
        // P_m = exp(S_m - lse_m), masked; weight = Σ_m c_m P_m
        for (index_t m = 0; m < Maps; ++m) {
          A* pm = probabilities + m * Bs * Bs;
          const A* q_tile = packed.q.data() + ((hl * Maps + m) * n_pad + i0) * d;
          tile_product<a_layout::rows>(Bs, Bs, d, q_tile, d, keys.kt_tile(kb, m, d), Bs, pm, Bs, false);
          for (index_t i = 0; i < Bs; ++i) {
            const index_t visible = visible_keys(i0 + i, t0, N, causal);
            const A row_lse = visible > 0 ? lse(b, h, m, i0 + i) : A(0);
            exponentiate(pm + i * Bs, visible, row_lse);
          }
        }
        const A* weight_tile = probabilities;  // one map: its probabilities
        if constexpr (Maps == 2) {
          add_scaled_tile(probabilities, coeff[1], probabilities + Bs * Bs, weight);
          weight_tile = weight;
        }
        // dV += weightᵀ dO;  dP = dO Vᵀ
        tile_product<a_layout::transposed>(Bs, dv_size, Bs, weight_tile, Bs, do_tile, dv_size, dv_tile, dv_size, true);
        tile_product<a_layout::rows>(Bs, Bs, dv_size, do_tile, dv_size, keys.vt_tile(kb, dv_size), Bs, dp, Bs, false);
        for (index_t m = 0; m < Maps; ++m) {
          // dS_m = c_m P_m ⊙ (dP - D_m), with respect to the scaled scores
          const A* pm = probabilities + m * Bs * Bs;
          for (index_t i = 0; i < Bs; ++i) {
            const A rowsum =
                i0 + i < N ? rowsum_do_o[static_cast<std::size_t>(((b * H + h) * Maps + m) * N + i0 + i)] : A(0);
            for (index_t t = 0; t < Bs; ++t) ds[i * Bs + t] = coeff[m] * pm[i * Bs + t] * (dp[i * Bs + t] - rowsum);
          }
          // dQ_m += dS_m K_m (scaled by 1/sqrt(d) when stored); dK_m += dS_mᵀ (Q_m / sqrt(d))
          tile_product<a_layout::rows>(Bs, d, Bs, ds, Bs, keys.k.data() + (m * n_pad + t0) * d, d,
                                       dq_acc + ((hl * Maps + m) * n_pad + i0) * d, d, true);
          tile_product<a_layout::transposed>(Bs, d, Bs, ds, Bs, packed.q.data() + ((hl * Maps + m) * n_pad + i0) * d, d,
                                             dk_tile + m * Bs * d, d, true);
        }
      }
    }
    for (index_t t = t0; t < std::min(N, t0 + Bs); ++t) {
      for (index_t m = 0; m < Maps; ++m)
        from_accum(dk_tile + (m * Bs + t - t0) * d, d, dk.data() + (((b * N + t) * G + j) * Maps + m) * d);
      from_accum(dv_tile + (t - t0) * dv_size, dv_size, dv.data() + ((b * N + t) * G + j) * dv_size);
    }
  };
  // dQ of row i of the pair: the sum of the accumulators, / sqrt(d).
  auto store_dq = [&](index_t pair, index_t i, const std::vector<const A*>& accumulators, std::vector<A>& row) {
    const index_t b = pair / G, j = pair % G;
    row.resize(static_cast<std::size_t>(d));
    for (index_t hl = 0; hl < r; ++hl)
      for (index_t m = 0; m < Maps; ++m) {
        const index_t offset = ((hl * Maps + m) * n_pad + i) * d;
        std::fill(row.begin(), row.end(), A(0));
        for (const A* acc : accumulators)
          for (index_t c = 0; c < d; ++c) row[static_cast<std::size_t>(c)] += acc[offset + c];
        for (auto& x : row) x *= scale;
        from_accum(row.data(), d, dq.data() + (((b * N + i) * H + j * r + hl) * Maps + m) * d);
      }
  };
  const auto dq_size = static_cast<std::size_t>(r * Maps * n_pad * d);

  if (pairs % threads == 0 || pairs >= 4 * threads) {
    // Pairs enough to keep every thread busy (pairs cost the same): a thread
    // takes a whole pair, so its dQ accumulator is the only one and nothing is
    // reduced. (3 pairs on 2 threads would leave a third of the time idle.)
#pragma omp parallel num_threads(threads)
    {
      packed_pair<A> packed;
      backward_tiles<A> tiles(Maps, d, dv_size);
      aligned_vector<A> dq_acc;
      std::vector<A> scratch;
#pragma omp for schedule(dynamic, 1)
      for (index_t pair = 0; pair < pairs; ++pair) {
        reset(packed);
        for (index_t kb = 0; kb < blocks; ++kb) pack_block(pair, kb, packed, scratch);
        dq_acc.assign(dq_size, A(0));
        for (index_t kb = 0; kb < blocks; ++kb) key_block(pair, packed, kb, dq_acc.data(), tiles);
        const std::vector<const A*> accumulators{dq_acc.data()};
        for (index_t i = 0; i < N; ++i) store_dq(pair, i, accumulators, scratch);
      }
    }
  } else {
    // Else the threads share each pair's key blocks, each with its own dQ
    // accumulator, summed at the end.
    packed_pair<A> packed;
    std::vector<aligned_vector<A>> dq_partial(static_cast<std::size_t>(threads));
    for (index_t pair = 0; pair < pairs; ++pair) {
      reset(packed);
      for (auto& partial : dq_partial) partial.clear();  // a thread absent from the team adds nothing
#pragma omp parallel num_threads(threads)
      {
        std::vector<A> scratch;
#pragma omp for schedule(static)
        for (index_t kb = 0; kb < blocks; ++kb) pack_block(pair, kb, packed, scratch);
#if defined(_OPENMP)
        auto& dq_acc = dq_partial[static_cast<std::size_t>(omp_get_thread_num())];
#else
        auto& dq_acc = dq_partial[0];
#endif
        dq_acc.assign(dq_size, A(0));
        backward_tiles<A> tiles(Maps, d, dv_size);
#pragma omp for schedule(dynamic, 1)
        for (index_t kb = 0; kb < blocks; ++kb) key_block(pair, packed, kb, dq_acc.data(), tiles);  // block 0 is the largest
        std::vector<const A*> accumulators;
        for (const auto& partial : dq_partial)
          if (!partial.empty()) accumulators.push_back(partial.data());
#pragma omp for schedule(static)
        for (index_t i = 0; i < N; ++i) store_dq(pair, i, accumulators, scratch);
      }
    }
  }
}

}  // namespace difftx
