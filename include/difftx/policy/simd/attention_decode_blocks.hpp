// The decode kernel's work schedule, which every cache storage shares
// (attention_decode.hpp; how each storage computes a block's scores and P·V
// is in attention_decode_caches.hpp).
//
// Decoding is bound by memory: each step reads the whole cache once and does
// little arithmetic per byte, and there are too few query rows (T new tokens x
// H / G heads per group) to spread over threads. So the work is split over
// (sequence, block of keys), as flash-decoding does: a work item reads its
// keys and values for every group at once, position after position, the
// cache's own order (a position's groups lie side by side, so a group's rows
// alone are a few hundred bytes a few KiB apart, a pattern that reads memory
// well below its streaming rate, half of it on a 1B model's cache). Blocks
// are as long as a thread's share of the keys, up to max_block_keys. Each
// block leaves per group, query row and map its maximum, sum of exponentials
// and unnormalised P V. A second pass combines the blocks of a row by
// log-sum-exp:
//   M = max_s m_s,  L = sum_s l_s e^(m_s - M),  O_m = sum_s acc_s e^(m_s - M) / L.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <span>
#include <vector>

#include "difftx/core/x86_intrinsics.hpp"  // before Eigen
#include <Eigen/Core>

#include "difftx/ops/logit_quantization.hpp"
#include "difftx/policy/simd/attention_tiles.hpp"
#include "difftx/policy/simd/common.hpp"
#include "difftx/policy/simd/linear.hpp"

namespace difftx::simd_detail {

constexpr index_t max_block_keys = 256;  // keys per work item at most: the scores of a block are a row per query row
constexpr index_t min_block_keys = 32;   // and at least, where the cache is longer

// Keys per work item: all sequences' keys split evenly over the threads,
// within [min_block_keys, max_block_keys].
inline index_t block_keys(std::span<const index_t> lengths, int threads) {
  index_t total = 0;
  for (index_t n : lengths) total += n;
  return std::clamp<index_t>((total + threads - 1) / threads, min_block_keys, max_block_keys);
}

// One work item of decoding: sequence b, the cache's keys [t0, t0 + keys) of
// a sequence holding `length` keys, for every group.
struct decode_block {
  index_t b, t0, keys, length;
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

// The work items of a decode call: sequence b's blocks are numbered from
// first_block[b]; an item is a block (every group), a partial result a
// (block, group) pair, numbered block·G + j.
struct decode_schedule {
  std::span<const index_t> lengths;
  index_t B, G, new_tokens, r, rows, keys_per_block;
  std::vector<index_t> first_block;  // [B + 1]

  decode_schedule(std::span<const index_t> sequence_lengths, index_t groups, index_t tokens, index_t heads_per_group,
                  int threads)
      : lengths(sequence_lengths), B(static_cast<index_t>(sequence_lengths.size())), G(groups), new_tokens(tokens),
        r(heads_per_group), rows(tokens * heads_per_group), keys_per_block(block_keys(sequence_lengths, threads)),
        first_block(static_cast<std::size_t>(B) + 1, 0) {
    for (index_t b = 0; b < B; ++b)
      first_block[static_cast<std::size_t>(b) + 1] =
          first_block[static_cast<std::size_t>(b)] + (length(b) + keys_per_block - 1) / keys_per_block;
  }
  index_t length(index_t b) const { return lengths[static_cast<std::size_t>(b)]; }
  index_t blocks() const { return first_block.back(); }
  index_t blocks_of(index_t b) const {
    return first_block[static_cast<std::size_t>(b) + 1] - first_block[static_cast<std::size_t>(b)];
  }
  // Block number `block` as (sequence, first key, keys).
  decode_block locate(index_t block) const {
    const index_t b = static_cast<index_t>(std::upper_bound(first_block.begin(), first_block.end(), block) - first_block.begin()) - 1;
    const index_t t0 = (block - first_block[static_cast<std::size_t>(b)]) * keys_per_block;
    return decode_block{b, t0, std::min(keys_per_block, length(b) - t0), length(b)};
  }
  // The keys of blk that query row `row` sees: token row / r sits at position
  // length - T + row / r and sees keys t <= it.
  index_t visible(const decode_block& blk, index_t row) const {
    return std::clamp<index_t>(blk.length - new_tokens + row / r + 1 - blk.t0, 0, blk.keys);
  }
};

// What one key block of one group leaves for each of its query rows and maps.
template <class A>
struct decode_partials {
  index_t rows = 0, dv = 0;  // rows per item: T·r query rows, each with Maps maps
  std::vector<A> max, sum;   // [items][Maps][rows]
  std::vector<A> acc;        // [items][Maps][rows][dv]
  decode_partials(index_t items, index_t rows_per_item, index_t dv_size)
      : rows(rows_per_item), dv(dv_size),
        max(static_cast<std::size_t>(items * 2 * rows)),
        sum(static_cast<std::size_t>(items * 2 * rows)),
        acc(static_cast<std::size_t>(items * 2 * rows * dv)) {}
  A* max_at(index_t item, index_t m) { return max.data() + (item * 2 + m) * rows; }
  A* sum_at(index_t item, index_t m) { return sum.data() + (item * 2 + m) * rows; }
  A* acc_at(index_t item, index_t m) { return acc.data() + ((item * 2 + m) * rows) * dv; }
};

// Every block's scores, on the threads: cache.scores(ws, blk, s), then
// visit(ws, block, blk, s), with a workspace and a score buffer per thread.
template <int Maps, class Cache, class Visit>
void for_each_block_scores(const policy::simd& p, const Cache& cache, const decode_schedule& schedule, Visit&& visit) {
  using A = typename Cache::accum;
  std::atomic<index_t> next{0};  // blocks taken one at a time, as they finish
  fork(static_cast<int>(std::min<index_t>(thread_count(p), schedule.blocks())), [&](int, int) {
    const single_threaded_eigen one_thread;
    typename Cache::workspace ws;
    std::vector<A> s_values(static_cast<std::size_t>(schedule.G * Maps * schedule.rows * schedule.keys_per_block));
    const block_scores<A> s{s_values.data(), schedule.rows, schedule.keys_per_block};
    for (index_t block; (block = next.fetch_add(1, std::memory_order_relaxed)) < schedule.blocks();) {
      const decode_block blk = schedule.locate(block);
      cache.scores(ws, blk, s);
      visit(ws, block, blk, s);
    }
  });
}

// Where the logit grid of (b, j, map, row) is kept.
inline std::size_t grid_index(const decode_schedule& schedule, index_t b, index_t j, index_t m, index_t row) {
  return static_cast<std::size_t>(((b * schedule.G + j) * 2 + m) * schedule.rows + row);
}

// The grid of every (b, j, map, row) for logits quantized to logit_bits: a
// first sweep takes each block's largest |logit| per group and row (into
// part.max), then each row's over its blocks.
template <int Maps, class Cache>
std::vector<detail::logit_grid<typename Cache::accum>> decode_logit_grids(const policy::simd& p, const Cache& cache,
                                                                          const decode_schedule& schedule,
                                                                          decode_partials<typename Cache::accum>& part,
                                                                          int logit_bits) {
  using A = typename Cache::accum;
  const index_t G = schedule.G, rows = schedule.rows;
  for_each_block_scores<Maps>(p, cache, schedule, [&](auto&, index_t block, const decode_block& blk, const block_scores<A>& s) {
    for (index_t j = 0; j < G; ++j)
      for (index_t m = 0; m < Maps; ++m)
        for (index_t row = 0; row < rows; ++row)
          part.max_at(block * G + j, m)[row] = detail::largest_magnitude(s.template row<Maps>(j, m, row), schedule.visible(blk, row));
  });
  std::vector<A> largest(static_cast<std::size_t>(schedule.B * G * 2 * rows), A(0));  // over the blocks of every (b, j, map, row)
  for (index_t block = 0; block < schedule.blocks(); ++block) {
    const index_t b = schedule.locate(block).b;
    for (index_t j = 0; j < G; ++j)
      for (index_t m = 0; m < Maps; ++m)
        for (index_t row = 0; row < rows; ++row) {
          A& m_row = largest[grid_index(schedule, b, j, m, row)];
          m_row = std::max(m_row, part.max_at(block * G + j, m)[row]);
        }
  }
  std::vector<detail::logit_grid<A>> grids(largest.size());
  for (std::size_t e = 0; e < grids.size(); ++e) grids[e] = detail::logit_grid<A>(largest[e], logit_bits);
  return grids;
}

// Block `block`'s scores s into probabilities, per group, map and row: each
// row's logits on its grid (grids empty: unquantized), its maximum and its
// sum of exponentials into part; s then holds exp(S - max), zero past what
// the row sees.
template <int Maps, class A>
void block_softmax(const decode_schedule& schedule, const std::vector<detail::logit_grid<A>>& grids, index_t block,
                   const decode_block& blk, const block_scores<A>& s, decode_partials<A>& part) {
  const A neg_inf = -std::numeric_limits<A>::infinity();
  for (index_t j = 0; j < schedule.G; ++j)
    for (index_t m = 0; m < Maps; ++m) {
      A* row_max_out = part.max_at(block * schedule.G + j, m);
      A* row_sum_out = part.sum_at(block * schedule.G + j, m);
      for (index_t row = 0; row < schedule.rows; ++row) {
        const index_t seen = schedule.visible(blk, row);
        A* p_row = s.template row<Maps>(j, m, row);
        if (!grids.empty()) grids[grid_index(schedule, blk.b, j, m, row)].apply(p_row, seen);
        const A mx = seen > 0 ? row_max(p_row, seen) : neg_inf;
        exponentiate_row(p_row, seen, mx);
        std::fill(p_row + seen, p_row + blk.keys, A(0));
        row_max_out[row] = mx;
        row_sum_out[row] = sum(p_row, seen);
      }
    }
}

// The key blocks of every (b, token, head) combined by log-sum-exp, then
// O = O_1 - λ O_2 (two maps) stored into o [B, T, H, dv].
template <int Maps, class T>
void combine_blocks(const policy::simd& p, const decode_schedule& schedule, decode_partials<accum_t<T>>& part,
                    accum_t<T> lam, TensorView<T, 4> o) {
  using A = accum_t<T>;
  const A neg_inf = -std::numeric_limits<A>::infinity();
  const index_t G = schedule.G, r = schedule.r, rows = schedule.rows, dv = part.dv, H = o.extent(2);
  const index_t items = schedule.blocks() * G;
  fork(thread_count(p, items * Maps * rows * dv), [&](int t, int n) {
    std::vector<A> out(static_cast<std::size_t>(Maps * dv));
    const auto [first, last] = share_of(schedule.B * G, t, n);
    for (index_t bj = first; bj < last; ++bj) {
      const index_t b = bj / G, j = bj % G, blocks_b = schedule.blocks_of(b);
      auto item = [&](index_t s) { return (schedule.first_block[static_cast<std::size_t>(b)] + s) * G + j; };
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
        const index_t i = row / r, h = j * r + row % r;
        from_accum(out.data(), dv, o.data() + ((b * schedule.new_tokens + i) * H + h) * dv);
      }
    }
  });
}

// Decoding on cache (a float_cache_blocks or int8_cache_blocks,
// attention_decode_caches.hpp), which answers
//   Cache::workspace                          a thread's scratch
//   cache.scores(ws, blk, s)                  s.row<Maps>(j, m, row)[t] = S_m of
//                                             group j's query row `row` (token
//                                             row / r, head j·r + row % r) and
//                                             key t0 + t, t < keys
//   cache.values(ws, blk, s, j, acc)          acc[m] [rows][dv] = P_m · V of group
//                                             j (s, the probabilities, may be
//                                             overwritten)
// and its sizes (cache.queries: G, r, new_tokens, dv). logit_bits != 16 quantizes each row's
// logits over all its blocks: a first sweep takes every row's largest |logit|.
template <int Maps, class Cache, class T>
void decode_in_blocks(const policy::simd& p, const Cache& cache, std::span<const index_t> lengths, accum_t<T> lam,
                      int logit_bits, TensorView<T, 4> o) {
  using A = accum_t<T>;
  const decode_schedule schedule(lengths, cache.queries.G, cache.queries.new_tokens, cache.queries.r, thread_count(p));
  decode_partials<A> part(schedule.blocks() * schedule.G, schedule.rows, cache.queries.dv);
  const std::vector<detail::logit_grid<A>> grids =
      logit_bits == logits_unquantized ? std::vector<detail::logit_grid<A>>{}
                                       : decode_logit_grids<Maps>(p, cache, schedule, part, logit_bits);
  // Per block, group and row: its maximum, its sum of exponentials and P·V.
  for_each_block_scores<Maps>(p, cache, schedule, [&](auto& ws, index_t block, const decode_block& blk, const block_scores<A>& s) {
    block_softmax<Maps>(schedule, grids, block, blk, s, part);
    for (index_t j = 0; j < schedule.G; ++j) {
      std::array<A*, Maps> acc;
      for (index_t m = 0; m < Maps; ++m) acc[static_cast<std::size_t>(m)] = part.acc_at(block * schedule.G + j, m);
      cache.values(ws, blk, s, j, acc);
    }
  });
  combine_blocks<Maps, T>(p, schedule, part, lam, o);
}

}  // namespace difftx::simd_detail
