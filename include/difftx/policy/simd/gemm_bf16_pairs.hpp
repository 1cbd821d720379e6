// bfloat16 matrix products on the CPU's bfloat16 dot-product instruction
// (vdpbf16ps, AVX512_BF16: Cooper Lake, Sapphire Rapids and later, Zen 4 and
// later), with float accumulation and no conversion of the operands at all.
//
//   C[M, N] (=|+=) A[M, K] · B[K, N], bfloat16 in and out, float inside.
//
// vdpbf16ps multiplies pairs: lane l of the result gains x[2l]·y[2l] +
// x[2l+1]·y[2l+1], each product exact in float. So both operands are packed
// as 32-bit pair words along K (the depth), word (q, w) = X(w, 2q) |
// X(w, 2q + 1) << 16, in micro-panels [pairs][width]: A's of MR rows (one
// word broadcast per row), B's of NR columns (NR / 16 vectors). The
// micro-kernel keeps MR x NR of C in registers and issues MR · NR / 16
// instructions of 32 multiply-adds per pair of depths.
//
// Blocking (docs/design.md): B's column block is packed once, by all threads
// together, and shared; each thread then packs a block of A's rows and runs
// the micro-kernel over it. Packing reads any of the three layouts (x·wᵀ,
// dy·w, dyᵀ·x), so the forward and both backward products of a bfloat16
// Linear run on it. Chosen at run time (bf16_product.hpp).
//
// Results differ from the converting product only in the order of float
// additions (and in flushing subnormal inputs to zero, as the instruction
// does): within a few float roundings, far below bfloat16's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "difftx/policy/simd/bf16_product.hpp"
#include "difftx/policy/simd/common.hpp"
#include "difftx/policy/simd/gemm_blocks.hpp"
#include "difftx/policy/simd/stream_prefetch.hpp"

namespace difftx::simd_detail {

using pair_word = std::uint32_t;

inline pair_word bf16_bits(Eigen::bfloat16 x) noexcept { return Eigen::numext::bit_cast<std::uint16_t>(x); }

// Blocking. A micro-kernel call covers at most pair_slice pairs of depths,
// so that the slice of B's micro-panel it sweeps again for every MR rows of A
// (NR words a pair: 16 KB at NR = 32) stays in L1. Each thread packs A in
// blocks of up to pair_block_rows rows (a slice of them is 48 KB, in L2).
// B's shared column block holds at most pair_b_words words (4 MiB, read from
// L3: at the Linear shapes of the benchmarks all of B, so that A is packed
// once), and C's float block at most pair_c_floats (512 KiB, mostly in L2).
constexpr index_t pair_slice = 128, pair_block_rows = 96;
constexpr index_t pair_b_words = index_t{1} << 20, pair_c_floats = index_t{1} << 17;

// C = (C +) A · B, Kernel's packing and micro-kernel (avx512_bf16_pairs; the
// tests also run the blocking with a scalar model of the instruction).
template <a_storage AS, b_storage BS, class Kernel>
void bf16_pair_gemm(const policy::simd& p, index_t M, index_t N, index_t K, const Eigen::bfloat16* a, index_t lda,
                    const Eigen::bfloat16* b, index_t ldb, Eigen::bfloat16* c, index_t ldc, bool accumulate) {
  static_assert(!(AS == a_storage::columns && BS == b_storage::columns), "no product uses Aᵀ · Bᵀ");
  constexpr index_t MR = Kernel::rows, NR = Kernel::cols;
  if (M == 0 || N == 0) return;
  auto round_up = [](index_t x, index_t to) { return (x + to - 1) / to * to; };
  const index_t pairs = (K + 1) / 2;
  // B's column blocks: as few as the budget allows, of equal width in whole panels.
  const index_t panels = (N + NR - 1) / NR;
  const index_t max_block_panels = std::max<index_t>(
      1, std::min(pair_b_words / (std::max<index_t>(pairs, 1) * NR), pair_c_floats / (pair_block_rows * NR)));
  const index_t col_blocks = (panels + max_block_panels - 1) / max_block_panels;
  const index_t nc = (panels + col_blocks - 1) / col_blocks * NR;
  // A's row blocks: at least one per thread.
  const int threads = static_cast<int>(std::min<index_t>(thread_count(p), (M + MR - 1) / MR));
  const index_t mc = round_up(std::min(pair_block_rows, (M + threads - 1) / threads), MR);

  auto& shared = gemm_scratch<pair_word>::local();
  shared.b.resize(static_cast<std::size_t>(pairs * nc));
  pair_word* const bp = shared.b.data();
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    auto& own = gemm_scratch<pair_word>::local();
    own.a.resize(static_cast<std::size_t>(mc * pairs));
    auto& own_c = gemm_scratch<float>::local();
    own_c.c.resize(static_cast<std::size_t>(mc * nc));
    pair_word* const ap = own.a.data();
    float* const cb = own_c.c.data();
    for (index_t j0 = 0; j0 < N; j0 += nc) {
      const index_t n = std::min(nc, N - j0), n_pad = round_up(n, NR);
#pragma omp for schedule(static)
      for (index_t j = 0; j < n_pad; j += NR)
        Kernel::template pack<BS == b_storage::columns, NR>(BS == b_storage::columns ? b + (j0 + j) * ldb : b + j0 + j,
                                                            ldb, K, std::min(NR, n - j), bp + j * pairs);
      // (the implicit barrier: the block of B is whole before any thread reads it)
#pragma omp for schedule(dynamic, 1)
      for (index_t i0 = 0; i0 < M; i0 += mc) {
        const index_t m = std::min(mc, M - i0), m_pad = round_up(m, MR);
        Kernel::template pack<AS == a_storage::rows, MR>(AS == a_storage::rows ? a + i0 * lda : a + i0, lda, K, m, ap);
        for (index_t i = 0; i < m_pad; ++i) {  // padded rows and columns too: the kernel updates them
          std::fill(cb + i * n_pad, cb + (i + 1) * n_pad, 0.0f);
          if (accumulate && i < m) to_accum(c + (i0 + i) * ldc + j0, n, cb + i * n_pad);
        }
        for (index_t q0 = 0; q0 < pairs; q0 += pair_slice) {
          const index_t q = std::min(pair_slice, pairs - q0);
          for (index_t j = 0; j < n_pad; j += NR)
            for (index_t i = 0; i < m_pad; i += MR)
              Kernel::add_product(q, ap + i * pairs + q0 * MR, bp + j * pairs + q0 * NR, cb + i * n_pad + j, n_pad);
        }
        for (index_t i = 0; i < m; ++i) from_accum(cb + i * n_pad, n, c + (i0 + i) * ldc + j0);
      }
      // (and here: no thread repacks B while another still reads it)
    }
  }
}

// Decoding's y_k = x[M, K] · w_k[N_k, K]ᵀ for each part (M ≤ gemv_max_rows) on Kernel's
// row_dots: rows stored along the depth are pair words as they lie, so
// nothing is packed or converted and w streams once at the instruction's
// rate (a conversion costs as much as the memory on two cores).
template <class Kernel>
void bf16_pair_gemv(const policy::simd& p, index_t M, index_t K, const Eigen::bfloat16* x,
                    std::span<const gemv_part<Eigen::bfloat16>> parts) {
  const bool side_by_side = p.streaming_used() == policy::stream_order::rows_side_by_side;
  for_each_gemv_slice(p, M, parts, Kernel::dot_rows,
                      [&](const gemv_part<Eigen::bfloat16>& part, index_t i, index_t j, index_t n) {
                        float out[Kernel::dot_rows];  // the slice's sums, converted into y on the thread that made them
                        Kernel::row_dots(x + i * K, part.w + j * K, K, n, K, side_by_side, out);
                        from_accum(out, n, part.y + i * part.rows + j);
                      });
}

#if DIFFTX_BF16_PAIRS
// The micro-kernel and packers on AVX-512: C[MR, NR] += A's micro-panel ·
// B's, MR · NV of the 32 vector registers holding C, NV the step of B's
// panel, A's word broadcast from memory by the instruction itself.
template <int MR, int NV>
struct avx512_bf16_pairs_of {
  static constexpr index_t rows = MR, cols = 16 * NV;

  [[gnu::target("avx512f,avx512bf16")]] static void add_product(index_t pairs, const pair_word* a,
                                                                 const pair_word* b, float* c, index_t ldc) noexcept {
    __m512 acc[MR][NV];
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_loadu_ps(c + r * ldc + v * 16);
    for (index_t q = 0; q < pairs; ++q) {
      __m512bh bv[NV];
      for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(b + q * cols + v * 16);
      for (int r = 0; r < MR; ++r) {
        const auto av = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[q * MR + r]));
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
      }
    }
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + r * ldc + v * 16, acc[r][v]);
  }

  // out[t] = Σ_c x[c] · R(t, c) for rows ≤ dot_rows rows of depth k (row t at
  // first + t·stride), two rows at a time (pair_row_dots) if side_by_side,
  // else one at a time. Rows stored one after the other stay one sequential
  // stream, read two rows' halves apart or front to back.
  static constexpr index_t dot_rows = 16;
  [[gnu::target("avx512f,avx512bw,avx512bf16")]] static void row_dots(const Eigen::bfloat16* x,
                                                                      const Eigen::bfloat16* first, index_t stride,
                                                                      index_t rows, index_t k, bool side_by_side,
                                                                      float* out) noexcept {
    __m512 acc[dot_rows];
    index_t t = 0;
    if (side_by_side)
      for (; t + 2 <= rows; t += 2) pair_row_dots<2>(x, first + t * stride, stride, k, acc + t);
    for (; t < rows; ++t) pair_row_dots<1>(x, first + t * stride, stride, k, acc + t);
    for (t = rows; t < dot_rows; ++t) acc[t] = _mm512_setzero_ps();
    _mm512_mask_storeu_ps(out, lanes(rows), lane_sums_avx512(acc));
  }

  // sums[r] (lanes to be added) = x · R rows from `row` on, 256 values a row
  // at a time into eight partial sums a row, x's vector loaded once for
  // every row, every line prefetched whole groups of R rows ahead
  // (stream_prefetch.hpp); the depth's end masked (a zero completes an odd
  // last pair). On an Intel Xeon two rows side by side streamed faster than
  // one row alone, on Zen 4 one row alone (policy::stream_order); fewer
  // partial sums a row, or more rows, were slower (docs/benchmarks.md,
  // "Decoding a checkpoint", has the step's share of its read bound).
  template <int R>
  [[gnu::target("avx512f,avx512bw,avx512bf16")]] static void pair_row_dots(const Eigen::bfloat16* x,
                                                                           const Eigen::bfloat16* row, index_t stride,
                                                                           index_t k, __m512* sums) noexcept {
    constexpr index_t unroll = 8, step = 32 * unroll;
    const stream_distance ahead = stream_ahead(R * stride * index_t{sizeof(Eigen::bfloat16)});
    __m512 part[R][unroll];
    for (auto& r : part)
      for (auto& q : r) q = _mm512_setzero_ps();
    auto add = [&](__m512& to, const __m512bh xv, const Eigen::bfloat16* w) {
      prefetch_ahead(w, ahead);
      to = _mm512_dpbf16_ps(to, xv, (__m512bh)_mm512_loadu_si512(w));
    };
    index_t c = 0;
    for (; c + step <= k; c += step)
      DIFFTX_UNROLL(8)
      for (index_t u = 0; u < unroll; ++u) {
        const auto xv = (__m512bh)_mm512_loadu_si512(x + c + 32 * u);
        for (int r = 0; r < R; ++r) add(part[r][u], xv, row + r * stride + c + 32 * u);
      }
    for (; c + 32 <= k; c += 32) {
      const auto xv = (__m512bh)_mm512_loadu_si512(x + c);
      for (int r = 0; r < R; ++r) add(part[r][0], xv, row + r * stride + c);
    }
    if (const __mmask32 in_depth = (__mmask32{1} << (k - c)) - 1; c < k) {
      const auto xv = (__m512bh)_mm512_maskz_loadu_epi16(in_depth, x + c);
      for (int r = 0; r < R; ++r)
        part[r][1] = _mm512_dpbf16_ps(part[r][1], xv, (__m512bh)_mm512_maskz_loadu_epi16(in_depth, row + r * stride + c));
    }
    for (int r = 0; r < R; ++r) {
      DIFFTX_UNROLL(8)
      for (index_t u = 1; u < unroll; ++u) part[r][0] = _mm512_add_ps(part[r][0], part[r][u]);
      sums[r] = part[r][0];
    }
  }

  // Packing (the layout: see bf16_pair_gemm), 16 lanes of words at a time.
  // Stored along the depth, 16 rows' next 16 words (32 values, the depth's
  // end masked) are transposed as a 16 x 16 matrix of words in registers;
  // stored across it, two rows' values are widened to 32 bits and merged,
  // every panel's lanes of a row pair in turn (so that a strided operand,
  // dyᵀ, is read along its rows). Lanes past count are zero.
  template <bool along_k, index_t width>
  [[gnu::target("avx512f,avx512bw,avx512vl")]] static void pack(const Eigen::bfloat16* src, index_t ld, index_t k,
                                                               index_t count, pair_word* dst) noexcept {
    const index_t pairs = (k + 1) / 2, panels = (count + width - 1) / width;
    // Lanes [c, c + 16) of panel s hold X's rows or columns from w = s · width + c.
    if constexpr (along_k) {
      for (index_t s = 0; s < panels; ++s)
        for (index_t c = 0; c < width; c += 16) {
          const index_t w = s * width + c, live = std::clamp<index_t>(count - w, 0, 16);
          pair_word* out = dst + s * pairs * width + c;
          for (index_t q0 = 0; q0 < pairs; q0 += 16) {
            const index_t values = std::min<index_t>(32, k - 2 * q0);
            const __mmask32 in_depth = values >= 32 ? ~__mmask32{0} : (__mmask32{1} << values) - 1;
            __m512i x[16];
            for (index_t r = 0; r < 16; ++r)
              x[r] = r < live ? _mm512_maskz_loadu_epi16(in_depth, src + (w + r) * ld + 2 * q0) : _mm512_setzero_si512();
            transpose_words(x);
            for (index_t t = 0; t < std::min<index_t>(16, pairs - q0); ++t)
              _mm512_mask_storeu_epi32(out + (q0 + t) * width, lanes(width - c), x[t]);
          }
        }
    } else {
      for (index_t q = 0; q < pairs; ++q)
        for (index_t s = 0; s < panels; ++s)
          for (index_t c = 0; c < width; c += 16) {
            const index_t w = s * width + c, live = std::clamp<index_t>(count - w, 0, 16);
            __m512i word = _mm512_setzero_si512();
            for (index_t h = 0; h < 2 && live > 0 && 2 * q + h < k; ++h)  // the low half, then the high one
              word = _mm512_or_si512(word, _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(
                                                                 lanes(live), src + (2 * q + h) * ld + w)),
                                                             static_cast<unsigned>(16 * h)));
            _mm512_mask_storeu_epi32(dst + s * pairs * width + q * width + c, lanes(width - c), word);
          }
    }
  }

  static __mmask16 lanes(index_t n) noexcept {
    return static_cast<__mmask16>(n >= 16 ? 0xffff : (1u << std::max<index_t>(n, 0)) - 1);
  }

  // x[r] lane c becomes x[c] lane r, in four rounds of shuffles: words, then
  // word pairs within 128-bit lanes, then 128-bit lanes twice.
  [[gnu::target("avx512f")]] static void transpose_words(__m512i (&x)[16]) noexcept {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_epi32(x[i], x[i + 1]);
      t[i + 1] = _mm512_unpackhi_epi32(x[i], x[i + 1]);
    }
    // Per 128-bit lane L, x[4g + j] holds columns 4L + j of rows 4g .. 4g + 3.
    for (int g = 0; g < 16; g += 4) {
      x[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
      x[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
      x[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
      x[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
    for (int j = 0; j < 4; ++j) {
      const __m512i low0 = _mm512_shuffle_i32x4(x[j], x[4 + j], 0x44), high0 = _mm512_shuffle_i32x4(x[j], x[4 + j], 0xee);
      const __m512i low1 = _mm512_shuffle_i32x4(x[8 + j], x[12 + j], 0x44),
                    high1 = _mm512_shuffle_i32x4(x[8 + j], x[12 + j], 0xee);
      t[j] = _mm512_shuffle_i32x4(low0, low1, 0x88);
      t[4 + j] = _mm512_shuffle_i32x4(low0, low1, 0xdd);
      t[8 + j] = _mm512_shuffle_i32x4(high0, high1, 0x88);
      t[12 + j] = _mm512_shuffle_i32x4(high0, high1, 0xdd);
    }
    for (int i = 0; i < 16; ++i) x[i] = t[i];
  }
};
using avx512_bf16_pairs = avx512_bf16_pairs_of<12, 2>;
#endif

}  // namespace difftx::simd_detail
