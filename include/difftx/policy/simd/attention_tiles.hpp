// The pieces the fused attention's forward and backward (attention_forward.hpp,
// attention_low_bit_forward.hpp, attention_backward.hpp) share: the tile of
// 64 queries x 64 keys, the keys and values of one (batch row, group) packed
// as A for the tile products, the row operations of a softmax, and the
// running state of FlashAttention-2's online softmax. The decode kernel
// (attention_decode_blocks.hpp) uses the row operations too.
//
// Operands are converted into A-typed copies laid out for tile_product (keys
// and values also transposed), padded to whole blocks with zeros; masked and
// padded entries get probability 0.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "difftx/policy/simd/common.hpp"
#include "difftx/policy/simd/gemm.hpp"
#include "difftx/policy/simd/tile.hpp"

namespace difftx::simd_detail {

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
  A* kt_tile(index_t kb, index_t m, index_t d) { return kt.data() + ((kb * maps + m) * d) * attention_block; }
  const A* vt_tile(index_t kb, index_t dv) const { return vt.data() + kb * dv * attention_block; }

  // Sized for M keys; pack_key_block writes every element, so nothing is zeroed here.
  void reset(index_t M, index_t Maps, index_t d, index_t dv, bool backward) {
    n_pad = round_up(M, attention_block);
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
// so every write is sequential (written a key at a time, the transposed
// copies took a cache line per element, a visible share of the backward).
// Rows without a row-major home (the forward's keys, the
// backward's values) go through `staging`.
template <int Maps, class T>
void pack_key_block(cview<T, 5> k, cview<T, 4> v, index_t b, index_t j, index_t kb, packed_keys<accum_t<T>>& out,
                    std::vector<accum_t<T>>& staging) {
  using A = accum_t<T>;
  using rows_map = Eigen::Map<Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
  constexpr index_t Bs = attention_block;
  const index_t M = k.extent(1), G = k.extent(2), d = k.extent(4), dv = v.extent(3), t0 = kb * Bs;
  const index_t keys = std::min(Bs, M - t0);
  auto scratch = [&](index_t width) {
    staging.resize(static_cast<std::size_t>(Bs * width));
    return staging.data();
  };
  auto transposed_into = [&](A* rows, index_t width, A* tile) { rows_map(tile, width, Bs) = rows_map(rows, Bs, width).transpose(); };
  for (index_t m = 0; m < Maps; ++m) {
    A* rows = pack_block_rows(k.data() + (((b * M + t0) * G + j) * Maps + m) * d, G * Maps * d, keys, d,
                              out.for_backward ? out.k.data() + (m * out.n_pad + t0) * d : scratch(d));
    transposed_into(rows, d, out.kt.data() + (kb * Maps + m) * d * Bs);
  }
  const T* first_value = v.data() + ((b * M + t0) * G + j) * dv;
  if (out.for_backward)
    transposed_into(pack_block_rows(first_value, G * dv, keys, dv, scratch(dv)), dv, out.vt.data() + kb * dv * Bs);
  else
    pack_block_rows(first_value, G * dv, keys, dv, out.v.data() + t0 * dv);
}

// S_m for key block kb into s [Bs][Bs]: q_tile [Bs][d] (map m's queries,
// scaled by 1/sqrt(d)) times the packed keys' transposed tile.
template <class A>
void score_tile(const A* q_tile, const packed_keys<A>& keys, index_t kb, index_t m, index_t d, A* s) {
  constexpr index_t Bs = attention_block;
  tile_product<a_layout::rows>(Bs, Bs, d, q_tile, d, keys.kt_tile(kb, m, d), Bs, s, Bs, false);
}

// Which keys the queries of a call see: N queries over M keys; causal, query
// i sees the keys t < i + 1 + M - N (the queries are the last N positions).
struct key_window {
  index_t N, M;
  bool causal;
  // The keys row i sees: t < end(i).
  index_t end(index_t i) const { return causal ? i + 1 + M - N : M; }
  // How many keys of the key block from t0 row i sees: 0 for padded rows (i >= N).
  index_t visible(index_t i, index_t t0) const {
    if (i >= N) return 0;
    return std::clamp<index_t>(end(i) - t0, 0, attention_block);
  }
  // The first query block with a row that sees key t0 (causal: row t0 - (M - N) is the first).
  index_t first_query_block(index_t t0) const { return causal ? std::max<index_t>(t0 - (M - N), 0) / attention_block : 0; }
  // Key blocks the query block from i0 (rows of it) reaches.
  index_t key_blocks(index_t i0, index_t rows) const { return round_up(end(i0 + rows - 1), attention_block) / attention_block; }
};

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

// p[t] = exp(p[t] - shift) for t < n, in place.
template <class A>
void exponentiate_row(A* p, index_t n, A shift) {
  using V = vec<A>;
  constexpr index_t W = V::size;
  index_t t = 0;
  for (; t + W <= n; t += W) exponential(V::load_unaligned(p + t) - V(shift)).store_unaligned(p + t);
  for (; t < n; ++t) p[t] = std::exp(p[t] - shift);
}
// The same for a tile row: then 0 for t in [n, attention_block).
template <class A>
void exponentiate(A* s, index_t n, A shift) {
  exponentiate_row(s, n, shift);
  std::fill(s + n, s + attention_block, A(0));
}

// FlashAttention-2's online softmax over the key blocks of one tile of query
// rows, for each map m: per (map, row) the largest score so far, the sum of
// the exponentials relative to it, and the unnormalised P·V, rescaled only
// when a row's largest score grows.
template <class A>
struct online_softmax {
  index_t dv;
  aligned_vector<A> acc;                 // [Maps][Bs][dv]
  aligned_vector<A> running_max, running_sum;  // [Maps][Bs]

  online_softmax(index_t maps, index_t dv_size)
      : dv(dv_size),
        acc(static_cast<std::size_t>(maps * attention_block * dv_size)),
        running_max(static_cast<std::size_t>(maps * attention_block)),
        running_sum(static_cast<std::size_t>(maps * attention_block)) {}

  // Before a tile's first key block: nothing seen.
  void start() {
    std::fill(acc.begin(), acc.end(), A(0));
    std::fill(running_max.begin(), running_max.end(), -std::numeric_limits<A>::infinity());
    std::fill(running_sum.begin(), running_sum.end(), A(0));
  }

  // Map m's score tile s [Bs][Bs] of one key block (visible(i): the keys row i
  // sees) into probabilities relative to each row's new maximum, rows from
  // `rows` on zeroed; then their product with the block's values v_block
  // [Bs][dv] added into map m's accumulator.
  template <class Visible>
  void add_block(index_t m, A* s, index_t rows, Visible&& visible, const A* v_block) {
    constexpr index_t Bs = attention_block;
    A* acc_m = acc.data() + m * Bs * dv;
    for (index_t i = 0; i < rows; ++i) {
      A* s_row = s + i * Bs;
      const index_t seen = visible(i);
      const auto mi = static_cast<std::size_t>(m * Bs + i);
      const A new_max = std::max(running_max[mi], row_max(s_row, seen));
      exponentiate(s_row, seen, new_max);
      if (new_max > running_max[mi]) {  // else the old terms keep their scale
        const A rescale = std::exp(running_max[mi] - new_max);  // 0 on the first block
        running_sum[mi] *= rescale;
        scale_in_place(acc_m + i * dv, dv, rescale);
        running_max[mi] = new_max;
      }
      running_sum[mi] += sum(s_row, seen);
    }
    std::fill(s + rows * Bs, s + Bs * Bs, A(0));
    tile_product<a_layout::rows>(Bs, dv, Bs, s, Bs, v_block, dv, acc_m, dv, true);
  }

  // After the last key block: row i's log-sum-exp for map m, and its row of
  // the accumulator normalised in place (the map's output O_m).
  A finish_row(index_t m, index_t i) {
    const auto mi = static_cast<std::size_t>(m * attention_block + i);
    scale_in_place(output_row(m, i), dv, A(1) / running_sum[mi]);
    return running_max[mi] + std::log(running_sum[mi]);
  }
  A* output_row(index_t m, index_t i) { return acc.data() + (m * attention_block + i) * dv; }
};

}  // namespace difftx::simd_detail
