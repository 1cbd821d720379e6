// Attention of a few new tokens over a key/value cache on the CPU (formulas in
// difftx/ops/attention_decode.hpp), split over keys as flash-decoding does.
//
// Decoding is bound by memory: each step reads the whole cache once and does
// little arithmetic per byte, and there are too few query rows (T new tokens x
// H / G heads per group) to spread over threads. So the work is split over
// (sequence, block of keys): a work item reads its keys and values for every
// group at once, position after position, the cache's own order (a
// position's groups lie side by side, so a group's rows alone are a few
// hundred bytes a few KiB apart: read so, the 1B model's cache came at half
// the rate). Blocks are as long as a thread's share of the keys, up to
// max_block_keys. Each block leaves per group, query row and map its maximum,
// sum of exponentials and unnormalised P V (scores S = Q K^T and P V: for a
// few rows, loops over the cache in place that convert float16 and bfloat16
// in registers; for more, Eigen products). A second pass combines the blocks
// of a row by log-sum-exp:
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
#include "difftx/policy/simd/attention_tiles.hpp"
#include "difftx/policy/simd/common.hpp"
#include "difftx/policy/simd/linear.hpp"

namespace difftx {

namespace simd_detail {

constexpr index_t max_block_keys = 256;  // keys per work item at most: the scores of a block are a row per query row
constexpr index_t min_block_keys = 32;   // and at least, where the cache is longer
// Up to this many query rows per group, the block is read in place, in its
// storage type, by dots_per_position (scores: each key's row once for all
// query rows) and weighted_sums_of_rows (P·V: the values once per row, from
// L2 after the first): a matrix product would pack the whole key (value)
// block for each call, which costs more than that reading (and for
// float16/bfloat16 a converted copy of the block costs more than the reading).
constexpr index_t gemv_rows = 4;

// Keys per work item: all sequences' keys split evenly over the threads,
// within [min_block_keys, max_block_keys].
inline index_t block_keys(std::span<const index_t> lengths, int threads) {
  index_t total = 0;
  for (index_t n : lengths) total += n;
  return std::clamp<index_t>((total + threads - 1) / threads, min_block_keys, max_block_keys);
}

// Whether the few-rows kernels read T's rows two values a lane (load_bf16_pairs):
// bfloat16 into float. Then a query row's values are stored in pair order:
// each whole run of 2W values as its even columns, then its odd ones.
template <class A, class T>
constexpr bool reads_pairs = std::is_same_v<T, Eigen::bfloat16> && std::is_same_v<A, float>;
// The values of a row one step of those kernels reads.
template <class A, class T>
constexpr index_t row_step = reads_pairs<A, T> ? 2 * vec<A>::size : vec<A>::size;

// x's d values into pair order, in place (a tail shorter than a run stays).
template <class A, class T>
void to_pair_order(A* x, index_t d) {
  constexpr index_t step = row_step<A, T>, W = vec<A>::size;
  alignas(64) A run[step];
  for (index_t c = 0; c + step <= d; c += step) {
    for (index_t i = 0; i < W; ++i) {
      run[i] = x[c + 2 * i];
      run[W + i] = x[c + 2 * i + 1];
    }
    std::copy_n(run, step, x + c);
  }
}

// s[i·s_stride + t] = x_i · K(t, i / per_piece) for query rows i < n and keys
// t < keys. Key t's row, at first + t·stride, holds pieces of d values side
// by side (every group and map of a position); query row i (d values at
// x + i·d, in pair order for reads_pairs) meets piece i / per_piece. A key's
// row is read once for all query rows, W of them at a time with their sums
// reduced across lanes together.
template <class A, class T>
void dots_per_position(const A* x, index_t n, index_t per_piece, index_t d, const T* first, index_t stride,
                       index_t keys, A* s, index_t s_stride) {
  using V = vec<A>;
  constexpr index_t W = V::size, step = row_step<A, T>;
  const index_t d_vec = d / step * step;
  auto add_step = [](const A* xc, const T* kc, V acc) {
    if constexpr (reads_pairs<A, T>) {
      const bf16_pair_halves k2 = load_bf16_pairs(kc);
      return simd_detail::multiply_add(V::load_unaligned(xc + W), k2.odd, simd_detail::multiply_add(V::load_unaligned(xc), k2.even, acc));
    } else {
      return simd_detail::multiply_add(V::load_unaligned(xc), load_row_as<A>(kc), acc);
    }
  };
  std::vector<index_t> piece(static_cast<std::size_t>(n));  // where query row i's piece starts in a key's row
  for (index_t i = 0; i < n; ++i) piece[static_cast<std::size_t>(i)] = i / per_piece * d;
  auto rest = [&](index_t i, const T* key) {  // the columns past the last whole step
    A sum(0);
    for (index_t c = d_vec; c < d; ++c) sum += x[i * d + c] * static_cast<A>(key[piece[static_cast<std::size_t>(i)] + c]);
    return sum;
  };
  auto dot = [&](index_t i, const T* key) {  // x_i · its piece of key, the whole steps, in two chains
    const A* xi = x + i * d;
    const T* ki = key + piece[static_cast<std::size_t>(i)];
    V even_steps(A(0)), odd_steps(A(0));
    index_t c = 0;
    for (; c + 2 * step <= d_vec; c += 2 * step) {
      even_steps = add_step(xi + c, ki + c, even_steps);
      odd_steps = add_step(xi + c + step, ki + c + step, odd_steps);
    }
    if (c < d_vec) even_steps = add_step(xi + c, ki + c, even_steps);
    return even_steps + odd_steps;
  };
  for (index_t t = 0; t < keys; ++t) {
    const T* key = first + t * stride;
    index_t i0 = 0;
    for (; i0 + W <= n; i0 += W) {
      V acc[W];
      DIFFTX_UNROLL(16)
      for (index_t i = 0; i < W; ++i) acc[i] = dot(i0 + i, key);
      alignas(64) A sums[W];
      lane_sums(acc, sums);
      for (index_t i = 0; i < W; ++i) s[(i0 + i) * s_stride + t] = sums[i];
    }
    for (; i0 < n; ++i0) s[i0 * s_stride + t] = xsimd::hadd(dot(i0, key));
    if (d_vec < d)
      for (index_t i = 0; i < n; ++i) s[i * s_stride + t] += rest(i, key);
  }
}

// out[m][c] = Σ_t p[m][t] · V(t, c) for c < dv and each of the Maps maps, V's
// row t at v_first + t·stride (T, or int8): the rows stream past once for
// every few vectors of columns and all maps (a differential head's two maps
// share V), those vectors of each map's out held in registers.
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
        for (index_t v = 0; v < NV; ++v) acc[m][v] = simd_detail::multiply_add(pv, row[v], acc[m][v]);
      }
    }
    for (index_t m = 0; m < Maps; ++m)
      for (index_t v = 0; v < NV; ++v) acc[m][v].store_unaligned(out[m] + c0 + v * W);
  };
  index_t c0 = 0;
  if constexpr (reads_pairs<A, T>) {
    // reads_pairs: NP runs of 2W columns, each as its even and odd columns,
    // interleaved again when stored.
    auto pair_columns = [&](auto runs, index_t first) {
      constexpr index_t NP = decltype(runs)::value;
      V even[Maps][NP], odd[Maps][NP];
      for (index_t m = 0; m < Maps; ++m)
        for (index_t u = 0; u < NP; ++u) even[m][u] = odd[m][u] = V(A(0));
      for (index_t t = 0; t < keys; ++t) {
        bf16_pair_halves row[NP];
        for (index_t u = 0; u < NP; ++u) row[u] = load_bf16_pairs(v_first + t * stride + first + 2 * u * W);
        for (index_t m = 0; m < Maps; ++m) {
          const V pv(p[m][t]);
          for (index_t u = 0; u < NP; ++u) {
            even[m][u] = simd_detail::multiply_add(pv, row[u].even, even[m][u]);
            odd[m][u] = simd_detail::multiply_add(pv, row[u].odd, odd[m][u]);
          }
        }
      }
      alignas(64) A e[W], o[W];
      for (index_t m = 0; m < Maps; ++m)
        for (index_t u = 0; u < NP; ++u) {
          even[m][u].store_aligned(e);
          odd[m][u].store_aligned(o);
          A* run = out[m] + first + 2 * u * W;
          for (index_t i = 0; i < W; ++i) {
            run[2 * i] = e[i];
            run[2 * i + 1] = o[i];
          }
        }
    };
    constexpr index_t NP = W >= 16 ? 4 : 2;  // 4·Maps + 2·NP vectors: within AVX-512's 32 registers, AVX2's 16 at 2
    for (; c0 + 2 * NP * W <= dv; c0 += 2 * NP * W) pair_columns(std::integral_constant<index_t, NP>{}, c0);
    for (; c0 + 2 * W <= dv; c0 += 2 * W) pair_columns(std::integral_constant<index_t, 1>{}, c0);
  }
  for (; c0 + 4 * W <= dv; c0 += 4 * W) columns(std::integral_constant<index_t, 4>{}, c0);
  for (; c0 + W <= dv; c0 += W) columns(std::integral_constant<index_t, 1>{}, c0);
  for (; c0 < dv; ++c0)
    for (index_t m = 0; m < Maps; ++m) {
      A x(0);
      for (index_t t = 0; t < keys; ++t) x += p[m][t] * static_cast<A>(v_first[t * stride + c0]);
      out[m][c0] = x;
    }
}

// What one key block of one group leaves for each of its query rows and maps.
template <class A>
struct decode_partials {
  index_t rows = 0, dv = 0;  // rows per item: T·r query rows, each with Maps maps
  std::vector<A> max, sum;   // [items][Maps][rows]
  std::vector<A> acc;        // [items][Maps][rows][dv]
  A* max_at(index_t item, index_t m) { return max.data() + (item * 2 + m) * rows; }
  A* sum_at(index_t item, index_t m) { return sum.data() + (item * 2 + m) * rows; }
  A* acc_at(index_t item, index_t m) { return acc.data() + ((item * 2 + m) * rows) * dv; }
};

// A block's scores: s(i, t) for query row i = (j·Maps + m)·rows + row of group
// j, map m, and key t, a row of s_stride per query row.
template <class A>
struct block_scores {
  A* s;
  index_t rows, s_stride;
  template <int Maps>
  A* row(index_t j, index_t m, index_t r) const {
    return s + ((j * Maps + m) * rows + r) * s_stride;
  }
  // Group j's and map m's rows x keys scores as a matrix (Eigen's products).
  template <int Maps>
  Eigen::Map<row_matrix<A>, 0, Eigen::OuterStride<>> matrix(index_t j, index_t m, index_t keys) const {
    return {row<Maps>(j, m, 0), rows, keys, Eigen::OuterStride<>(s_stride)};
  }
};

// Group j's P·V for every map, acc[m][rows][dv] = P_m · V's `keys` rows (the
// probabilities in scores). For a few query rows V (T or int8, row t at
// v_first + t·stride) is read in place, once per row for all maps; for more,
// block (V's rows as A, converted once per group) multiplies each map's
// probabilities in Eigen.
template <int Maps, class A, class T>
void weighted_sums_per_row(const block_scores<A>& scores, index_t j, const T* v_first, index_t stride, index_t keys,
                           index_t dv, const std::array<A*, Maps>& acc) {
  for (index_t row = 0; row < scores.rows; ++row) {
    std::array<const A*, Maps> p;
    std::array<A*, Maps> out;
    for (std::size_t m = 0; m < Maps; ++m) {
      p[m] = scores.template row<Maps>(j, static_cast<index_t>(m), row);
      out[m] = acc[m] + row * dv;
    }
    weighted_sums_of_rows<Maps>(p, v_first, stride, keys, dv, out);
  }
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

// One work item of decoding: sequence b, the cache's keys [t0, t0 + keys) of
// a sequence holding `length` keys, for every group.
struct decode_block {
  index_t b, t0, keys, length;
};

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

// The decoding schedule every cache storage shares: the work items (b, block
// of keys up to each sequence's length, every group) over the threads, each
// leaving per group, query row and map its maximum, sum and unnormalised P·V,
// then the blocks of each row combined by log-sum-exp into out. What differs
// between storages is how a block's scores and P·V are computed:
//   Workspace                 a thread's scratch (default-constructed)
//   scores(ws, block, s)      s.row<Maps>(j, m, row)[t] = S_m of group j's query
//                             row `row` (token row / r, head j·r + row % r) and
//                             key t0 + t, t < keys
//   values(ws, block, s, acc) acc(j)[m] [rows][dv] = P_m · V of group j, for
//                             every group j and map m (s, the probabilities,
//                             may be overwritten)
//   store(b, i, h, out)       out[dv] (A), the result of token i, head h
// logit_bits != 16 quantizes each row's logits over all its blocks: a first
// sweep takes every row's largest |logit|.
template <int Maps, class A, class Workspace, class Scores, class Values, class Store>
void decode_in_blocks(const policy::simd& p, index_t G, index_t new_tokens, index_t r, index_t dv,
                      std::span<const index_t> lengths, A lam, int logit_bits, Scores&& scores, Values&& values,
                      Store&& store) {
  const index_t B = static_cast<index_t>(lengths.size()), rows = new_tokens * r;
  const index_t keys_per_block = block_keys(lengths, thread_count(p));
  const A neg_inf = -std::numeric_limits<A>::infinity();
  std::vector<index_t> first_block(static_cast<std::size_t>(B) + 1, 0);
  for (index_t b = 0; b < B; ++b)
    first_block[static_cast<std::size_t>(b) + 1] =
        first_block[static_cast<std::size_t>(b)] + (lengths[static_cast<std::size_t>(b)] + keys_per_block - 1) / keys_per_block;
  const index_t blocks = first_block.back(), items = blocks * G;  // item = block·G + j
  auto blocks_of = [&](index_t b) {
    return first_block[static_cast<std::size_t>(b) + 1] - first_block[static_cast<std::size_t>(b)];
  };
  auto locate = [&](index_t block) {
    const index_t b = static_cast<index_t>(std::upper_bound(first_block.begin(), first_block.end(), block) - first_block.begin()) - 1;
    const index_t t0 = (block - first_block[static_cast<std::size_t>(b)]) * keys_per_block;
    const index_t length = lengths[static_cast<std::size_t>(b)];
    return decode_block{b, t0, std::min(keys_per_block, length - t0), length};
  };
  // Token row / r sits at position length - T + row / r and sees keys t <= it.
  auto visible = [&](const decode_block& blk, index_t row) {
    return std::clamp<index_t>(blk.length - new_tokens + row / r + 1 - blk.t0, 0, blk.keys);
  };
  decode_partials<A> part{rows, dv, std::vector<A>(static_cast<std::size_t>(items * 2 * rows)),
                          std::vector<A>(static_cast<std::size_t>(items * 2 * rows)),
                          std::vector<A>(static_cast<std::size_t>(items * 2 * rows * dv))};
  // The grid of every (b, j, map, row): inactive unless quantizing.
  std::vector<detail::logit_grid<A>> grids(logit_bits == logits_unquantized ? 0 : static_cast<std::size_t>(B * G * 2 * rows));
  auto grid_index = [&](index_t b, index_t j, index_t m, index_t row) {
    return static_cast<std::size_t>(((b * G + j) * 2 + m) * rows + row);
  };

  // Every block's scores, on the threads: visit(ws, block, blk, s) once
  // scores(ws, blk, s) ran.
  auto over_blocks = [&](auto&& visit) {
#pragma omp parallel num_threads(thread_count(p))
    {
      single_threaded_eigen();
      Workspace ws;
      std::vector<A> s_values(static_cast<std::size_t>(G * Maps * rows * keys_per_block));
      const block_scores<A> s{s_values.data(), rows, keys_per_block};
#pragma omp for schedule(dynamic, 1)
      for (index_t block = 0; block < blocks; ++block) {
        const decode_block blk = locate(block);
        scores(ws, blk, s);
        visit(ws, block, blk, s);
      }
    }
  };

  if (!grids.empty()) {
    // Each block's largest |logit| per group and row (in part.max), then the grids.
    over_blocks([&](Workspace&, index_t block, const decode_block& blk, const block_scores<A>& s) {
      for (index_t j = 0; j < G; ++j)
        for (index_t m = 0; m < Maps; ++m)
          for (index_t row = 0; row < rows; ++row)
            part.max_at(block * G + j, m)[row] = detail::largest_magnitude(s.template row<Maps>(j, m, row), visible(blk, row));
    });
    std::vector<A> largest(grids.size(), A(0));  // over the blocks of every (b, j, map, row)
    for (index_t block = 0; block < blocks; ++block) {
      const index_t b = locate(block).b;
      for (index_t j = 0; j < G; ++j)
        for (index_t m = 0; m < Maps; ++m)
          for (index_t row = 0; row < rows; ++row) {
            A& m_row = largest[grid_index(b, j, m, row)];
            m_row = std::max(m_row, part.max_at(block * G + j, m)[row]);
          }
    }
    for (std::size_t e = 0; e < grids.size(); ++e) grids[e] = detail::logit_grid<A>(largest[e], logit_bits);
  }

  // Per block, group and row: its maximum, its sum of exponentials and P·V.
  over_blocks([&](Workspace& ws, index_t block, const decode_block& blk, const block_scores<A>& s) {
    for (index_t j = 0; j < G; ++j)
      for (index_t m = 0; m < Maps; ++m) {
        A* row_max_out = part.max_at(block * G + j, m);
        A* row_sum_out = part.sum_at(block * G + j, m);
        for (index_t row = 0; row < rows; ++row) {
          const index_t seen = visible(blk, row);
          A* p_row = s.template row<Maps>(j, m, row);
          if (!grids.empty()) grids[grid_index(blk.b, j, m, row)].apply(p_row, seen);
          const A mx = seen > 0 ? row_max(p_row, seen) : neg_inf;
          exponentiate_row(p_row, seen, mx);
          std::fill(p_row + seen, p_row + blk.keys, A(0));
          row_max_out[row] = mx;
          row_sum_out[row] = sum(p_row, seen);
        }
      }
    values(ws, blk, s, [&](index_t j) {
      std::array<A*, Maps> acc;
      for (index_t m = 0; m < Maps; ++m) acc[static_cast<std::size_t>(m)] = part.acc_at(block * G + j, m);
      return acc;
    });
  });

  // Combine the key blocks of every (b, token, head) by log-sum-exp.
#pragma omp parallel num_threads(thread_count(p, items * Maps * rows * dv))
  {
    std::vector<A> out(static_cast<std::size_t>(Maps * dv));
#pragma omp for schedule(static)
    for (index_t bj = 0; bj < B * G; ++bj) {
      const index_t b = bj / G, j = bj % G, blocks_b = blocks_of(b);
      auto item = [&](index_t s) { return (first_block[static_cast<std::size_t>(b)] + s) * G + j; };
      for (index_t row = 0; row < rows; ++row) {
        for (index_t m = 0; m < Maps; ++m) {
          A mx = neg_inf;
          for (index_t s = 0; s < blocks_b; ++s) mx = std::max(mx, part.max_at(item(s), m)[row]);
          A total = 0;
          A* o_m = out.data() + m * dv;
          std::fill(o_m, o_m + dv, A(0));
          for (index_t s = 0; s < blocks_b; ++s) {
            const A m_s = part.max_at(item(s), m)[row];
            if (m_s == neg_inf) continue;  // a block wholly after this token
            const A w = std::exp(m_s - mx);
            total += w * part.sum_at(item(s), m)[row];
            const A* acc = part.acc_at(item(s), m) + row * dv;
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
  auto scores = [&](workspace& ws, const decode_block& blk, const block_scores<A>& s) {
    const T* k_first = k.data() + (blk.b * S + blk.t0) * G * Maps * d;  // key t0's row: every group and map
    if (rows <= gemv_rows) {
      all_query_rows<Maps, T, T>(q, blk.b, G, r, scale, ws.q_rows);
      dots_per_position(ws.q_rows.data(), G * Maps * rows, rows, d, k_first, G * Maps * d, blk.keys, s.s, s.s_stride);
      return;
    }
    ws.q_rows.resize(rows, d);
    for (index_t j = 0; j < G; ++j)
      for (index_t m = 0; m < Maps; ++m) {
        query_rows<T>(q, blk.b, j, m, r, scale, ws.q_rows.data());
        // K rows t0 .. t0 + keys of group j, map m, as A (in place for float and double).
        const T* first = k_first + (j * Maps + m) * d;
        const A* k_block = rows_as_accum<T>(first, blk.keys, d, G * Maps * d, ws.k_scratch);
        const strided_rows key_rows(k_block, blk.keys, d, Eigen::OuterStride<>(std::is_same_v<T, A> ? G * Maps * d : d));
        s.template matrix<Maps>(j, m, blk.keys).noalias() = ws.q_rows * key_rows.transpose();
      }
  };
  auto values = [&](workspace& ws, const decode_block& blk, const block_scores<A>& s, auto&& acc) {
    for (index_t j = 0; j < G; ++j) {
      const T* v_first = v.data() + ((blk.b * S + blk.t0) * G + j) * dv;
      if (rows <= gemv_rows)
        weighted_sums_per_row<Maps>(s, j, v_first, G * dv, blk.keys, dv, acc(j));
      else
        block_products<Maps>(s, j, blk.keys,
                             strided_rows(rows_as_accum<T>(v_first, blk.keys, dv, G * dv, ws.v_scratch), blk.keys, dv,
                                          Eigen::OuterStride<>(std::is_same_v<T, A> ? G * dv : dv)),
                             dv, acc(j));
    }
  };
  decode_in_blocks<Maps, A, workspace>(
      p, G, new_tokens, r, dv, lengths, Maps == 2 ? lambda(0) : A(0), logit_bits, scores, values,
      [&](index_t b, index_t i, index_t h, const A* out) {
        from_accum(out, dv, o.data() + ((b * new_tokens + i) * H + h) * dv);
      });
}

// The same over an int8 cache (modules/kv_cache.hpp): keys and values read in
// place, int8 converted in registers; a block's scores are Q · k8 then times
// each key's step, and each value's step folds into its probability. With
// more than gemv_rows query rows, each group's block is dequantized once into
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
  auto scores = [&](workspace& ws, const decode_block& blk, const block_scores<A>& s) {
    const std::int8_t* k_first = kv.keys8.data() + (blk.b * S + blk.t0) * G * Maps * d;
    const A* steps = kv.key_steps.data() + (blk.b * S + blk.t0) * G * Maps;  // [keys][G][Maps]
    if (rows <= gemv_rows) {
      all_query_rows<Maps, T, std::int8_t>(q, blk.b, G, r, scale, ws.q_rows);
      dots_per_position(ws.q_rows.data(), G * Maps * rows, rows, d, k_first, G * Maps * d, blk.keys, s.s, s.s_stride);
      for (index_t j = 0; j < G; ++j)
        for (index_t m = 0; m < Maps; ++m)
          for (index_t row = 0; row < rows; ++row) {
            A* out = s.template row<Maps>(j, m, row);
            for (index_t t = 0; t < blk.keys; ++t) out[t] *= steps[t * G * Maps + j * Maps + m];
          }
      return;
    }
    ws.q_rows.resize(rows, d);
    for (index_t j = 0; j < G; ++j)
      for (index_t m = 0; m < Maps; ++m) {
        query_rows<T>(q, blk.b, j, m, r, scale, ws.q_rows.data());
        const strided_rows keys(dequantized(k_first + (j * Maps + m) * d, steps + j * Maps + m, G * Maps, blk.keys, d,
                                            G * Maps * d, ws.k_scratch),
                                blk.keys, d, Eigen::OuterStride<>(d));
        s.template matrix<Maps>(j, m, blk.keys).noalias() = ws.q_rows * keys.transpose();
      }
  };
  auto values = [&](workspace& ws, const decode_block& blk, const block_scores<A>& s, auto&& acc) {
    for (index_t j = 0; j < G; ++j) {
      const std::int8_t* v_first = kv.values8.data() + ((blk.b * S + blk.t0) * G + j) * dv;
      const A* steps = kv.value_steps.data() + (blk.b * S + blk.t0) * G + j;
      if (rows <= gemv_rows) {
        for (index_t m = 0; m < Maps; ++m)  // p_t · step_t: the probabilities are not needed after this
          for (index_t row = 0; row < rows; ++row) {
            A* p_row = s.template row<Maps>(j, m, row);
            for (index_t t = 0; t < blk.keys; ++t) p_row[t] *= steps[t * G];
          }
        weighted_sums_per_row<Maps>(s, j, v_first, G * dv, blk.keys, dv, acc(j));
      } else {
        block_products<Maps>(s, j, blk.keys,
                             strided_rows(dequantized(v_first, steps, G, blk.keys, dv, G * dv, ws.v_scratch), blk.keys, dv,
                                          Eigen::OuterStride<>(dv)),
                             dv, acc(j));
      }
    }
  };
  decode_in_blocks<Maps, A, workspace>(
      p, G, new_tokens, r, dv, lengths, Maps == 2 ? lambda(0) : A(0), logit_bits, scores, values,
      [&](index_t b, index_t i, index_t h, const A* out) {
        from_accum(out, dv, o.data() + ((b * new_tokens + i) * H + h) * dv);
      });
}

}  // namespace difftx
