// A scalar model of the AMX instructions amx_tile_unit runs (amx_tiles.hpp),
// with the same interface, so the AMX kernels run on every CPU in the tests.
// It follows the instructions' definitions (Intel's intrinsics guide and
// SDM): rows past a tile's configured shape read as zero; tdpbusd adds each
// lane's four u8·s8 products into int32, wrapping; tdpbf16ps adds the two
// products of each bfloat16 pair into the float lane in turn, with denormal
// inputs read as zero and denormal results flushed to zero. A product whose
// tiles' shapes do not fit throws std::logic_error where the CPU would fault.
//
// The hardware may sum a tdpbf16ps lane in another order than this (the SDM
// describes pairs of partial sums), so float results are held to a tolerance
// against it, and integer results to their bits.
#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "difftx/policy/simd/amx_tiles.hpp"

namespace difftx::simd_detail {

class amx_tile_model {
 public:
  void configure(const amx_config& config) {
    config_ = config;
    for (auto& tile : tiles_) tile.fill(0);  // ldtilecfg zeroes every tile
  }
  void release() { config_ = amx_config{}; }
  template <int t>
  void zero() {
    tiles_[t].fill(0);
  }
  template <int t>
  void load(const void* first, index_t stride_bytes) {
    tiles_[t].fill(0);
    for (index_t r = 0; r < config_.rows[t]; ++r)
      std::memcpy(row(t, r), static_cast<const std::uint8_t*>(first) + r * stride_bytes, config_.bytes_per_row[t]);
  }
  template <int t>
  void store(void* first, index_t stride_bytes) {
    for (index_t r = 0; r < config_.rows[t]; ++r)
      std::memcpy(static_cast<std::uint8_t*>(first) + r * stride_bytes, row(t, r), config_.bytes_per_row[t]);
  }

  template <int c, int a, int b>
  void dot_u8s8() {
    const index_t groups = check_shapes(c, a, b);
    for (index_t m = 0; m < config_.rows[c]; ++m)
      for (index_t n = 0; n < config_.bytes_per_row[c] / 4; ++n) {
        std::uint32_t lane = load_lane<std::uint32_t>(c, m, n);
        for (index_t k = 0; k < groups; ++k)
          for (index_t j = 0; j < 4; ++j)
            lane += static_cast<std::uint32_t>(std::int32_t{row(a, m)[4 * k + j]} *
                                               std::int32_t{static_cast<std::int8_t>(row(b, k)[4 * n + j])});
        store_lane(c, m, n, lane);
      }
  }

  template <int c, int a, int b>
  void dot_bf16() {
    const index_t pairs = check_shapes(c, a, b);
    for (index_t m = 0; m < config_.rows[c]; ++m)
      for (index_t n = 0; n < config_.bytes_per_row[c] / 4; ++n) {
        float lane = load_lane<float>(c, m, n);
        for (index_t k = 0; k < pairs; ++k)
          for (index_t j = 0; j < 2; ++j)
            lane = flushed(lane + bf16_at(row(a, m), 2 * k + j) * bf16_at(row(b, k), 2 * n + j));
        store_lane(c, m, n, lane);
      }
  }

 private:
  amx_config config_{};
  std::array<std::array<std::uint8_t, 1024>, 8> tiles_{};

  std::uint8_t* row(int t, index_t r) { return tiles_[static_cast<std::size_t>(t)].data() + 64 * r; }

  // C += A·B needs A's rows = C's, A's 4-byte groups = B's rows, B's row = C's row.
  index_t check_shapes(int c, int a, int b) const {
    if (config_.palette != 1 || config_.rows[a] != config_.rows[c] ||
        config_.bytes_per_row[a] / 4 != config_.rows[b] || config_.bytes_per_row[b] != config_.bytes_per_row[c] ||
        config_.bytes_per_row[a] % 4 != 0 || config_.bytes_per_row[c] % 4 != 0)
      throw std::logic_error("amx_tile_model: a tile product on tiles whose shapes do not fit");
    return config_.rows[b];
  }
  template <class L>
  L load_lane(int t, index_t m, index_t n) {
    L lane;
    std::memcpy(&lane, row(t, m) + 4 * n, 4);
    return lane;
  }
  template <class L>
  void store_lane(int t, index_t m, index_t n, L lane) {
    std::memcpy(row(t, m) + 4 * n, &lane, 4);
  }
  static float flushed(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }
  static float bf16_at(const std::uint8_t* row_bytes, index_t e) {
    std::uint16_t bits;
    std::memcpy(&bits, row_bytes + 2 * e, 2);
    return flushed(std::bit_cast<float>(std::uint32_t{bits} << 16));
  }
};

}  // namespace difftx::simd_detail
