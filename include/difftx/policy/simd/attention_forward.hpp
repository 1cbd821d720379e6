// The fused attention forward with one or two maps on the CPU (formulas in
// difftx/ops/attention.hpp), in the manner of FlashAttention-2: memory linear
// in N, no N x N matrix ever stored.
//
// One parallel region packs the keys and values of every (batch row,
// key/value group) pair (a float copy the size of k and v), then takes items
// (pair, block of 64 queries, head), largest first. Each item streams the
// key/value blocks once; for each map it keeps the running row maximum, row
// sum and an accumulator of P·V (two accumulators for differential attention,
// since the backward needs O_2 on its own); skips key blocks wholly after the
// queries (causal); finally O = O_1 - λ_h O_2 and the log-sum-exp of every row.
//
// flash_attention_forward is that loop over a source of score tiles:
// float_scores here (S = Q·Kᵀ in float), low_bit_scores in
// attention_low_bit_forward.hpp (int8 Q·Kᵀ, quantized logits).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "difftx/policy/simd/attention_tiles.hpp"
#include "difftx/policy/simd/common.hpp"

namespace difftx::simd_detail {

// One work item of the forward: the query block qb of head h, rows [i0, i0 +
// rows), against the keys of pair (batch row b, group j) up to key block
// key_blocks (causal: the one holding the last row's last key).
struct forward_item {
  index_t pair, b, j, h, i0, rows, key_blocks, N;
  key_window window;
  // The keys of key block kb that row i of the block sees.
  index_t visible(index_t i, index_t kb) const { return window.visible(i0 + i, kb * attention_block); }
};

// A forward call's sizes, and its items in the order they are handed out.
struct forward_shape {
  index_t B, N, M, H, G, d, r, dv, blocks, key_blocks, pairs;
  key_window window;

  template <class Q, class K, class V>  // views q [B,N,H,Maps,d], k [B,M,G,Maps,d], v [B,M,G,dv]
  forward_shape(const Q& q, const K& k, const V& v, bool causal)
      : B(q.extent(0)), N(q.extent(1)), M(k.extent(1)), H(q.extent(2)), G(k.extent(2)), d(q.extent(4)), r(H / G),
        dv(v.extent(3)), blocks(round_up(N, attention_block) / attention_block),
        key_blocks(round_up(M, attention_block) / attention_block), pairs(B * G), window{N, M, causal} {}

  index_t items() const { return blocks * pairs * r; }
  // Items from the last query block down: with a causal mask they are the largest.
  forward_item item(index_t n) const {
    const index_t qb = blocks - 1 - n / (pairs * r), pair = n / r % pairs, b = pair / G, j = pair % G;
    const index_t i0 = qb * attention_block, rows = std::min(attention_block, N - i0);
    return {pair, b, j, j * r + n % r, i0, rows, window.key_blocks(i0, rows), N, window};
  }
};

// A thread's tiles for the forward.
template <class A>
struct forward_tiles {
  index_t d;
  aligned_vector<A> q_tile;  // [Maps][Bs][d]: the item's queries scaled by 1/sqrt(d), zero past its rows
  aligned_vector<A> s;       // [Bs][Bs]: a score tile, then its probabilities
  online_softmax<A> softmax;
  std::vector<A> row_scratch;  // rows converted to A, and key blocks staged for packing
  forward_tiles(index_t maps, index_t depth, index_t dv)
      : d(depth),
        q_tile(static_cast<std::size_t>(maps * attention_block * depth)),
        s(static_cast<std::size_t>(attention_block * attention_block)),
        softmax(maps, dv) {}
  A* q_of(index_t m) { return q_tile.data() + m * attention_block * d; }  // map m's rows
};

// The item's query rows of every map, scaled, into tiles.q_tile.
template <int Maps, class T>
void load_query_tile(cview<T, 5> q, const forward_item& item, accum_t<T> scale, forward_tiles<accum_t<T>>& tiles) {
  using A = accum_t<T>;
  const index_t N = q.extent(1), H = q.extent(2), d = q.extent(4);
  std::fill(tiles.q_tile.begin(), tiles.q_tile.end(), A(0));
  for (index_t i = 0; i < item.rows; ++i)
    for (index_t m = 0; m < Maps; ++m) {
      const A* row = accum_row(q.data() + (((item.b * N + item.i0 + i) * H + item.h) * Maps + m) * d, d, tiles.row_scratch);
      for (index_t c = 0; c < d; ++c)
        tiles.q_tile[static_cast<std::size_t>((m * attention_block + i) * d + c)] = row[c] * scale;
    }
}

// The item's rows of O = O_1 - λ O_2 (λ: its head's; O_2 saved for the
// backward) and of lse, from the finished online softmax.
template <int Maps, class T>
void store_item_rows(online_softmax<accum_t<T>>& softmax, const forward_item& item, accum_t<T> lam, TensorView<T, 4> o,
                     TensorView<T, 4> o2, TensorView<accum_t<T>, 4> lse) {
  using A = accum_t<T>;
  const index_t H = o.extent(2), dv = o.extent(3);
  for (index_t i = 0; i < item.rows; ++i) {
    const index_t row = ((item.b * item.N + item.i0 + i) * H + item.h) * dv;
    for (index_t m = 0; m < Maps; ++m) lse(item.b, item.h, m, item.i0 + i) = softmax.finish_row(m, i);
    A* o_first = softmax.output_row(0, i);
    if constexpr (Maps == 2) {
      const A* o_second = softmax.output_row(1, i);
      from_accum(o_second, dv, o2.data() + row);
      for (index_t c = 0; c < dv; ++c) o_first[c] -= lam * o_second[c];
    }
    from_accum(o_first, dv, o.data() + row);
  }
}

// FlashAttention-2's forward with score tiles from `scores` (Scores: a
// float_scores or a low_bit_scores), which answers:
//   key_block_packed(pair, kb, keys)  after key block kb of a pair is packed
//   Scores::worker(scores)            a thread's part of the source, with
//     start_item(keys, item, tiles)   once an item's query tile is loaded
//     tile(keys, item, kb, m, tiles)  S_m of key block kb into tiles.s
template <int Maps, class T, class Scores>
void flash_attention_forward(const policy::simd& p, cview<T, 5> q, cview<T, 5> k, cview<T, 4> v,
                             const detail::head_lambdas<accum_t<T>>& lambdas, bool causal, TensorView<T, 4> o,
                             TensorView<T, 4> o2, TensorView<accum_t<T>, 4> lse, Scores& scores) {
  using A = accum_t<T>;
  const forward_shape shape(q, k, v, causal);
  const A scale = A(1) / std::sqrt(static_cast<A>(shape.d));
  std::vector<packed_keys<A>> keys(static_cast<std::size_t>(shape.pairs));
  for (auto& pair_keys : keys) pair_keys.reset(shape.M, Maps, shape.d, shape.dv, false);

  // One parallel region: pack every pair's keys, then every (pair, query block,
  // head) item, so that short sequences still give each thread several items.
#pragma omp parallel num_threads(thread_count(p))
  {
    forward_tiles<A> tiles(Maps, shape.d, shape.dv);
    typename Scores::worker scorer(scores);
#pragma omp for schedule(static)
    for (index_t block = 0; block < shape.pairs * shape.key_blocks; ++block) {
      const index_t pair = block / shape.key_blocks, kb = block % shape.key_blocks;
      auto& pair_keys = keys[static_cast<std::size_t>(pair)];
      pack_key_block<Maps, T>(k, v, pair / shape.G, pair % shape.G, kb, pair_keys, tiles.row_scratch);
      scores.key_block_packed(pair, kb, pair_keys);
    }

#pragma omp for schedule(dynamic, 1)
    for (index_t n = 0; n < shape.items(); ++n) {
      const forward_item item = shape.item(n);
      const packed_keys<A>& pair_keys = keys[static_cast<std::size_t>(item.pair)];
      load_query_tile<Maps, T>(q, item, scale, tiles);
      scorer.start_item(pair_keys, item, tiles);
      tiles.softmax.start();
      for (index_t kb = 0; kb < item.key_blocks; ++kb)
        for (index_t m = 0; m < Maps; ++m) {
          scorer.tile(pair_keys, item, kb, m, tiles);
          tiles.softmax.add_block(m, tiles.s.data(), item.rows, [&](index_t i) { return item.visible(i, kb); },
                                  pair_keys.v.data() + kb * attention_block * shape.dv);
        }
      store_item_rows<Maps, T>(tiles.softmax, item, lambdas(item.h), o, o2, lse);
    }
  }
}

// Score tiles in float: S_m = (Q_m / sqrt(d)) · K_mᵀ on the packed keys.
template <class A>
struct float_scores {
  void key_block_packed(index_t, index_t, packed_keys<A>&) {}  // the float keys are all it reads
  struct worker {
    explicit worker(const float_scores&) {}
    void start_item(const packed_keys<A>&, const forward_item&, forward_tiles<A>&) {}
    void tile(const packed_keys<A>& keys, const forward_item&, index_t kb, index_t m, forward_tiles<A>& tiles) {
      score_tile(tiles.q_of(m), keys, kb, m, tiles.d, tiles.s.data());
    }
  };
};

// The forward with float scores: q [B,N,H,Maps,d], k [B,M,G,Maps,d], v
// [B,M,G,dv] -> o [B,N,H,dv]; saved o2 (Maps = 2) and lse [B,H,Maps,N].
template <int Maps, class T>
void float_attention_forward(const policy::simd& p, cview<T, 5> q, cview<T, 5> k, cview<T, 4> v,
                             const detail::head_lambdas<accum_t<T>>& lambdas, bool causal, TensorView<T, 4> o,
                             TensorView<T, 4> o2, TensorView<accum_t<T>, 4> lse) {
  float_scores<accum_t<T>> scores;
  flash_attention_forward<Maps, T>(p, q, k, v, lambdas, causal, o, o2, lse, scores);
}

}  // namespace difftx::simd_detail
