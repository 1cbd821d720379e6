// bfloat16 matrix products on the CPU's bfloat16 dot-product instruction
// (vdpbf16ps, AVX512_BF16: Cooper Lake, Sapphire Rapids and later, Zen 4 and
// later), with float accumulation and no conversion of the operands at all.
//
//   C[M, N] (=|+=) A[M, K] · B[K, N], bfloat16 in and out, float inside.
//
// vdpbf16ps multiplies pairs: lane l of the result gains x[2l]·y[2l] +
// x[2l+1]·y[2l+1], each product exact in float. So both operands are packed
// as 32-bit pair words along K (the depth): A as rows of words, B as panels
// of 64 columns, word (q, j) = B(2q, j) | B(2q+1, j) << 16, K padded with a
// zero to even. The micro-kernel is then the broadcast form of every blocked
// GEMM (tile.hpp's), a pair of depths per step: R broadcast words of A against
// 4 vectors of the panel, R·4 instructions of 32 multiply-adds each. Packing
// reads any of the three layouts (x·wᵀ, dy·w, dyᵀ·x), so the forward and both
// backward products of a bfloat16 Linear run on it.
//
// Selected at run time (bf16_pair_instructions), once per process: the same
// binary falls back to gemm.hpp's convert-while-packing product on a CPU
// without the instruction. Results differ from that path only in the order of
// float additions (and in flushing subnormal inputs to zero, as the
// instruction does): within a few float roundings, far below bfloat16's.
// Blocking is gemm_blocks.hpp's, untuned for these machines (none was at hand).
#pragma once

#include <cstdint>

#include "difftx/policy/simd/common.hpp"
#include "difftx/policy/simd/gemm_blocks.hpp"

// 1 where the path is compiled in: x86-64 with GCC or clang, not the MSVC ABI
// (clang-cl lacks __builtin_cpu_supports's runtime). -DDIFFTX_BF16_PAIRS=0
// leaves it out.
#if !defined(DIFFTX_BF16_PAIRS)
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(_MSC_VER)
#define DIFFTX_BF16_PAIRS 1
#else
#define DIFFTX_BF16_PAIRS 0
#endif
#endif

namespace difftx::simd_detail {

using pair_word = std::uint32_t;

// Depth per packed slice: 128 pair words, so a 64-column panel is 32 KB.
constexpr index_t pair_depth = 256;

inline pair_word bf16_bits(Eigen::bfloat16 x) noexcept { return Eigen::numext::bit_cast<std::uint16_t>(x); }

// A[m, k] (rows or columns storage, from its first element) as words
// dst[i · pairs + q] = A(i, 2q) | A(i, 2q + 1) << 16, pairs = ⌈k / 2⌉, zero past k.
template <a_storage AS>
void pack_a_pairs(const Eigen::bfloat16* a, index_t lda, index_t m, index_t k, pair_word* dst) noexcept {
  const index_t pairs = (k + 1) / 2, whole = k / 2;
  auto at = [&](index_t i, index_t p) { return bf16_bits(AS == a_storage::rows ? a[i * lda + p] : a[p * lda + i]); };
  for (index_t i = 0; i < m; ++i) {
    for (index_t q = 0; q < whole; ++q) dst[i * pairs + q] = at(i, 2 * q) | at(i, 2 * q + 1) << 16;
    if (whole < pairs) dst[i * pairs + whole] = at(i, k - 1);
  }
}

// B[k, n] as panels of P columns, panel t at dst + t · pairs · P holding
// words [pairs][P]: (q, c) = B(2q, tP + c) | B(2q + 1, tP + c) << 16, zero
// past k and n (up to n_pad, a multiple of P). Rows storage is read along
// its rows, columns storage along its columns: sequential reads either way.
template <b_storage BS, index_t P>
void pack_b_pairs(const Eigen::bfloat16* b, index_t ldb, index_t k, index_t n, index_t n_pad, pair_word* dst) noexcept {
  const index_t pairs = (k + 1) / 2;
  auto at = [&](index_t p, index_t j) -> pair_word {
    if (p >= k || j >= n) return 0;
    return bf16_bits(BS == b_storage::rows ? b[p * ldb + j] : b[j * ldb + p]);
  };
  auto word = [&](index_t q, index_t j) { return at(2 * q, j) | at(2 * q + 1, j) << 16; };
  auto slot = [&](index_t q, index_t j) -> pair_word& { return dst[j / P * pairs * P + q * P + j % P]; };
  if constexpr (BS == b_storage::rows) {
    for (index_t q = 0; q < pairs; ++q)
      for (index_t j = 0; j < n_pad; ++j) slot(q, j) = word(q, j);
  } else {
    for (index_t j = 0; j < n_pad; ++j)
      for (index_t q = 0; q < pairs; ++q) slot(q, j) = word(q, j);
  }
}

#if DIFFTX_BF16_PAIRS
// Whether this CPU (and its OS, which must save the AVX-512 registers) runs
// vdpbf16ps; asked once.
inline bool bf16_pair_instructions() noexcept {
  static const bool available = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512bf16");
  return available;
}

// The micro-kernel: C[R, 64] += A[R, 2·pairs] · B[2·pairs, 64] with A as pair
// words (row r at a + r · lda) and B one packed panel. 24 of the 32 vector
// registers hold C at R = 6, 4 the panel's step, 1 the broadcast word.
struct avx512_bf16_pairs {
  static constexpr int rows = 6;
  static constexpr index_t panel_cols = 64;

  template <int R>
  [[gnu::target("avx512f,avx512bw,avx512bf16")]] static void add_product(index_t pairs, const pair_word* a,
                                                                          index_t lda, const pair_word* panel,
                                                                          float* c, index_t ldc) noexcept {
    constexpr int NV = panel_cols / 16;
    __m512 acc[R][NV];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_loadu_ps(c + r * ldc + v * 16);
    for (index_t q = 0; q < pairs; ++q) {
      __m512bh bv[NV];
      for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(panel + q * panel_cols + v * 16);
      for (int r = 0; r < R; ++r) {
        const auto av = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r * lda + q]));
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + r * ldc + v * 16, acc[r][v]);
  }
};
#else
inline bool bf16_pair_instructions() noexcept { return false; }
#endif

// C = (C +) A · B over pair-packed blocks, Kernel's micro-kernel on each
// (avx512_bf16_pairs; the tests also run the packing and blocking with a
// scalar model of the instruction, on any CPU).
template <a_storage AS, b_storage BS, class Kernel>
void bf16_pair_gemm(const policy::simd& p, index_t M, index_t N, index_t K, const Eigen::bfloat16* a, index_t lda,
                    const Eigen::bfloat16* b, index_t ldb, Eigen::bfloat16* c, index_t ldc, bool accumulate) {
  static_assert(!(AS == a_storage::columns && BS == b_storage::columns), "no product uses Aᵀ · Bᵀ");
  constexpr index_t P = Kernel::panel_cols;
  constexpr int R = Kernel::rows;
  for_each_c_block(p, M, N, P, c, ldc, accumulate,
                   [&](index_t i0, index_t j0, index_t m, index_t n, index_t n_pad, float* cb) {
                     auto& scratch = gemm_scratch<pair_word>::local();
                     scratch.a.resize(static_cast<std::size_t>(block_rows * pair_depth / 2));
                     scratch.b.resize(static_cast<std::size_t>((block_cols + P) * pair_depth / 2));
                     pair_word *ap = scratch.a.data(), *bp = scratch.b.data();
                     for (index_t p0 = 0; p0 < K; p0 += pair_depth) {
                       const index_t k = std::min(pair_depth, K - p0), pairs = (k + 1) / 2;
                       pack_a_pairs<AS>(AS == a_storage::rows ? a + i0 * lda + p0 : a + p0 * lda + i0, lda, m, k, ap);
                       pack_b_pairs<BS, P>(BS == b_storage::rows ? b + p0 * ldb + j0 : b + j0 * ldb + p0, ldb, k, n,
                                           n_pad, bp);
                       for (index_t j = 0; j < n_pad; j += P) {
                         const pair_word* panel = bp + j * pairs;
                         index_t i = 0;
                         for (; i + R <= m; i += R)
                           Kernel::template add_product<R>(pairs, ap + i * pairs, pairs, panel, cb + i * n_pad + j, n_pad);
                         for (; i < m; ++i)
                           Kernel::template add_product<1>(pairs, ap + i * pairs, pairs, panel, cb + i * n_pad + j, n_pad);
                       }
                     }
                   });
}

}  // namespace difftx::simd_detail
