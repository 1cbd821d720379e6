// int8 Q·Kᵀ inside the fused forward (policy/simd/attention.hpp; the formula
// in ops/attention.hpp, qk = int8): every key vector and every scaled query
// vector as int8 with its step (ops/int8.hpp), the score tile
// S[i, t] = A(Σ_c q8[i, c] · k8[t, c]) · s_q[i] · s_k[t], then the same online
// softmax and float P·V.
//
// Two ways to the same bits:
//  - AVX512_VNNI (vnni_score_tile): keys packed per block as [d/4][64 keys][4
//    bytes], so one vpdpbusd adds 4 depths of 16 keys for a broadcast 4 bytes
//    of a query row (offset by 128 to unsigned; corrected by 128·Σ_c k8[t, c]):
//    16 instructions per 64 keys x 4 depths, against 16 float FMAs per 16
//    depths. A 4-row x 64-key block keeps 16 accumulators in registers.
//  - AMX-INT8 (amx_score_tile, where policy::simd::amx_tiles asks for it):
//    tdpbusd on the same two layouts (q8's rows are A's, k8's groups of 4
//    bytes B's), 16 x 16 x 64 bytes an instruction (amx_product.hpp).
//  - every other CPU: the int8 values written back as floats, and the float
//    tile product sums them exactly (|sum| <= 127²·d < 2^24 for d <= 1040),
//    then the two steps. As fast as the float kernel, never slower: AVX2's
//    byte products (vpmaddubsw) do no more multiply-adds per instruction than
//    its float FMAs here.
// The tests run the VNNI layout on every CPU through a scalar model of the
// instruction (a score_tile_fn), and the AMX kernel on the tile model
// (amx_tile_model.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "difftx/ops/int8.hpp"
#include "difftx/policy/simd/amx_product.hpp"
#include "difftx/policy/simd/common.hpp"
#include "difftx/policy/simd/gemm_int8.hpp"

namespace difftx::simd_detail {

// The VNNI score tile: s[i][t] for a 64 x 64 tile, i < 64 query rows (q8 [64][4·d4],
// offset by 128), t < 64 keys (k8 [d4][64][4], corr[t] = 128·Σ_c k8[t][c]).
using score_tile_fn = void (*)(index_t d4, const std::int8_t* q8, const std::int8_t* k8, const std::int32_t* corr,
                               const float* q_steps, const float* k_steps, float* s);

#if DIFFTX_INT8_DOTS
[[gnu::target("avx512f,avx512bw,avx512vnni")]] inline void vnni_score_tile(index_t d4, const std::int8_t* q8,
                                                                           const std::int8_t* k8,
                                                                           const std::int32_t* corr,
                                                                           const float* q_steps, const float* k_steps,
                                                                           float* s) {
  constexpr index_t keys = 64;
  for (index_t i = 0; i < 64; i += 4) {
    __m512i acc[4][4];
    for (auto& row : acc)
      for (auto& x : row) x = _mm512_setzero_si512();
    for (index_t p = 0; p < d4; ++p) {
      __m512i kv[4];
      for (int v = 0; v < 4; ++v) kv[v] = _mm512_loadu_si512(k8 + (p * keys + 16 * v) * 4);
      for (int r = 0; r < 4; ++r) {
        std::int32_t word;
        std::memcpy(&word, q8 + (i + r) * 4 * d4 + 4 * p, 4);
        const __m512i qv = _mm512_set1_epi32(word);
        for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], qv, kv[v]);
      }
    }
    for (int r = 0; r < 4; ++r) {
      const __m512 qs = _mm512_set1_ps(q_steps[i + r]);
      for (int v = 0; v < 4; ++v) {
        const __m512i exact = _mm512_sub_epi32(acc[r][v], _mm512_loadu_si512(corr + 16 * v));
        const __m512 scores =  // (zero-masked: GCC 12 warns on the plain form's undefined register)
            _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_cvtepi32_ps(0xffff, exact), qs), _mm512_loadu_ps(k_steps + 16 * v));
        _mm512_storeu_ps(s + (i + r) * keys + 16 * v, scores);
      }
    }
  }
}
#endif

// The AMX score tile on a tile unit (amx_tile_unit, or the model in the
// tests): the exact sums of vnni_score_tile's, so the same bits.
template <class Tiles>
void amx_score_tile_on(Tiles& tiles, index_t d4, const std::int8_t* q8, const std::int8_t* k8,
                       const std::int32_t* corr, const float* q_steps, const float* k_steps, float* s) {
  alignas(64) std::int32_t sums[64 * 64];
  amx_tile_product_64<amx_product::u8s8>(tiles, d4, q8, 4 * d4, k8, sums);
  for (index_t i = 0; i < 64; ++i)
    for (index_t t = 0; t < 64; ++t) {
      const auto exact = static_cast<std::int32_t>(static_cast<std::uint32_t>(sums[i * 64 + t]) -
                                                   static_cast<std::uint32_t>(corr[t]));  // wraps as vpsubd
      s[i * 64 + t] = float(exact) * q_steps[i] * k_steps[t];
    }
}

#if DIFFTX_AMX
inline void amx_score_tile(index_t d4, const std::int8_t* q8, const std::int8_t* k8, const std::int32_t* corr,
                           const float* q_steps, const float* k_steps, float* s) {
  amx_tile_unit tiles;
  amx_score_tile_on(tiles, d4, q8, k8, corr, q_steps, k_steps, s);
}
#endif

// The score tile kernel this CPU runs for accumulation type A (AMX where
// `amx` asks for it and the CPU and OS grant it, else VNNI), or nullptr for
// the float product on the int8 values.
template <class A>
score_tile_fn int8_score_tile([[maybe_unused]] bool amx) noexcept {
  if constexpr (std::is_same_v<A, float>) {
#if DIFFTX_AMX
    if (amx && amx_runs(amx_product::u8s8)) return amx_score_tile;
#endif
#if DIFFTX_INT8_DOTS
    if (int8_dot_kernel() == int8_kernel::avx512_vnni) return vnni_score_tile;
#endif
  }
  return nullptr;
}

// What an int8 score tile kernel is, as the tool and the tests name it:
// "amx int8" (tdpbusd), "avx512vnni" (vpdpbusd), or "float" for nullptr (the
// float product on the int8 values); "other" for a kernel passed in (a model).
inline const char* int8_score_tile_name(score_tile_fn kernel) noexcept {
#if DIFFTX_AMX
  if (kernel == amx_score_tile) return "amx int8";
#endif
#if DIFFTX_INT8_DOTS
  if (kernel == vnni_score_tile) return "avx512vnni";
#endif
  return kernel ? "other" : "float";
}

// One (batch row, group)'s keys as int8, per key block and map: steps [Bs],
// and with a tile kernel the layout k8 [d4][Bs][4] and corr; without one the
// int8 values go back into the float tile they came from.
template <class A>
struct int8_keys {
  static constexpr index_t Bs = 64;
  index_t maps = 1, d = 0, d4 = 0;
  bool tiled = false;
  std::vector<A> steps;              // [blocks][Maps][Bs]
  aligned_vector<std::int8_t> k8;    // [blocks][Maps][d4][Bs][4] (tiled)
  std::vector<std::int32_t> corr;    // [blocks][Maps][Bs]        (tiled)

  void reset(index_t n_pad, index_t Maps, index_t depth, bool with_tiles) {
    maps = Maps;
    d = depth;
    d4 = (depth + 3) / 4;
    tiled = with_tiles;
    steps.resize(static_cast<std::size_t>(Maps * n_pad));
    k8.resize(tiled ? static_cast<std::size_t>(Maps * n_pad * 4 * d4) : 0);
    corr.resize(tiled ? static_cast<std::size_t>(Maps * n_pad) : 0);
  }
  index_t tile(index_t kb, index_t m) const { return kb * maps + m; }
  const A* steps_of(index_t kb, index_t m) const { return steps.data() + tile(kb, m) * Bs; }
  const std::int8_t* k8_of(index_t kb, index_t m) const { return k8.data() + tile(kb, m) * Bs * 4 * d4; }
  const std::int32_t* corr_of(index_t kb, index_t m) const { return corr.data() + tile(kb, m) * Bs; }

  // Key block kb, map m, from its float tile kt [d][Bs] (keys as columns; zero
  // past the last key): every key quantized; the tile overwritten with the
  // int8 values unless tiled.
  void quantize_block(index_t kb, index_t m, A* kt) {
    std::vector<A> key(static_cast<std::size_t>(d));
    std::vector<std::int8_t> key8(static_cast<std::size_t>(4 * d4), 0);
    for (index_t t = 0; t < Bs; ++t) {
      for (index_t c = 0; c < d; ++c) key[static_cast<std::size_t>(c)] = kt[c * Bs + t];
      steps[static_cast<std::size_t>(tile(kb, m) * Bs + t)] = detail::quantize_int8(key.data(), d, key8.data());
      if (tiled) {
        std::int8_t* out = k8.data() + tile(kb, m) * Bs * 4 * d4;
        std::int32_t sum = 0;
        for (index_t c = 0; c < 4 * d4; ++c) {
          out[(c / 4 * Bs + t) * 4 + c % 4] = key8[static_cast<std::size_t>(c)];
          sum += key8[static_cast<std::size_t>(c)];
        }
        corr[static_cast<std::size_t>(tile(kb, m) * Bs + t)] = 128 * sum;
      } else {
        for (index_t c = 0; c < d; ++c) kt[c * Bs + t] = A(key8[static_cast<std::size_t>(c)]);
      }
    }
  }
};

// A query tile's rows [0, rows) of q_tile [Bs][d] (scaled by 1/sqrt(d)) as int8:
// steps[i]; with tiles, q8 [Bs][4·d4] offset by 128 (rows past `rows` zero, i.e.
// 128), else the int8 values written back into q_tile.
template <class A>
void quantize_query_tile(A* q_tile, index_t rows, index_t d, index_t d4, A* steps, std::int8_t* q8) {
  std::vector<std::int8_t> row8(static_cast<std::size_t>(4 * d4), 0);
  for (index_t i = 0; i < 64; ++i) {
    if (i < rows) {
      steps[i] = detail::quantize_int8(q_tile + i * d, d, row8.data());
    } else {
      steps[i] = A(0);
      std::fill(row8.begin(), row8.end(), std::int8_t{0});
    }
    if (q8)
      for (index_t c = 0; c < 4 * d4; ++c) q8[i * 4 * d4 + c] = static_cast<std::int8_t>(row8[static_cast<std::size_t>(c)] ^ std::int8_t(-128));
    else
      for (index_t c = 0; c < d; ++c) q_tile[i * d + c] = A(row8[static_cast<std::size_t>(c)]);
  }
}

// s[i][t] = s[i][t] · q_steps[i] · k_steps[t] on a 64 x 64 tile (the exact
// integer sums the float product gave).
template <class A>
void scale_scores(A* s, const A* q_steps, const A* k_steps) {
  for (index_t i = 0; i < 64; ++i)
    for (index_t t = 0; t < 64; ++t) s[i * 64 + t] = s[i * 64 + t] * q_steps[i] * k_steps[t];
}

}  // namespace difftx::simd_detail
