// The attention's AMX score tiles on the tile model (amx_tile_model.hpp), as
// the kernel pointers the fused forward takes: for the tests that run them on
// every CPU (score_tiles_test.cpp, low_bit_test.cpp).
#pragma once

#include <cstdint>

#include <difftx/policy/simd.hpp>
#include <difftx/policy/simd/amx_tile_model.hpp>

namespace test_support {

// tdpbusd's int8 score tile, in the VNNI tile's layouts.
inline void modelled_amx_int8_score_tile(difftx::index_t d4, const std::int8_t* q8, const std::int8_t* k8,
                                         const std::int32_t* corr, const float* q_steps, const float* k_steps,
                                         float* s) {
  difftx::simd_detail::amx_tile_model tiles;
  difftx::simd_detail::amx_score_tile_on(tiles, d4, q8, k8, corr, q_steps, k_steps, s);
}

// tdpbf16ps's bfloat16 score tile.
inline void modelled_amx_bf16_score_tile(difftx::index_t d2, const Eigen::bfloat16* q2, const Eigen::bfloat16* k2,
                                         float scale, float* s) {
  difftx::simd_detail::amx_tile_model tiles;
  difftx::simd_detail::amx_bf16_score_tile_on(tiles, d2, q2, k2, scale, s);
}

}  // namespace test_support
