// Decoding's bfloat16 products for several rows of x at once (several prompts
// decoded together: gemv_max_rows < M ≤ amx_gemv_max_rows) on AMX's
// tdpbf16ps, w streamed once from where it lies:
//
//   y_k[M, N_k] = x[M, K] · w_k[N_k, K]ᵀ, bfloat16 in and out, float inside.
//
// A slice of 16 rows of w, 32 values of depth at a time, is the A tile as it
// lies (16 rows of 64 bytes, K·2 bytes apart); x's rows are the B tile, a
// column each, packed once per call as pair words; the 16 x M float
// accumulator tile holds row t of the slice against row i of x. A line of w
// costs one 64-byte tile row however many rows x has, where vdpbf16ps costs
// an instruction per line and row of x and falls behind the memory from a
// few rows on (without tiles, such products are oneDNN's matrix products;
// docs/benchmarks.md, "Generation", has a batch's speed both ways). Written
// over a tile unit (amx_tiles.hpp), so the tests run it on the tile model on
// every CPU.
#pragma once

#include <span>
#include <vector>

#include "difftx/policy/simd/amx_tiles.hpp"
#include "difftx/policy/simd/gemm_bf16_pairs.hpp"
#include "difftx/policy/simd/gemm_blocks.hpp"
#include "difftx/policy/simd/stream_prefetch.hpp"

namespace difftx::simd_detail {

// A tile's 16 lanes: a column of the accumulator per row of x.
constexpr index_t amx_gemv_max_rows = 16;
// w's rows a slice takes: an A tile's 16 rows.
constexpr index_t amx_gemv_slice = 16;

// Whether the AMX product takes a bfloat16 product of M rows and depth K
// under p: AMX asked for and granted, more rows than the streamed kernels
// take one at a time, and whole runs of 32 values of depth (a tile row).
inline bool amx_gemv_takes(const policy::simd& p, index_t M, index_t K) noexcept {
  return p.amx_tiles && M > gemv_max_rows && M <= amx_gemv_max_rows && K % 32 == 0 && amx_runs(amx_product::bf16);
}

// x's M rows (M ≤ 16, K a multiple of 32) as B tiles: for each run of 32
// values of depth a 16 x M block of pair words, word (q, i) = x_i[2q] |
// x_i[2q + 1] << 16 of the run. M columns, not a full tile's 16: the tile
// loads are what a run waits on, so half a tile of padding for 8 rows of x
// read in every run cost more than the whole product's arithmetic.
inline std::vector<pair_word> amx_gemv_operand(const Eigen::bfloat16* x, index_t M, index_t K) {
  std::vector<pair_word> blocks(static_cast<std::size_t>(K / 32 * 16 * M));
  for (index_t run = 0; run < K / 32; ++run)
    for (index_t q = 0; q < 16; ++q)
      for (index_t i = 0; i < M; ++i) {
        const Eigen::bfloat16* pair = x + i * K + run * 32 + 2 * q;
        blocks[static_cast<std::size_t>((run * 16 + q) * M + i)] = bf16_bits(pair[0]) | bf16_bits(pair[1]) << 16;
      }
  return blocks;
}

// A slice of `rows` rows of depth K is read a column of 64 bytes of every
// row at a time, so its lines are asked for in that order
// (stream_prefetch.hpp): `bytes` of that order past run r is column (r + d)
// mod K/32 of the slice (r + d) div K/32 ahead, d = bytes / (rows·64), in
// the slices that follow in memory (which this thread takes next). The
// distance from a line of run r to that row's line there, in bytes; 0 for
// none. Distances along each row alone ran out at the row's end, so every
// slice began with its lines not yet asked for.
constexpr index_t amx_slice_bytes_ahead(index_t run, index_t bytes, index_t rows, index_t K) noexcept {
  if (bytes == 0) return 0;
  const index_t runs = K / 32, to = run + bytes / (rows * 64);
  return (to / runs * rows * K + (to % runs - run) * 32) * index_t{sizeof(Eigen::bfloat16)};
}

// c[t][i] (16 floats a row) = w's row t · x's row i for the slice's rows t <
// rows ≤ 16 of depth K (row t at w + t·K) and x's rows i < M (the operand).
template <class Tiles>
void amx_slice_dots(Tiles& tiles, const Eigen::bfloat16* w, index_t rows, index_t K, index_t M,
                    const pair_word* operand, float* c) {
  amx_config config;
  config.shape(0, rows, 4 * M);  // accumulators: a row of w by M rows of x
  config.shape(1, rows, 64);     // A: 32 values of w's rows
  config.shape(2, 16, 4 * M);    // B: 16 pairs of depth by M rows of x
  tiles.configure(config);
  const index_t runs = K / 32, row_bytes = K * index_t{sizeof(Eigen::bfloat16)};
  const stream_distance ahead = stream_ahead(rows * 64);  // rows·64 bytes a run
  tiles.template zero<0>();
  for (index_t run = 0; run < runs; ++run) {
    const stream_distance offsets{amx_slice_bytes_ahead(run, ahead.near, rows, K),
                                  amx_slice_bytes_ahead(run, ahead.far, rows, K)};
    for (index_t t = 0; t < rows; ++t) prefetch_ahead(w + t * K + run * 32, offsets);
    tiles.template load<1>(w + run * 32, row_bytes);
    tiles.template load<2>(operand + run * 16 * M, 4 * M);
    tiles.template dot_bf16<0, 1, 2>();
  }
  tiles.template store<0>(c, 64);
  tiles.release();
}

// y_k = x · w_kᵀ for each part, x [M, K] with M ≤ 16 and K a multiple of 32
// (amx_gemv_takes), the parts' slices shared out as decoding's are
// (for_each_gemv_slice).
template <class Tiles>
void amx_bf16_gemv(const policy::simd& p, index_t M, index_t K, const Eigen::bfloat16* x,
                   std::span<const gemv_part<Eigen::bfloat16>> parts) {
  const std::vector<pair_word> operand = amx_gemv_operand(x, M, K);
  for_each_gemv_slice(p, 1, parts, amx_gemv_slice,
                      [&](const gemv_part<Eigen::bfloat16>& part, index_t, index_t j, index_t n) {
                        Tiles tiles;
                        alignas(64) float c[amx_gemv_slice][16] = {};
                        amx_slice_dots(tiles, part.w + j * K, n, K, M, operand.data(), &c[0][0]);
                        // Rounded in one conversion, then y_i's n values are column i:
                        // a conversion per row of x cost a slice as much as 2 KB of w.
                        alignas(64) Eigen::bfloat16 rounded[amx_gemv_slice][16];
                        from_accum(&c[0][0], n * 16, &rounded[0][0]);
                        for (index_t i = 0; i < M; ++i)
                          for (index_t t = 0; t < n; ++t) part.y[i * part.rows + j + t] = rounded[t][i];
                      });
}

}  // namespace difftx::simd_detail
