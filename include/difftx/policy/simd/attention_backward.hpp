// The fused attention backward with one or two maps on the CPU (formulas in
// difftx/ops/attention.hpp), FlashAttention-2's: probabilities are recomputed
// from the saved log-sum-exp, memory stays linear in N.
//
// First D_m = rowsum(dO ⊙ O_m) of every row and each head's dλ. Then per
// (batch row, group) pair: its keys, queries and output gradients packed as
// A, and per key block of 64: dK and dV of the block stay in the thread's
// tiles while every query block of every head of the group that sees these
// keys passes by, and dQ's contributions go to a [r][Maps][n_pad][d] accumulator. When the
// pairs keep every thread busy (a multiple of the thread count, or at least 4
// per thread), each thread takes whole pairs and owns their dQ; else the
// threads share a pair's key blocks, each with a dQ accumulator, summed at the
// end. In bfloat16, S_m and dP may run on bfloat16 pairs
// (attention_bf16_backward.hpp); the other products are float.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "difftx/policy/simd/attention_bf16_backward.hpp"
#include "difftx/policy/simd/attention_tiles.hpp"
#include "difftx/policy/simd/common.hpp"
#include "difftx/policy/simd/tile.hpp"

namespace difftx::simd_detail {

// One pair's keys, queries and output gradients, packed for the backward.
template <class A>
struct packed_pair {
  packed_keys<A> keys;
  aligned_vector<A> q;    // [r][Maps][n_pad][d], scaled by 1/sqrt(d) (n_pad: N rounded up to blocks)
  aligned_vector<A> d_o;  // [r][n_pad][dv]
  bf16_backward_pairs pairs;  // S_m's and dP's bfloat16 operands, where they run on pairs (else empty)
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

// Asks for n values from first on into L2, for writing. dQ's accumulator is
// too large for L2 (n_pad·d per head and map); without this its tile came
// from L3 only when the dQ product loaded it, and that product waited on it
// (it ran a fifth slower than the other tile products).
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

// One backward call: its operands, sizes, and D_m of every row. The phases
// below are its member functions, in the order they run. N queries, M keys.
template <int Maps, class T>
struct attention_backward_pass {
  using A = accum_t<T>;
  static constexpr index_t Bs = attention_block;
  cview<T, 5> q, k;
  cview<T, 4> v;
  cview<T, 4> o, o2;
  cview<A, 4> lse;
  cview<T, 4> d_o;
  TensorView<T, 5> dq, dk;
  TensorView<T, 4> dv;
  index_t B, N, M, H, G, d, r, dv_size, n_pad, blocks, key_blocks, pairs;
  key_window window;
  A scale;
  detail::head_lambdas<A> lambdas;
  std::vector<A> rowsum_do_o;   // D_m [B][H][Maps][N]
  // S_m and dP on bfloat16 pairs where set (T = bfloat16 only), else float products.
  static constexpr bool bf16_inputs = std::is_same_v<T, Eigen::bfloat16>;
  bf16_score_tile_fn pair_tile;

  attention_backward_pass(cview<T, 5> queries, cview<T, 5> keys, cview<T, 4> values, cview<A, 1> lambda,
                          bool is_causal, cview<T, 4> out, cview<T, 4> out2, cview<A, 4> log_sum_exp,
                          cview<T, 4> out_grad, TensorView<T, 5> dq_out, TensorView<T, 5> dk_out,
                          TensorView<T, 4> dv_out, bf16_score_tile_fn pair_kernel)
      : q(queries), k(keys), v(values), o(out), o2(out2), lse(log_sum_exp), d_o(out_grad),
        dq(dq_out), dk(dk_out), dv(dv_out),
        B(q.extent(0)), N(q.extent(1)), M(k.extent(1)), H(q.extent(2)), G(k.extent(2)), d(q.extent(4)), r(H / G),
        dv_size(v.extent(3)), n_pad(round_up(N, Bs)), blocks(n_pad / Bs), key_blocks(round_up(M, Bs) / Bs),
        pairs(B * G), window{N, M, is_causal}, scale(A(1) / std::sqrt(static_cast<A>(d))), lambdas(lambda),
        rowsum_do_o(static_cast<std::size_t>(B * H * Maps * N)), pair_tile(bf16_inputs ? pair_kernel : nullptr) {}

  std::size_t dq_size() const { return static_cast<std::size_t>(r * Maps * n_pad * d); }
  // c_m, the weight of map m in head h's output: 1, -λ_h.
  A coefficient(index_t h, index_t m) const { return m == 0 ? A(1) : -lambdas(h); }
  A rowsum(index_t b, index_t h, index_t m, index_t i) const {
    return rowsum_do_o[static_cast<std::size_t>(((b * H + h) * Maps + m) * N + i)];
  }

  // D_m = rowsum(dO ⊙ O_m) for every row, with O_1 = O + λ_h O_2; returns
  // each head's dλ_h = -Σ D_2 over its rows.
  std::vector<A> output_rowsums(int threads) {
    std::vector<A> dlambda_heads(static_cast<std::size_t>(H), A(0));
#pragma omp parallel num_threads(threads)
    {
      std::vector<A> scratch_do, scratch_o, scratch_o2, partial(static_cast<std::size_t>(H), A(0));
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
          first += lambdas(h) * d2;
          rowsum_do_o[static_cast<std::size_t>(((b * H + h) * Maps + 1) * N + i)] = d2;
          partial[static_cast<std::size_t>(h)] -= d2;
        }
      }
#pragma omp critical(difftx_attention_dlambda)
      for (std::size_t h = 0; h < partial.size(); ++h) dlambda_heads[h] += partial[h];
    }
    return dlambda_heads;
  }

  // packed sized for one pair (pack_key_block and pack_query_block write every element).
  void reset(packed_pair<A>& packed) const {
    packed.keys.reset(M, Maps, d, dv_size, true);
    packed.q.resize(static_cast<std::size_t>(r * Maps * n_pad * d));  // scaled by 1/sqrt(d)
    packed.d_o.resize(static_cast<std::size_t>(r * n_pad * dv_size));
    if (pair_tile) packed.pairs.reset(N, M, Maps, r, d, dv_size);
  }

  // Block kb of the pair's keys and values into packed (zero past M).
  void pack_key_block(index_t pair, index_t kb, packed_pair<A>& packed, std::vector<A>& scratch) const {
    simd_detail::pack_key_block<Maps, T>(k, v, pair / G, pair % G, kb, packed.keys, scratch);
    if constexpr (bf16_inputs)
      if (pair_tile) packed.pairs.pack_key_block(packed.keys, kb);
  }

  // Block qb of the pair's queries (scaled) and output gradients into packed (zero past N).
  void pack_query_block(index_t pair, index_t qb, packed_pair<A>& packed) const {
    const index_t b = pair / G, j = pair % G, t0 = qb * Bs, rows = std::min(Bs, N - t0);
    for (index_t hl = 0; hl < r; ++hl) {
      const index_t h = j * r + hl;
      for (index_t m = 0; m < Maps; ++m)
        scale_in_place(pack_block_rows(q.data() + (((b * N + t0) * H + h) * Maps + m) * d, H * Maps * d, rows, d,
                                       packed.q.data() + ((hl * Maps + m) * n_pad + t0) * d),
                       rows * d, scale);
      pack_block_rows(d_o.data() + ((b * N + t0) * H + h) * dv_size, H * dv_size, rows, dv_size,
                      packed.d_o.data() + (hl * n_pad + t0) * dv_size);
    }
    if constexpr (bf16_inputs)
      if (pair_tile) packed.pairs.pack_query_block(q, d_o, b, j, qb);
  }

  // S_m of query block i0 of head hl against key block kb, scaled by
  // 1/sqrt(d), into s [Bs][Bs].
  void scores(const packed_pair<A>& packed, index_t hl, index_t m, index_t i0, index_t kb, A* s) const {
    if constexpr (bf16_inputs)
      if (pair_tile) {
        packed.pairs.scores(pair_tile, hl, m, i0, kb, scale, s);
        return;
      }
    score_tile(packed.q.data() + ((hl * Maps + m) * n_pad + i0) * d, packed.keys, kb, m, d, s);
  }

  // dP = dO·Vᵀ of the same tiles into tiles.dp.
  void output_gradient_products(const packed_pair<A>& packed, index_t hl, index_t i0, index_t kb,
                                backward_tiles<A>& tiles) const {
    if constexpr (bf16_inputs)
      if (pair_tile) {
        packed.pairs.output_gradient_products(pair_tile, hl, i0, kb, tiles.dp.data());
        return;
      }
    tile_product<a_layout::rows>(Bs, Bs, dv_size, packed.d_o.data() + (hl * n_pad + i0) * dv_size, dv_size,
                                 packed.keys.vt_tile(kb, dv_size), Bs, tiles.dp.data(), Bs, false);
  }

  // P_m = exp(S_m - lse_m) [Bs][Bs] per map, masked, for query block i0 of
  // head h (hl within the group) against key block kb; returns the weight
  // of dV, Σ_m c_m P_m (one map: its probabilities).
  const A* recompute_probabilities(const packed_pair<A>& packed, index_t b, index_t h, index_t hl, index_t i0, index_t kb,
                         backward_tiles<A>& tiles) const {
    A* p_maps = tiles.probabilities.data();
    for (index_t m = 0; m < Maps; ++m) {
      A* pm = p_maps + m * Bs * Bs;
      scores(packed, hl, m, i0, kb, pm);
      for (index_t i = 0; i < Bs; ++i) {
        const index_t visible = window.visible(i0 + i, kb * Bs);
        const A row_lse = visible > 0 ? lse(b, h, m, i0 + i) : A(0);
        exponentiate(pm + i * Bs, visible, row_lse);
      }
    }
    if constexpr (Maps == 2) {
      add_scaled_tile(p_maps, coefficient(h, 1), p_maps + Bs * Bs, tiles.weight.data());
      return tiles.weight.data();
    }
    return p_maps;
  }

  // dS_m = c_m P_m ⊙ (dP - D_m) [Bs][Bs], with respect to the scaled scores,
  // into tiles.ds.
  void score_gradients(index_t b, index_t h, index_t m, index_t i0, backward_tiles<A>& tiles) const {
    const A *pm = tiles.probabilities.data() + m * Bs * Bs, *dp = tiles.dp.data();
    const A c = coefficient(h, m);
    A* ds = tiles.ds.data();
    for (index_t i = 0; i < Bs; ++i) {
      const A row_sum = i0 + i < N ? rowsum(b, h, m, i0 + i) : A(0);
      for (index_t t = 0; t < Bs; ++t) ds[i * Bs + t] = c * pm[i * Bs + t] * (dp[i * Bs + t] - row_sum);
    }
  }

  // Query block i0 of head h (hl within the group) against key block kb:
  // adds into dV's and dK's tiles and into dQ's accumulator dq_acc.
  void query_block(const packed_pair<A>& packed, index_t b, index_t h, index_t hl, index_t i0, index_t kb, A* dq_acc,
                   backward_tiles<A>& tiles) const {
    const index_t t0 = kb * Bs;
    const A* do_tile = packed.d_o.data() + (hl * n_pad + i0) * dv_size;
    for (index_t m = 0; m < Maps; ++m) prefetch_tile(dq_acc + ((hl * Maps + m) * n_pad + i0) * d, Bs * d);
    const A* weight = recompute_probabilities(packed, b, h, hl, i0, kb, tiles);
    // dV += weightᵀ dO;  dP = dO Vᵀ
    tile_product<a_layout::transposed>(Bs, dv_size, Bs, weight, Bs, do_tile, dv_size, tiles.dv.data(), dv_size, true);
    output_gradient_products(packed, hl, i0, kb, tiles);
    for (index_t m = 0; m < Maps; ++m) {
      score_gradients(b, h, m, i0, tiles);
      // dQ_m += dS_m K_m (scaled by 1/sqrt(d) when stored); dK_m += dS_mᵀ (Q_m / sqrt(d))
      tile_product<a_layout::rows>(Bs, d, Bs, tiles.ds.data(), Bs,
                                   packed.keys.k.data() + (m * packed.keys.n_pad + t0) * d, d,
                                   dq_acc + ((hl * Maps + m) * n_pad + i0) * d, d, true);
      tile_product<a_layout::transposed>(Bs, d, Bs, tiles.ds.data(), Bs,
                                         packed.q.data() + ((hl * Maps + m) * n_pad + i0) * d, d,
                                         tiles.dk.data() + m * Bs * d, d, true);
    }
  }

  // Key block kb of the pair: every query block of every head of the group
  // that sees it, then its rows of dK and dV stored.
  void key_block(index_t pair, const packed_pair<A>& packed, index_t kb, A* dq_acc, backward_tiles<A>& tiles) const {
    const index_t b = pair / G, j = pair % G, t0 = kb * Bs;
    std::fill(tiles.dk.begin(), tiles.dk.end(), A(0));
    std::fill(tiles.dv.begin(), tiles.dv.end(), A(0));
    for (index_t hl = 0; hl < r; ++hl)
      for (index_t qb = window.first_query_block(t0); qb < blocks; ++qb)
        query_block(packed, b, j * r + hl, hl, qb * Bs, kb, dq_acc, tiles);
    for (index_t t = t0; t < std::min(M, t0 + Bs); ++t) {
      for (index_t m = 0; m < Maps; ++m)
        from_accum(tiles.dk.data() + (m * Bs + t - t0) * d, d, dk.data() + (((b * M + t) * G + j) * Maps + m) * d);
      from_accum(tiles.dv.data() + (t - t0) * dv_size, dv_size, dv.data() + ((b * M + t) * G + j) * dv_size);
    }
  }

  // dQ of row i of the pair: the sum of the accumulators, / sqrt(d).
  void store_dq(index_t pair, index_t i, const std::vector<const A*>& accumulators, std::vector<A>& row) const {
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
  }

  // Pairs enough to keep every thread busy (pairs cost the same): a thread
  // takes a whole pair, so its dQ accumulator is the only one and nothing is
  // reduced. (3 pairs on 2 threads would leave a third of the time idle.)
  void whole_pairs_per_thread(int threads) const {
#pragma omp parallel num_threads(threads)
    {
      packed_pair<A> packed;
      backward_tiles<A> tiles(Maps, d, dv_size);
      aligned_vector<A> dq_acc;
      std::vector<A> scratch;
#pragma omp for schedule(dynamic, 1)
      for (index_t pair = 0; pair < pairs; ++pair) {
        reset(packed);
        for (index_t kb = 0; kb < key_blocks; ++kb) pack_key_block(pair, kb, packed, scratch);
        for (index_t qb = 0; qb < blocks; ++qb) pack_query_block(pair, qb, packed);
        dq_acc.assign(dq_size(), A(0));
        for (index_t kb = 0; kb < key_blocks; ++kb) key_block(pair, packed, kb, dq_acc.data(), tiles);
        const std::vector<const A*> accumulators{dq_acc.data()};
        for (index_t i = 0; i < N; ++i) store_dq(pair, i, accumulators, scratch);
      }
    }
  }

  // Fewer pairs: the threads share each pair's key blocks, each with its own
  // dQ accumulator, summed at the end.
  void key_blocks_shared(int threads) const {
    packed_pair<A> packed;
    std::vector<aligned_vector<A>> dq_partial(static_cast<std::size_t>(threads));
    for (index_t pair = 0; pair < pairs; ++pair) {
      reset(packed);
      for (auto& partial : dq_partial) partial.clear();  // a thread absent from the team adds nothing
#pragma omp parallel num_threads(threads)
      {
        std::vector<A> scratch;
#pragma omp for schedule(static) nowait
        for (index_t kb = 0; kb < key_blocks; ++kb) pack_key_block(pair, kb, packed, scratch);
#pragma omp for schedule(static)
        for (index_t qb = 0; qb < blocks; ++qb) pack_query_block(pair, qb, packed);
#if defined(_OPENMP)
        auto& dq_acc = dq_partial[static_cast<std::size_t>(omp_get_thread_num())];
#else
        auto& dq_acc = dq_partial[0];
#endif
        dq_acc.assign(dq_size(), A(0));
        backward_tiles<A> tiles(Maps, d, dv_size);
#pragma omp for schedule(dynamic, 1)
        for (index_t kb = 0; kb < key_blocks; ++kb) key_block(pair, packed, kb, dq_acc.data(), tiles);  // block 0 is the largest
        std::vector<const A*> accumulators;
        for (const auto& partial : dq_partial)
          if (!partial.empty()) accumulators.push_back(partial.data());
#pragma omp for schedule(static)
        for (index_t i = 0; i < N; ++i) store_dq(pair, i, accumulators, scratch);
      }
    }
  }
};

// do [B,N,H,dv] -> dq [B,N,H,Maps,d], dk [B,M,G,Maps,d], dv [B,M,G,dv] and,
// for Maps = 2, dlambda like lambda (all assigned). T = bfloat16: S_m and dP
// on pair_kernel's bfloat16 tiles where set (bf16_score_tile; the tests pass
// models), else float.
template <int Maps, class T>
void fused_attention_backward(const policy::simd& p, cview<T, 5> q, cview<T, 5> k, cview<T, 4> v,
                              cview<accum_t<T>, 1> lambda, bool causal, cview<T, 4> o, cview<T, 4> o2,
                              cview<accum_t<T>, 4> lse, cview<T, 4> d_o, TensorView<T, 5> dq, TensorView<T, 5> dk,
                              TensorView<T, 4> dv, TensorView<accum_t<T>, 1> dlambda, bf16_score_tile_fn pair_kernel) {
  const int threads = thread_count(p);
  attention_backward_pass<Maps, T> pass(q, k, v, lambda, causal, o, o2, lse, d_o, dq, dk, dv, pair_kernel);
  const auto dlambda_heads = pass.output_rowsums(threads);
  if (pass.pairs % threads == 0 || pass.pairs >= 4 * threads)
    pass.whole_pairs_per_thread(threads);
  else
    pass.key_blocks_shared(threads);
  if constexpr (Maps == 2) detail::store_head_sums(dlambda_heads, dlambda);
}

}  // namespace difftx::simd_detail
