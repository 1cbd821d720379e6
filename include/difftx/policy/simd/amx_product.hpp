// The 64 x 64 tile product on AMX that the attention's score tiles are made
// of: C[i][t] = Σ_g A_i,g · B_g,t for i, t < 64 over `groups` 4-byte groups
// of depth (4 int8 or 2 bfloat16 values each), with
//   a: 64 rows of groups·4 bytes, a_stride bytes apart (a query tile);
//   b: [groups][64][4 bytes], the keys' layout for vpdpbusd and tdpbusd;
//   c: [64][64] int32 (u8s8) or float (bf16), overwritten.
// Four 16 x 16 accumulator tiles cover a 32 x 32 quarter of C, fed by two A
// tiles (16 rows) and two B tiles (16 keys) per step of depth; the depth step
// is the largest divisor of `groups` up to 16 (64 bytes, a tile's row), so
// every step has one shape and one tile configuration serves the call.
#pragma once

#include <algorithm>
#include <cstdint>

#include "difftx/policy/simd/amx_tiles.hpp"

namespace difftx::simd_detail {

// The groups a step of depth takes: the largest divisor of groups up to 16.
inline index_t amx_depth_step(index_t groups) {
  index_t step = std::min<index_t>(groups, 16);
  while (groups % step != 0) --step;
  return step;
}

template <amx_product Product, class Tiles>
void amx_tile_product_64(Tiles& tiles, index_t groups, const void* a, index_t a_stride, const void* b, void* c) {
  const index_t step = amx_depth_step(groups);
  amx_config config;
  for (int t = 0; t < 4; ++t) config.shape(t, 16, 64);      // accumulators: 16 rows x 16 lanes
  for (int t = 4; t < 6; ++t) config.shape(t, 16, 4 * step);  // A: 16 rows x step groups
  for (int t = 6; t < 8; ++t) config.shape(t, step, 64);     // B: step groups x 16 keys
  tiles.configure(config);
  const auto* a_bytes = static_cast<const std::uint8_t*>(a);
  const auto* b_bytes = static_cast<const std::uint8_t*>(b);
  auto* c_bytes = static_cast<std::uint8_t*>(c);
  constexpr index_t c_stride = 64 * 4, b_stride = 64 * 4;
  for (index_t i0 = 0; i0 < 64; i0 += 32)
    for (index_t t0 = 0; t0 < 64; t0 += 32) {
      tiles.template zero<0>();
      tiles.template zero<1>();
      tiles.template zero<2>();
      tiles.template zero<3>();
      for (index_t g0 = 0; g0 < groups; g0 += step) {
        tiles.template load<4>(a_bytes + i0 * a_stride + 4 * g0, a_stride);
        tiles.template load<5>(a_bytes + (i0 + 16) * a_stride + 4 * g0, a_stride);
        tiles.template load<6>(b_bytes + g0 * b_stride + 4 * t0, b_stride);
        tiles.template load<7>(b_bytes + g0 * b_stride + 4 * (t0 + 16), b_stride);
        if constexpr (Product == amx_product::u8s8) {
          tiles.template dot_u8s8<0, 4, 6>();
          tiles.template dot_u8s8<1, 4, 7>();
          tiles.template dot_u8s8<2, 5, 6>();
          tiles.template dot_u8s8<3, 5, 7>();
        } else {
          tiles.template dot_bf16<0, 4, 6>();
          tiles.template dot_bf16<1, 4, 7>();
          tiles.template dot_bf16<2, 5, 6>();
          tiles.template dot_bf16<3, 5, 7>();
        }
      }
      tiles.template store<0>(c_bytes + i0 * c_stride + 4 * t0, c_stride);
      tiles.template store<1>(c_bytes + i0 * c_stride + 4 * (t0 + 16), c_stride);
      tiles.template store<2>(c_bytes + (i0 + 16) * c_stride + 4 * t0, c_stride);
      tiles.template store<3>(c_bytes + (i0 + 16) * c_stride + 4 * (t0 + 16), c_stride);
    }
  tiles.release();
}

}  // namespace difftx::simd_detail
