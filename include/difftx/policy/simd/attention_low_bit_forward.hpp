// The fused attention forward for low-bit inference (docs/semantics.md): the
// loop of attention_forward.hpp with score tiles that are
//  - int8 Q·Kᵀ (qk = int8; formula in ops/attention.hpp, kernels in
//    attention_int8.hpp): each packed key block and each item's query tile
//    quantized to int8 with a step per vector, the tile from the VNNI kernel
//    or from the float product on the int8 values, times both steps;
//  - and/or quantized logits (logit_bits 4..8, ops/logit_quantization.hpp):
//    each row's logits rounded to a grid set by its largest |logit| over all
//    the keys it sees, so each item first sweeps its key blocks once for that
//    largest value, then again for the softmax.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "difftx/ops/int8.hpp"
#include "difftx/ops/logit_quantization.hpp"
#include "difftx/policy/simd/attention_forward.hpp"
#include "difftx/policy/simd/attention_int8.hpp"

namespace difftx::simd_detail {

// Score tiles for low-bit inference: int8 Q·Kᵀ where qk = int8, then each
// row's logits on its grid where logit_bits != 16. tile_kernel: the VNNI
// score tile, or nullptr for the float product on the int8 values.
template <int Maps, class A>
struct low_bit_scores {
  static constexpr index_t Bs = attention_block;
  index_t d, d4;
  int logit_bits;
  bool int8_qk, tiled;
  score_tile_fn tile_kernel;
  std::vector<int8_keys<A>> keys8;  // per pair (int8_qk)

  low_bit_scores(const forward_shape& shape, int bits, inference_dtype qk, score_tile_fn kernel)
      : d(shape.d), d4((shape.d + 3) / 4), logit_bits(bits), int8_qk(qk == inference_dtype::int8),
        tiled(false), tile_kernel(std::is_same_v<A, float> ? kernel : nullptr) {  // the VNNI tile computes in float
    tiled = int8_qk && tile_kernel != nullptr;
    keys8.resize(int8_qk ? static_cast<std::size_t>(shape.pairs) : 0);
    for (auto& pair_keys : keys8) pair_keys.reset(round_up(shape.M, Bs), Maps, d, tiled);
  }

  // Key block kb of a pair as int8 (its float tiles overwritten with the int8
  // values unless tiled).
  void key_block_packed(index_t pair, index_t kb, packed_keys<A>& keys) {
    if (int8_qk)
      for (index_t m = 0; m < Maps; ++m) keys8[static_cast<std::size_t>(pair)].quantize_block(kb, m, keys.kt_tile(kb, m, d));
  }

  // A thread's query steps, int8 query tile and the grids of the current item's rows.
  struct worker {
    const low_bit_scores& source;
    std::vector<A> q_steps;                    // [Maps][Bs] (int8_qk)
    aligned_vector<std::int8_t> q8;            // [Maps][Bs][4·d4] (tiled)
    std::vector<detail::logit_grid<A>> grids;  // [Maps][Bs], inactive unless quantizing
    std::vector<A> largest;                    // [Maps][Bs]: each row's largest |logit|

    explicit worker(const low_bit_scores& s)
        : source(s),
          q_steps(s.int8_qk ? static_cast<std::size_t>(Maps * Bs) : 0),
          q8(s.tiled ? static_cast<std::size_t>(Maps * Bs * 4 * s.d4) : 0),
          grids(static_cast<std::size_t>(Maps * Bs)),
          largest(static_cast<std::size_t>(Maps * Bs)) {}

    // The item's query tile as int8, then each row's grid from a first sweep
    // over the keys it sees.
    void start_item(const packed_keys<A>& keys, const forward_item& item, forward_tiles<A>& tiles) {
      if (source.int8_qk)
        for (index_t m = 0; m < Maps; ++m)
          quantize_query_tile(tiles.q_of(m), item.rows, source.d, source.d4, q_steps.data() + m * Bs,
                              source.tiled ? q8.data() + m * Bs * 4 * source.d4 : nullptr);
      if (source.logit_bits == logits_unquantized) return;
      std::fill(largest.begin(), largest.end(), A(0));
      for (index_t kb = 0; kb < item.key_blocks; ++kb)
        for (index_t m = 0; m < Maps; ++m) {
          product(keys, item, kb, m, tiles);
          for (index_t i = 0; i < item.rows; ++i) {
            A& row_largest = largest[static_cast<std::size_t>(m * Bs + i)];
            row_largest = std::max(row_largest, detail::largest_magnitude(tiles.s.data() + i * Bs, item.visible(i, kb)));
          }
        }
      for (std::size_t mi = 0; mi < grids.size(); ++mi) grids[mi] = detail::logit_grid<A>(largest[mi], source.logit_bits);
    }

    // S_m of key block kb into tiles.s, each row's visible logits on its grid.
    void tile(const packed_keys<A>& keys, const forward_item& item, index_t kb, index_t m, forward_tiles<A>& tiles) {
      product(keys, item, kb, m, tiles);
      for (index_t i = 0; i < item.rows; ++i)
        grids[static_cast<std::size_t>(m * Bs + i)].apply(tiles.s.data() + i * Bs, item.visible(i, kb));
    }

    // S_m of key block kb into tiles.s: the VNNI tile, or the float product
    // (on the int8 values where int8_qk, then times both steps).
    void product(const packed_keys<A>& keys, const forward_item& item, index_t kb, index_t m, forward_tiles<A>& tiles) {
      const int8_keys<A>* pair_keys8 = source.int8_qk ? &source.keys8[static_cast<std::size_t>(item.pair)] : nullptr;
      if constexpr (std::is_same_v<A, float>)
        if (source.tiled) {
          source.tile_kernel(source.d4, q8.data() + m * Bs * 4 * source.d4, pair_keys8->k8_of(kb, m),
                             pair_keys8->corr_of(kb, m), q_steps.data() + m * Bs, pair_keys8->steps_of(kb, m),
                             tiles.s.data());
          return;
        }
      score_tile(tiles.q_of(m), keys, kb, m, source.d, tiles.s.data());
      if (source.int8_qk) scale_scores(tiles.s.data(), q_steps.data() + m * Bs, pair_keys8->steps_of(kb, m));
    }
  };
};

// The forward with int8 scores and/or quantized logits (logit_bits 4..8 or
// 16, qk): attention_forward's operands and results.
template <int Maps, class T>
void low_bit_attention_forward(const policy::simd& p, cview<T, 5> q, cview<T, 5> k, cview<T, 4> v,
                               const detail::head_lambdas<accum_t<T>>& lambdas, bool causal, TensorView<T, 4> o,
                               TensorView<T, 4> o2, TensorView<accum_t<T>, 4> lse, int logit_bits, inference_dtype qk,
                               score_tile_fn tile_kernel) {
  low_bit_scores<Maps, accum_t<T>> scores(forward_shape(q, k, v, causal), logit_bits, qk, tile_kernel);
  flash_attention_forward<Maps, T>(p, q, k, v, lambdas, causal, o, o2, lse, scores);
}

}  // namespace difftx::simd_detail
