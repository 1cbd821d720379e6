// bfloat16 attention's score tiles on the CPU's bfloat16 products: the fused
// forward of attention_forward.hpp with S_m = (Q_m·K_mᵀ)/sqrt(d) from the
// bfloat16 values as they came in, in place of the float product on their
// float copies. A product of two bfloat16 values is exact in float, so the
// tile differs from the float one only in the order of its float sums (and in
// flushing denormals); P·V stays in float.
//
// Layouts (d2 = ceil(d/2) pairs of depth, zero past d), packed by
// pack_pair_rows and pack_pair_columns, which the backward's products
// (attention_bf16_backward.hpp) use too:
//   keys: per pair, key block and map, [d2][64 keys][2], from the packed
//         float tile kt (its values are bfloat16 values, so exact);
//   queries: the item's tile [64][2·d2] of each map, unscaled, from the input.
// Two kernels on them:
//  - vdpbf16ps (AVX512_BF16, pairs_score_tile): a broadcast pair of a query
//    row against 16 keys' pairs an instruction, 4 rows x 64 keys of
//    accumulators in registers, as int8's VNNI tile. It runs where
//    policy::simd's bfloat16 products take the instruction (bf16_products).
//  - AMX-BF16 (amx_bf16_score_tile, where policy::simd::amx_tiles asks):
//    tdpbf16ps on the same layouts (amx_product.hpp).
// The tests run both on every CPU through scalar models.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "difftx/policy/simd/amx_product.hpp"
#include "difftx/policy/simd/attention_forward.hpp"
#include "difftx/policy/simd/bf16_product.hpp"

namespace difftx::simd_detail {

// s [64][64] = scale · q2 [64][2·d2] · k2 [d2][64][2]ᵀ.
using bf16_score_tile_fn = void (*)(index_t d2, const Eigen::bfloat16* q2, const Eigen::bfloat16* k2, float scale,
                                    float* s);

template <class Tiles>
void amx_bf16_score_tile_on(Tiles& tiles, index_t d2, const Eigen::bfloat16* q2, const Eigen::bfloat16* k2,
                            float scale, float* s) {
  amx_tile_product_64<amx_product::bf16>(tiles, d2, q2, 4 * d2, k2, s);
  for (index_t e = 0; e < 64 * 64; ++e) s[e] *= scale;
}

#if DIFFTX_AMX
inline void amx_bf16_score_tile(index_t d2, const Eigen::bfloat16* q2, const Eigen::bfloat16* k2, float scale,
                                float* s) {
  amx_tile_unit tiles;
  amx_bf16_score_tile_on(tiles, d2, q2, k2, scale, s);
}
#endif

#if DIFFTX_BF16_PAIRS
[[gnu::target("avx512f,avx512bf16")]] inline void pairs_score_tile(index_t d2, const Eigen::bfloat16* q2,
                                                                  const Eigen::bfloat16* k2, float scale, float* s) {
  constexpr index_t keys = 64;
  for (index_t i = 0; i < 64; i += 4) {
    __m512 acc[4][4];
    for (auto& row : acc)
      for (auto& x : row) x = _mm512_setzero_ps();
    for (index_t p = 0; p < d2; ++p) {
      __m512bh kv[4];
      for (int v = 0; v < 4; ++v) kv[v] = (__m512bh)_mm512_loadu_si512(k2 + (p * keys + 16 * v) * 2);
      for (int r = 0; r < 4; ++r) {
        std::int32_t pair;
        std::memcpy(&pair, q2 + (i + r) * 2 * d2 + 2 * p, 4);
        const auto qv = (__m512bh)_mm512_set1_epi32(pair);
        for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], qv, kv[v]);
      }
    }
    for (int r = 0; r < 4; ++r)
      for (int v = 0; v < 4; ++v)
        _mm512_storeu_ps(s + (i + r) * keys + 16 * v, _mm512_mul_ps(acc[r][v], _mm512_set1_ps(scale)));
  }
}
#endif

// Rows of bfloat16 values (`rows` of them, `stride` apart from first, `width`
// each) as a bf16_score_tile_fn's left operand [Bs][2·ceil(width/2)]: as they
// lie, a zero after an odd width, zero rows past the last.
inline void pack_pair_rows(const Eigen::bfloat16* first, index_t stride, index_t rows, index_t width,
                           Eigen::bfloat16* out) {
  const index_t padded = round_up(width, 2);
  std::fill(out, out + attention_block * padded, Eigen::bfloat16(0.0f));
  for (index_t i = 0; i < rows; ++i) std::copy_n(first + i * stride, width, out + i * padded);
}

// A transposed float tile [width][Bs] holding bfloat16 values (packed keys or
// values) as a bf16_score_tile_fn's right operand [ceil(width/2)][Bs][2], zero
// past width; the values convert exactly.
inline void pack_pair_columns(const float* tile, index_t width, Eigen::bfloat16* out) {
  constexpr index_t Bs = attention_block;
  for (index_t c = 0; c < round_up(width, 2); ++c)
    for (index_t t = 0; t < Bs; ++t)
      out[(c / 2 * Bs + t) * 2 + c % 2] = Eigen::bfloat16(c < width ? tile[c * Bs + t] : 0.0f);
}

// The bfloat16 score tile this process runs: AMX's where `amx` asks for it
// and the CPU and OS grant it, else vdpbf16ps's where bfloat16 products take
// the instruction (`dot_instructions`: bf16_product_used() says so only where
// the CPU has it), else nullptr for the float product.
inline bf16_score_tile_fn bf16_score_tile([[maybe_unused]] bool amx, [[maybe_unused]] bool dot_instructions) noexcept {
#if DIFFTX_AMX
  if (amx && amx_runs(amx_product::bf16)) return amx_bf16_score_tile;
#endif
#if DIFFTX_BF16_PAIRS
  if (dot_instructions && bf16_pair_instructions()) return pairs_score_tile;
#endif
  return nullptr;
}

// What a bfloat16 score tile kernel is, as the tool and the tests name it:
// "amx bf16" (tdpbf16ps), "vdpbf16ps", or "float" for nullptr (the float
// product on float copies); "other" for a kernel passed in (a model).
inline const char* bf16_score_tile_name(bf16_score_tile_fn kernel) noexcept {
#if DIFFTX_AMX
  if (kernel == amx_bf16_score_tile) return "amx bf16";
#endif
#if DIFFTX_BF16_PAIRS
  if (kernel == pairs_score_tile) return "vdpbf16ps";
#endif
  return kernel ? "other" : "float";
}

// flash_attention_forward's score source for bfloat16 operands on a
// bf16_score_tile_fn.
template <int Maps>
struct bf16_tile_scores {
  static constexpr index_t Bs = attention_block;
  cview<Eigen::bfloat16, 5> q;
  index_t d, d2;
  float scale;
  bf16_score_tile_fn kernel;
  std::vector<aligned_vector<Eigen::bfloat16>> keys2;  // per pair: [blocks][Maps][d2][Bs][2]

  bf16_tile_scores(cview<Eigen::bfloat16, 5> queries, const forward_shape& shape, bf16_score_tile_fn tile_kernel)
      : q(queries), d(shape.d), d2((shape.d + 1) / 2), scale(1.0f / std::sqrt(static_cast<float>(shape.d))),
        kernel(tile_kernel), keys2(static_cast<std::size_t>(shape.pairs)) {
    for (auto& pair_keys : keys2) pair_keys.resize(static_cast<std::size_t>(round_up(shape.M, Bs) * Maps * 2 * d2));
  }
  const Eigen::bfloat16* key_tile(index_t pair, index_t kb, index_t m) const {
    return keys2[static_cast<std::size_t>(pair)].data() + key_offset(kb, m);
  }
  index_t key_offset(index_t kb, index_t m) const { return (kb * Maps + m) * 2 * d2 * Bs; }

  // Key block kb of a pair, from its float tiles kt [d][Bs], into pairs of depth.
  void key_block_packed(index_t pair, index_t kb, packed_keys<float>& keys) {
    for (index_t m = 0; m < Maps; ++m)
      pack_pair_columns(keys.kt_tile(kb, m, d), d, keys2[static_cast<std::size_t>(pair)].data() + key_offset(kb, m));
  }

  struct worker {
    const bf16_tile_scores& source;
    aligned_vector<Eigen::bfloat16> q2;  // [Maps][Bs][2·d2]: the item's queries, unscaled

    explicit worker(const bf16_tile_scores& s) : source(s), q2(static_cast<std::size_t>(Maps * Bs * 2 * s.d2)) {}

    void start_item(const packed_keys<float>&, const forward_item& item, forward_tiles<float>&) {
      const index_t H = source.q.extent(2), d = source.d;
      for (index_t m = 0; m < Maps; ++m)
        pack_pair_rows(source.q.data() + (((item.b * item.N + item.i0) * H + item.h) * Maps + m) * d, H * Maps * d,
                       item.rows, d, q2.data() + m * Bs * 2 * source.d2);
    }
    void tile(const packed_keys<float>&, const forward_item& item, index_t kb, index_t m, forward_tiles<float>& tiles) {
      source.kernel(source.d2, q2.data() + m * Bs * 2 * source.d2, source.key_tile(item.pair, kb, m), source.scale,
                    tiles.s.data());
    }
  };
};

// The bfloat16 forward with score tiles from `kernel`: float_attention_forward's
// operands and results.
template <int Maps>
void bf16_tile_attention_forward(const policy::simd& p, cview<Eigen::bfloat16, 5> q, cview<Eigen::bfloat16, 5> k,
                                 cview<Eigen::bfloat16, 4> v, const detail::head_lambdas<float>& lambdas, bool causal,
                                 TensorView<Eigen::bfloat16, 4> o, TensorView<Eigen::bfloat16, 4> o2,
                                 TensorView<float, 4> lse, bf16_score_tile_fn kernel) {
  bf16_tile_scores<Maps> scores(q, forward_shape(q, k, v, causal), kernel);
  flash_attention_forward<Maps, Eigen::bfloat16>(p, q, k, v, lambdas, causal, o, o2, lse, scores);
}

}  // namespace difftx::simd_detail
