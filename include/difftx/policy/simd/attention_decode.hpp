// Attention of a few new tokens over a key/value cache on the CPU (formulas in
// difftx/ops/attention_decode.hpp), split over keys as flash-decoding does.
//
// Decoding is bound by memory: each step reads the whole cache once and does
// little arithmetic per byte, and there are too few query rows (T new tokens x
// H / G heads per group) to spread over threads. So the work is split over
// (sequence, group, block of cache_block keys): every block's keys and values
// are read once for all the query rows of its group (scores S = Q K^T and
// P V: for a few rows, loops over the cache in place that convert float16 and
// bfloat16 in registers; for more, Eigen products), and each block leaves
// per row and map its maximum, sum of exponentials and unnormalised P V. A
// second pass combines the blocks of a row by log-sum-exp:
//   M = max_s m_s,  L = sum_s l_s e^(m_s - M),  O_m = sum_s acc_s e^(m_s - M) / L.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <span>
#include <vector>

#include <Eigen/Core>

#include "difftx/ops/attention_decode.hpp"
#include "difftx/ops/int8.hpp"
#include "difftx/ops/logit_quantization.hpp"
#include "difftx/policy/simd/attention.hpp"
#include "difftx/policy/simd/common.hpp"
#include "difftx/policy/simd/linear.hpp"

namespace difftx {

namespace simd_detail {

constexpr index_t cache_block = 256;  // keys per work item: a few items per thread at 1k-token caches
// Up to this many query rows per group, the block is read once per row, in its
// storage type, by dots_with_rows (scores) and weighted_sums_of_rows (P·V): a
// matrix product would pack the whole key (value) block for each call, which
// costs more than reading the block, from L2, once per row (and for
// float16/bfloat16 a converted copy of the block costs more than the reading).
constexpr index_t gemv_rows = 4;

// out[m][c] = Σ_t p[m][t] · V(t, c) for c < dv and each of the Maps maps, V's
// row t at v_first + t·stride (T, or int8): the rows stream past once for
// every map (a differential head's two maps share V), four vectors of each
// map's out held in registers.
template <int Maps, class A, class T>
void weighted_sums_of_rows(const std::array<const A*, Maps>& p, const T* v_first, index_t stride, index_t keys,
                           index_t dv, const std::array<A*, Maps>& out) {
  using V = vec<A>;
  constexpr index_t W = V::size;
  auto columns = [&](auto vectors, index_t c0) {
    constexpr index_t NV = decltype(vectors)::value;
    V acc[Maps][NV];
    for (auto& map_acc : acc)
      for (auto& a : map_acc) a = V(A(0));
    for (index_t t = 0; t < keys; ++t) {
      V row[NV];
      for (index_t v = 0; v < NV; ++v) row[v] = load_row_as<A>(v_first + t * stride + c0 + v * W);
      for (index_t m = 0; m < Maps; ++m) {
        const V pv(p[m][t]);
        for (index_t v = 0; v < NV; ++v) acc[m][v] = xsimd::fma(pv, row[v], acc[m][v]);
      }
    }
    for (index_t m = 0; m < Maps; ++m)
      for (index_t v = 0; v < NV; ++v) acc[m][v].store_unaligned(out[m] + c0 + v * W);
  };
  index_t c0 = 0;
  for (; c0 + 4 * W <= dv; c0 += 4 * W) columns(std::integral_constant<index_t, 4>{}, c0);
  for (; c0 + W <= dv; c0 += W) columns(std::integral_constant<index_t, 1>{}, c0);
  for (; c0 < dv; ++c0)
    for (index_t m = 0; m < Maps; ++m) {
      A x(0);
      for (index_t t = 0; t < keys; ++t) x += p[m][t] * static_cast<A>(v_first[t * stride + c0]);
      out[m][c0] = x;
    }
}

// What one key block leaves for each of its query rows and maps.
template <class A>
struct decode_partials {
  index_t rows = 0, dv = 0;  // rows per item: T·r query rows, each with Maps maps
  std::vector<A> max, sum;   // [items][Maps][rows]
  std::vector<A> acc;        // [items][Maps][rows][dv]
  A* max_at(index_t item, index_t m) { return max.data() + (item * 2 + m) * rows; }
  A* sum_at(index_t item, index_t m) { return sum.data() + (item * 2 + m) * rows; }
  A* acc_at(index_t item, index_t m) { return acc.data() + ((item * 2 + m) * rows) * dv; }
};

// A block's P·V for every map, acc[m][rows][dv] = s[m] · V's `keys` rows,
// s[m] the probabilities (rows of cache_block). For a few query rows V (T or
// int8, row t at v_first + t·stride) is read in place, once per row for all
// maps; for more, block (V's rows as A, converted once per item) multiplies
// each map's probabilities in Eigen.
template <int Maps, class A, class T>
void weighted_sums_per_row(const std::array<row_matrix<A>, Maps>& s, index_t rows, const T* v_first, index_t stride,
                           index_t keys, index_t dv, const std::array<A*, Maps>& acc) {
  for (index_t row = 0; row < rows; ++row) {
    std::array<const A*, Maps> p;
    std::array<A*, Maps> out;
    for (std::size_t m = 0; m < Maps; ++m) {
      p[m] = s[m].data() + row * cache_block;
      out[m] = acc[m] + row * dv;
    }
    weighted_sums_of_rows<Maps>(p, v_first, stride, keys, dv, out);
  }
}
template <int Maps, class A, class Block>
void block_products(const std::array<row_matrix<A>, Maps>& s, index_t keys, const Block& block, index_t rows,
                    index_t dv, const std::array<A*, Maps>& acc) {
  for (std::size_t m = 0; m < Maps; ++m)
    Eigen::Map<row_matrix<A>>(acc[m], rows, dv).noalias() = s[m].leftCols(keys) * block;
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

// One work item of decoding: sequence b, key/value group j, the cache's keys
// [t0, t0 + keys) of a sequence holding `length` keys.
struct decode_item {
  index_t b, j, t0, keys, length;
};

// The query rows of item it's group for map m, scaled: row i·r + hh is token
// i's head j·r + hh (q [B, T, H, Maps, d]).
template <class T>
void query_rows(cview<T, 5> q, const decode_item& it, index_t m, index_t r, accum_t<T> scale, row_matrix<accum_t<T>>& out) {
  const index_t T_new = q.extent(1), H = q.extent(2), maps = q.extent(3), d = q.extent(4);
  out.resize(T_new * r, d);
  for (index_t i = 0; i < T_new; ++i)
    for (index_t hh = 0; hh < r; ++hh) {
      const T* row = q.data() + (((it.b * T_new + i) * H + it.j * r + hh) * maps + m) * d;
      for (index_t c = 0; c < d; ++c) out(i * r + hh, c) = static_cast<accum_t<T>>(load(row[c])) * scale;
    }
}

// The decoding schedule every cache storage shares: the work items (b, j,
// block of cache_block keys up to each sequence's length) over the threads,
// each leaving per query row and map its maximum, sum and unnormalised P·V,
// then the blocks of each row combined by log-sum-exp into out. What differs
// between storages is how a block's scores and P·V are computed:
//   Workspace                 a thread's scratch (default-constructed)
//   scores(ws, item, m, s)    s(row, t) = S_m of query row `row` (token row / r,
//                             head j·r + row % r) and key t0 + t, t < keys
//   values(ws, item, s, acc)  acc[m][rows][dv] = P_m · V of the block for
//                             every map m at once (s[m], the probabilities,
//                             may be overwritten)
//   store(b, i, h, out)       out[dv] (A), the result of token i, head h
// logit_bits != 16 quantizes each row's logits over all its blocks: a first
// sweep takes every row's largest |logit|.
template <int Maps, class A, class Workspace, class Scores, class Values, class Store>
void decode_in_blocks(const policy::simd& p, index_t G, index_t new_tokens, index_t r, index_t dv,
                      std::span<const index_t> lengths, A lam, int logit_bits, Scores&& scores, Values&& values,
                      Store&& store) {
  const index_t B = static_cast<index_t>(lengths.size()), rows = new_tokens * r;
  const A neg_inf = -std::numeric_limits<A>::infinity();
  std::vector<index_t> first_item(static_cast<std::size_t>(B) + 1, 0);
  for (index_t b = 0; b < B; ++b)
    first_item[static_cast<std::size_t>(b) + 1] =
        first_item[static_cast<std::size_t>(b)] + G * ((lengths[static_cast<std::size_t>(b)] + cache_block - 1) / cache_block);
  const index_t items = first_item.back();
  auto blocks_of = [&](index_t b) {
    return (first_item[static_cast<std::size_t>(b) + 1] - first_item[static_cast<std::size_t>(b)]) / G;
  };
  auto locate = [&](index_t item) {
    const index_t b = static_cast<index_t>(std::upper_bound(first_item.begin(), first_item.end(), item) - first_item.begin()) - 1;
    const index_t local = item - first_item[static_cast<std::size_t>(b)], blocks_b = blocks_of(b);
    const index_t t0 = (local % blocks_b) * cache_block, length = lengths[static_cast<std::size_t>(b)];
    return decode_item{b, local / blocks_b, t0, std::min(cache_block, length - t0), length};
  };
  // Token row / r sits at position length - T + row / r and sees keys t <= it.
  auto visible = [&](const decode_item& it, index_t row) {
    return std::clamp<index_t>(it.length - new_tokens + row / r + 1 - it.t0, 0, it.keys);
  };
  decode_partials<A> part{rows, dv, std::vector<A>(static_cast<std::size_t>(items * 2 * rows)),
                          std::vector<A>(static_cast<std::size_t>(items * 2 * rows)),
                          std::vector<A>(static_cast<std::size_t>(items * 2 * rows * dv))};
  // The grid of every (b, j, map, row): inactive unless quantizing.
  std::vector<detail::logit_grid<A>> grids(logit_bits == logits_unquantized ? 0 : static_cast<std::size_t>(B * G * 2 * rows));
  auto grid_index = [&](const decode_item& it, index_t m, index_t row) {
    return static_cast<std::size_t>(((it.b * G + it.j) * 2 + m) * rows + row);
  };

  // Every item's score blocks, on the threads: visit(ws, item, it, s) once
  // scores(ws, it, m, s[m]) ran for every map m.
  auto over_blocks = [&](auto&& visit) {
#pragma omp parallel num_threads(thread_count(p))
    {
      single_threaded_eigen();
      Workspace ws;
      std::array<row_matrix<A>, Maps> s;
      for (auto& map_scores : s) map_scores.resize(rows, cache_block);
#pragma omp for schedule(dynamic, 1)
      for (index_t item = 0; item < items; ++item) {
        const decode_item it = locate(item);
        for (index_t m = 0; m < Maps; ++m) scores(ws, it, m, s[static_cast<std::size_t>(m)]);
        visit(ws, item, it, s);
      }
    }
  };

  if (!grids.empty()) {
    // Each block's largest |logit| per row (in part.max), then the grids.
    over_blocks([&](Workspace&, index_t item, const decode_item& it, std::array<row_matrix<A>, Maps>& s) {
      for (index_t m = 0; m < Maps; ++m)
        for (index_t row = 0; row < rows; ++row)
          part.max_at(item, m)[row] =
              detail::largest_magnitude(s[static_cast<std::size_t>(m)].data() + row * cache_block, visible(it, row));
    });
    std::vector<A> largest(grids.size(), A(0));  // over the blocks of every (b, j, map, row)
    for (index_t item = 0; item < items; ++item) {
      const decode_item it = locate(item);
      for (index_t m = 0; m < Maps; ++m)
        for (index_t row = 0; row < rows; ++row) {
          A& m_row = largest[grid_index(it, m, row)];
          m_row = std::max(m_row, part.max_at(item, m)[row]);
        }
    }
    for (std::size_t e = 0; e < grids.size(); ++e) grids[e] = detail::logit_grid<A>(largest[e], logit_bits);
  }

  // Per block and row: its maximum, its sum of exponentials and P·V.
  over_blocks([&](Workspace& ws, index_t item, const decode_item& it, std::array<row_matrix<A>, Maps>& s) {
    std::array<A*, Maps> acc;
    for (index_t m = 0; m < Maps; ++m) {
      A* row_max_out = part.max_at(item, m);
      A* row_sum_out = part.sum_at(item, m);
      for (index_t row = 0; row < rows; ++row) {
        const index_t seen = visible(it, row);
        A* p_row = s[static_cast<std::size_t>(m)].data() + row * cache_block;
        if (!grids.empty()) grids[grid_index(it, m, row)].apply(p_row, seen);
        const A mx = seen > 0 ? row_max(p_row, seen) : neg_inf;
        exponentiate_row(p_row, seen, mx);
        std::fill(p_row + seen, p_row + it.keys, A(0));
        row_max_out[row] = mx;
        row_sum_out[row] = sum(p_row, seen);
      }
      acc[static_cast<std::size_t>(m)] = part.acc_at(item, m);
    }
    values(ws, it, s, acc);
  });

  // Combine the key blocks of every (b, token, head) by log-sum-exp.
#pragma omp parallel num_threads(thread_count(p, items * Maps * rows * dv))
  {
    std::vector<A> out(static_cast<std::size_t>(Maps * dv));
#pragma omp for schedule(static)
    for (index_t bj = 0; bj < B * G; ++bj) {
      const index_t b = bj / G, j = bj % G, blocks_b = blocks_of(b);
      const index_t item0 = first_item[static_cast<std::size_t>(b)] + j * blocks_b;
      for (index_t row = 0; row < rows; ++row) {
        for (index_t m = 0; m < Maps; ++m) {
          A mx = neg_inf;
          for (index_t s = 0; s < blocks_b; ++s) mx = std::max(mx, part.max_at(item0 + s, m)[row]);
          A total = 0;
          A* o_m = out.data() + m * dv;
          std::fill(o_m, o_m + dv, A(0));
          for (index_t s = 0; s < blocks_b; ++s) {
            const A m_s = part.max_at(item0 + s, m)[row];
            if (m_s == neg_inf) continue;  // a block wholly after this token
            const A w = std::exp(m_s - mx);
            total += w * part.sum_at(item0 + s, m)[row];
            const A* acc = part.acc_at(item0 + s, m) + row * dv;
            for (index_t c = 0; c < dv; ++c) o_m[c] += w * acc[c];
          }
          for (index_t c = 0; c < dv; ++c) o_m[c] /= total;
        }
        if constexpr (Maps == 2)
          for (index_t c = 0; c < dv; ++c) out[static_cast<std::size_t>(c)] -= lam * out[static_cast<std::size_t>(dv + c)];
        store(b, row / r, j * r + row % r, out.data());
      }
    }
  }
}

}  // namespace simd_detail

// q [B,T,H,Maps,d], k [B,S,G,Maps,d], v [B,S,G,dv], lengths [B] (host), lambda [1] (Maps = 2) -> o [B,T,H,dv]
// logit_bits: 16, or the logits quantized to 4..8 bits (ops/logit_quantization.hpp).
template <int Maps, class T>
  requires supported_by<policy::simd, T>
void attention_decode(const policy::simd& p, cview<T, 5> q, cview<T, 5> k, cview<T, 4> v,
                      std::span<const index_t> lengths, cview<accum_t<T>, 1> lambda, TensorView<T, 4> o,
                      int logit_bits = logits_unquantized) {
  using namespace simd_detail;
  using A = accum_t<T>;
  using strided_rows = Eigen::Map<const row_matrix<A>, 0, Eigen::OuterStride<>>;
  detail::check_attention_decode<Maps>("attention_decode", memory_space::host, q, k, v, lengths, lambda, o);
  detail::check_logit_bits<A>("attention_decode", logit_bits);
  const index_t new_tokens = q.extent(1), H = q.extent(2), d = q.extent(4);
  const index_t S = k.extent(1), G = k.extent(2), r = H / G, dv = v.extent(3);
  const index_t rows = new_tokens * r;  // query rows of one group: (token i, head h = j·r + hh) -> i·r + hh
  const A scale = A(1) / std::sqrt(static_cast<A>(d));

  struct workspace {
    row_matrix<A> q_rows;
    std::vector<A> k_scratch, v_scratch;
  };
  auto scores = [&](workspace& ws, const decode_item& it, index_t m, row_matrix<A>& s) {
    query_rows<T>(q, it, m, r, scale, ws.q_rows);
    const T* k_first = k.data() + (((it.b * S + it.t0) * G + it.j) * Maps + m) * d;
    if (rows <= gemv_rows) {
      for (index_t row = 0; row < rows; ++row)
        dots_with_rows(ws.q_rows.row(row).data(), k_first, G * Maps * d, it.keys, d, s.data() + row * cache_block);
    } else {
      // K rows t0 .. t0 + keys of group j, as A (in place for float and double).
      const A* k_block = rows_as_accum<T>(k_first, it.keys, d, G * Maps * d, ws.k_scratch);
      const strided_rows key_rows(k_block, it.keys, d, Eigen::OuterStride<>(std::is_same_v<T, A> ? G * Maps * d : d));
      s.leftCols(it.keys).noalias() = ws.q_rows * key_rows.transpose();
    }
  };
  auto values = [&](workspace& ws, const decode_item& it, std::array<row_matrix<A>, Maps>& s,
                    const std::array<A*, Maps>& acc) {
    const T* v_first = v.data() + ((it.b * S + it.t0) * G + it.j) * dv;
    if (rows <= gemv_rows)
      weighted_sums_per_row<Maps>(s, rows, v_first, G * dv, it.keys, dv, acc);
    else
      block_products<Maps>(s, it.keys,
                           strided_rows(rows_as_accum<T>(v_first, it.keys, dv, G * dv, ws.v_scratch), it.keys, dv,
                                        Eigen::OuterStride<>(std::is_same_v<T, A> ? G * dv : dv)),
                           rows, dv, acc);
  };
  decode_in_blocks<Maps, A, workspace>(
      p, G, new_tokens, r, dv, lengths, Maps == 2 ? lambda(0) : A(0), logit_bits, scores, values,
      [&](index_t b, index_t i, index_t h, const A* out) {
        from_accum(out, dv, o.data() + ((b * new_tokens + i) * H + h) * dv);
      });
}

// The same over an int8 cache (modules/kv_cache.hpp): keys and values read in
// place, int8 converted in registers; a key block's scores are Q · k8 then
// times each key's step, and each value's step folds into its probability.
// With more than gemv_rows query rows, the block is dequantized once into
// scratch for Eigen's products, as the float16/bfloat16 caches are converted.
template <int Maps, class T>
  requires supported_by<policy::simd, T>
void attention_decode(const policy::simd& p, cview<T, 5> q, const int8_kv<accum_t<T>>& kv,
                      std::span<const index_t> lengths, cview<accum_t<T>, 1> lambda, TensorView<T, 4> o,
                      int logit_bits = logits_unquantized) {
  using namespace simd_detail;
  using A = accum_t<T>;
  using strided_rows = Eigen::Map<const row_matrix<A>, 0, Eigen::OuterStride<>>;
  detail::check_attention_decode_int8<Maps>("attention_decode", q, kv, lengths, lambda, o);
  detail::check_logit_bits<A>("attention_decode", logit_bits);
  const index_t new_tokens = q.extent(1), H = q.extent(2), d = q.extent(4);
  const index_t S = kv.keys8.extent(1), G = kv.keys8.extent(2), r = H / G, dv = kv.values8.extent(3);
  const index_t rows = new_tokens * r;
  const A scale = A(1) / std::sqrt(static_cast<A>(d));

  struct workspace {
    row_matrix<A> q_rows;
    std::vector<A> k_scratch, v_scratch;
  };
  // rows x cols int8 values (row t at first + t·stride) times their steps, as A at scratch.
  auto dequantized = [](const std::int8_t* first, const A* steps, index_t step_stride, index_t count, index_t cols,
                        index_t stride, std::vector<A>& scratch) {
    scratch.resize(static_cast<std::size_t>(count * cols));
    for (index_t t = 0; t < count; ++t)
      for (index_t c = 0; c < cols; ++c) scratch[static_cast<std::size_t>(t * cols + c)] = steps[t * step_stride] * A(first[t * stride + c]);
    return static_cast<const A*>(scratch.data());
  };
  auto scores = [&](workspace& ws, const decode_item& it, index_t m, row_matrix<A>& s) {
    query_rows<T>(q, it, m, r, scale, ws.q_rows);
    const std::int8_t* k_first = kv.keys8.data() + (((it.b * S + it.t0) * G + it.j) * Maps + m) * d;
    const A* steps = kv.key_steps.data() + ((it.b * S + it.t0) * G + it.j) * Maps + m;
    if (rows <= gemv_rows) {
      for (index_t row = 0; row < rows; ++row) {
        A* out = s.data() + row * cache_block;
        dots_with_rows(ws.q_rows.row(row).data(), k_first, G * Maps * d, it.keys, d, out);
        for (index_t t = 0; t < it.keys; ++t) out[t] *= steps[t * G * Maps];
      }
    } else {
      const strided_rows keys(dequantized(k_first, steps, G * Maps, it.keys, d, G * Maps * d, ws.k_scratch), it.keys, d,
                              Eigen::OuterStride<>(d));
      s.leftCols(it.keys).noalias() = ws.q_rows * keys.transpose();
    }
  };
  auto values = [&](workspace& ws, const decode_item& it, std::array<row_matrix<A>, Maps>& s,
                    const std::array<A*, Maps>& acc) {
    const std::int8_t* v_first = kv.values8.data() + ((it.b * S + it.t0) * G + it.j) * dv;
    const A* steps = kv.value_steps.data() + (it.b * S + it.t0) * G + it.j;
    if (rows <= gemv_rows) {
      for (auto& map_scores : s)  // p_t · step_t: the probabilities are not needed after this
        for (index_t row = 0; row < rows; ++row)
          for (index_t t = 0; t < it.keys; ++t) map_scores(row, t) *= steps[t * G];
      weighted_sums_per_row<Maps>(s, rows, v_first, G * dv, it.keys, dv, acc);
    } else {
      block_products<Maps>(s, it.keys,
                           strided_rows(dequantized(v_first, steps, G, it.keys, dv, G * dv, ws.v_scratch), it.keys, dv,
                                        Eigen::OuterStride<>(dv)),
                           rows, dv, acc);
    }
  };
  decode_in_blocks<Maps, A, workspace>(
      p, G, new_tokens, r, dv, lengths, Maps == 2 ? lambda(0) : A(0), logit_bits, scores, values,
      [&](index_t b, index_t i, index_t h, const A* out) {
        from_accum(out, dv, o.data() + ((b * new_tokens + i) * H + h) * dv);
      });
}

}  // namespace difftx
