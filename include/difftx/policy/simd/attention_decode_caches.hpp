// How the decode kernel (attention_decode.hpp) computes one block's scores
// and P·V from each cache storage, for the schedule of
// attention_decode_blocks.hpp:
//   float_cache_blocks  k and v in T (float, double, float16, bfloat16)
//   int8_cache_blocks   int8 keys and values with a step per vector
//                       (modules/kv_cache.hpp)
// For up to gemv_rows query rows per group both read the cache in place with
// the kernels of attention_decode_kernels.hpp; for more, Eigen's products on
// the block converted (or dequantized) once per group.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "difftx/core/x86_intrinsics.hpp"  // before Eigen
#include <Eigen/Core>

#include "difftx/ops/int8.hpp"
#include "difftx/policy/simd/attention_decode_blocks.hpp"
#include "difftx/policy/simd/attention_decode_kernels.hpp"
#include "difftx/policy/simd/common.hpp"
#include "difftx/policy/simd/linear.hpp"

namespace difftx::simd_detail {

// Group j's P·V for every map, acc[m][rows][dv] = P_m · V's `keys` rows (the
// probabilities in scores). For a few query rows V (T or int8, row t at
// v_first + t·stride) is read in place, once for every two query rows and all
// their maps; for more, block (V's rows as A, converted once per group)
// multiplies each map's probabilities in Eigen.
template <int Maps, class A, class T>
void weighted_sums_per_row(const block_scores<A>& scores, index_t j, const T* v_first, index_t stride, index_t keys,
                           index_t dv, const std::array<A*, Maps>& acc) {
  auto rows_from = [&]<index_t R>(std::integral_constant<index_t, R>, index_t first_row) {
    std::array<const A*, R * Maps> p;
    std::array<A*, R * Maps> out;
    for (index_t h = 0; h < R; ++h)
      for (std::size_t m = 0; m < Maps; ++m) {
        p[static_cast<std::size_t>(h) * Maps + m] = scores.template row<Maps>(j, static_cast<index_t>(m), first_row + h);
        out[static_cast<std::size_t>(h) * Maps + m] = acc[m] + (first_row + h) * dv;
      }
    weighted_sums_of_rows<R * Maps>(p, v_first, stride, keys, dv, out);
  };
  index_t row = 0;
  for (; row + 2 <= scores.rows; row += 2) rows_from(std::integral_constant<index_t, 2>{}, row);
  if (row < scores.rows) rows_from(std::integral_constant<index_t, 1>{}, row);
}
template <int Maps, class A, class Block>
void block_products(const block_scores<A>& scores, index_t j, index_t keys, const Block& block, index_t dv,
                    const std::array<A*, Maps>& acc) {
  for (std::size_t m = 0; m < Maps; ++m)
    Eigen::Map<row_matrix<A>>(acc[m], scores.rows, dv).noalias() =
        scores.template matrix<Maps>(j, static_cast<index_t>(m), keys) * block;
}

// rows x cols values, row t at first + t·stride, as A: in place when T is A
// (the stride stays), else converted into scratch (the stride becomes cols).
template <class T>
const accum_t<T>* rows_as_accum(const T* first, index_t rows, index_t cols, index_t stride,
                                std::vector<accum_t<T>>& scratch) {
  if constexpr (std::is_same_v<T, accum_t<T>>) {
    return first;
  } else {
    scratch.resize(static_cast<std::size_t>(rows * cols));
    for (index_t t = 0; t < rows; ++t) to_accum(first + t * stride, cols, scratch.data() + t * cols);
    return scratch.data();
  }
}

// The query rows of group j for map m, scaled, into out (rows of d): row
// i·r + hh is token i's head j·r + hh (q [B, T, H, Maps, d]).
template <class T>
void query_rows(cview<T, 5> q, index_t b, index_t j, index_t m, index_t r, accum_t<T> scale, accum_t<T>* out) {
  const index_t T_new = q.extent(1), H = q.extent(2), maps = q.extent(3), d = q.extent(4);
  for (index_t i = 0; i < T_new; ++i)
    for (index_t hh = 0; hh < r; ++hh) {
      const T* row = q.data() + (((b * T_new + i) * H + j * r + hh) * maps + m) * d;
      for (index_t c = 0; c < d; ++c) out[(i * r + hh) * d + c] = static_cast<accum_t<T>>(load(row[c])) * scale;
    }
}
// Every group's and map's query rows in block_scores' order, for dots_per_position.
template <int Maps, class T, class E>
void all_query_rows(cview<T, 5> q, index_t b, index_t G, index_t r, accum_t<T> scale, row_matrix<accum_t<T>>& out) {
  using A = accum_t<T>;
  const index_t rows = q.extent(1) * r, d = q.extent(4);
  out.resize(G * Maps * rows, d);
  for (index_t j = 0; j < G; ++j)
    for (index_t m = 0; m < Maps; ++m) query_rows<T>(q, b, j, m, r, scale, out.row((j * Maps + m) * rows).data());
  if constexpr (reads_pairs<A, E>)
    for (index_t i = 0; i < out.rows(); ++i) to_pair_order<A, E>(out.row(i).data(), d);
}

// rows x cols int8 values (row t at first + t·stride) times their steps (row
// t's at steps[t·step_stride]), as A in scratch.
template <class A>
const A* dequantized_rows(const std::int8_t* first, const A* steps, index_t step_stride, index_t rows, index_t cols,
                          index_t stride, std::vector<A>& scratch) {
  scratch.resize(static_cast<std::size_t>(rows * cols));
  for (index_t t = 0; t < rows; ++t)
    for (index_t c = 0; c < cols; ++c)
      scratch[static_cast<std::size_t>(t * cols + c)] = steps[t * step_stride] * A(first[t * stride + c]);
  return scratch.data();
}

// A thread's scratch for either cache: query rows, and a block's keys and
// values as A (for Eigen's products).
template <class A>
struct decode_workspace {
  row_matrix<A> q_rows;
  std::vector<A> k_scratch, v_scratch;
};
template <class A>
using strided_rows = Eigen::Map<const row_matrix<A>, 0, Eigen::OuterStride<>>;

// The query side of a decode call, which both caches share: q [B,T,H,Maps,d]
// against a cache of G groups, values dv wide.
template <int Maps, class T>
struct decode_queries {
  using accum = accum_t<T>;
  cview<T, 5> q;
  index_t G, r, new_tokens, d, dv, rows;  // rows: a group's query rows, (token i, head j·r + hh) -> i·r + hh
  accum scale;
  decode_queries(cview<T, 5> queries, index_t groups, index_t dv_size)
      : q(queries), G(groups), r(q.extent(2) / groups), new_tokens(q.extent(1)), d(q.extent(4)), dv(dv_size),
        rows(new_tokens * r), scale(accum(1) / std::sqrt(static_cast<accum>(d))) {}

  bool few_rows() const { return rows <= gemv_rows; }
  // Few rows: every group's and map's query rows against the block's keys in
  // place (E: T or int8; key t0's row at k_first, every group and map).
  // v_first: the block's first row of values (F: T or int8, every group),
  // which the dots ask for into L2 as they go (dots_per_position).
  template <class E, class F>
  void dots_in_place(decode_workspace<accum>& ws, const decode_block& blk, const block_scores<accum>& s,
                     const E* k_first, const F* v_first) const {
    all_query_rows<Maps, T, E>(q, blk.b, G, r, scale, ws.q_rows);
    dots_per_position(ws.q_rows.data(), G * Maps * rows, rows, d, k_first, G * Maps * d, blk.keys, s.s, s.s_stride,
                      reinterpret_cast<const std::byte*>(v_first), G * dv * index_t{sizeof(F)});
  }
  // More rows: per group j and map m, Eigen's product of its query rows with
  // key_rows(j, m), the block's keys as A (a strided_rows).
  template <class KeyRows>
  void products(decode_workspace<accum>& ws, const decode_block& blk, const block_scores<accum>& s,
                KeyRows&& key_rows) const {
    ws.q_rows.resize(rows, d);
    for (index_t j = 0; j < G; ++j)
      for (index_t m = 0; m < Maps; ++m) {
        query_rows<T>(q, blk.b, j, m, r, scale, ws.q_rows.data());
        s.template matrix<Maps>(j, m, blk.keys).noalias() = ws.q_rows * key_rows(j, m).transpose();
      }
  }
};

// A cache in T: k [B,S,G,Maps,d], v [B,S,G,dv]. For more than gemv_rows rows
// the block is used in place for float and double and converted once per
// group for float16 and bfloat16.
template <int Maps, class T>
struct float_cache_blocks {
  using accum = accum_t<T>;
  using workspace = decode_workspace<accum>;
  decode_queries<Maps, T> queries;
  cview<T, 5> k;
  cview<T, 4> v;
  static constexpr bool in_place = std::is_same_v<T, accum>;

  // Key t0's row of values: every group's.
  const T* values_first(const decode_block& blk) const {
    return v.data() + (blk.b * v.extent(1) + blk.t0) * queries.G * queries.dv;
  }
  // S of every group, map and query row against the block's keys.
  void scores(workspace& ws, const decode_block& blk, const block_scores<accum>& s) const {
    const index_t S = k.extent(1), G = queries.G, d = queries.d;
    const T* k_first = k.data() + (blk.b * S + blk.t0) * G * Maps * d;  // key t0's row: every group and map
    if (queries.few_rows()) return queries.dots_in_place(ws, blk, s, k_first, values_first(blk));
    queries.products(ws, blk, s, [&](index_t j, index_t m) {
      const accum* k_block = rows_as_accum<T>(k_first + (j * Maps + m) * d, blk.keys, d, G * Maps * d, ws.k_scratch);
      return strided_rows<accum>(k_block, blk.keys, d, Eigen::OuterStride<>(in_place ? G * Maps * d : d));
    });
  }
  // acc[m] = P_m · V of group j, the probabilities in s.
  void values(workspace& ws, const decode_block& blk, const block_scores<accum>& s, index_t j,
              const std::array<accum*, Maps>& acc) const {
    const index_t G = queries.G, dv = queries.dv;
    const T* v_first = values_first(blk) + j * dv;
    if (queries.few_rows()) return weighted_sums_per_row<Maps>(s, j, v_first, G * dv, blk.keys, dv, acc);
    const accum* v_block = rows_as_accum<T>(v_first, blk.keys, dv, G * dv, ws.v_scratch);
    block_products<Maps>(s, j, blk.keys,
                         strided_rows<accum>(v_block, blk.keys, dv, Eigen::OuterStride<>(in_place ? G * dv : dv)), dv,
                         acc);
  }
};

// An int8 cache (int8_kv): a block's scores are Q · k8 then times each key's
// step, and each value's step folds into its probability. For more than
// gemv_rows rows each group's block is dequantized once into scratch.
template <int Maps, class T>
struct int8_cache_blocks {
  using accum = accum_t<T>;
  using workspace = decode_workspace<accum>;
  decode_queries<Maps, T> queries;
  const int8_kv<accum>& kv;

  // Key t0's row of values: every group's.
  const std::int8_t* values_first(const decode_block& blk) const {
    return kv.values8.data() + (blk.b * kv.values8.extent(1) + blk.t0) * queries.G * queries.dv;
  }

  void scores(workspace& ws, const decode_block& blk, const block_scores<accum>& s) const {
    const index_t S = kv.keys8.extent(1), G = queries.G, d = queries.d;
    const std::int8_t* k_first = kv.keys8.data() + (blk.b * S + blk.t0) * G * Maps * d;
    const accum* steps = kv.key_steps.data() + (blk.b * S + blk.t0) * G * Maps;  // [keys][G][Maps]
    if (queries.few_rows()) {
      queries.dots_in_place(ws, blk, s, k_first, values_first(blk));
      for (index_t j = 0; j < G; ++j)
        for (index_t m = 0; m < Maps; ++m)
          for (index_t row = 0; row < queries.rows; ++row) {
            accum* out = s.template row<Maps>(j, m, row);
            for (index_t t = 0; t < blk.keys; ++t) out[t] *= steps[t * G * Maps + j * Maps + m];
          }
      return;
    }
    queries.products(ws, blk, s, [&](index_t j, index_t m) {
      const accum* k_block = dequantized_rows(k_first + (j * Maps + m) * d, steps + j * Maps + m, G * Maps, blk.keys, d,
                                              G * Maps * d, ws.k_scratch);
      return strided_rows<accum>(k_block, blk.keys, d, Eigen::OuterStride<>(d));
    });
  }
  void values(workspace& ws, const decode_block& blk, const block_scores<accum>& s, index_t j,
              const std::array<accum*, Maps>& acc) const {
    const index_t S = kv.values8.extent(1), G = queries.G, dv = queries.dv;
    const std::int8_t* v_first = values_first(blk) + j * dv;
    const accum* steps = kv.value_steps.data() + (blk.b * S + blk.t0) * G + j;
    if (queries.few_rows()) {
      for (index_t m = 0; m < Maps; ++m)  // p_t · step_t: the probabilities are not needed after this
        for (index_t row = 0; row < queries.rows; ++row) {
          accum* p_row = s.template row<Maps>(j, m, row);
          for (index_t t = 0; t < blk.keys; ++t) p_row[t] *= steps[t * G];
        }
      return weighted_sums_per_row<Maps>(s, j, v_first, G * dv, blk.keys, dv, acc);
    }
    const accum* v_block = dequantized_rows(v_first, steps, G, blk.keys, dv, G * dv, ws.v_scratch);
    block_products<Maps>(s, j, blk.keys, strided_rows<accum>(v_block, blk.keys, dv, Eigen::OuterStride<>(dv)), dv, acc);
  }
};

}  // namespace difftx::simd_detail
