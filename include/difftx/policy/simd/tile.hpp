// Register-tiled products on small row-major tiles, the inner loops of the fused
// attention kernels.
//
//   C[m, n] (+)= A[m, k] · B[k, n]       A read row-major (A(i, p) = a[i·lda + p])
//   C[m, n] (+)= A[k, m]^T · B[k, n]     A read transposed (A(i, p) = a[p·lda + i])
//
// The micro-kernel keeps an R x NV block of C in vector registers: per step p it
// loads NV vectors of B's row p, broadcasts R entries of A's column p and issues
// R·NV fused multiply-adds. Columns that do not fill a vector fall back to
// scalar loops (small head sizes only).
#pragma once

#include "difftx/policy/simd/common.hpp"

namespace difftx::simd_detail {

enum class a_layout { rows, transposed };

template <class A, a_layout Layout>
inline A a_at(const A* a, index_t lda, index_t i, index_t p) noexcept {
  return Layout == a_layout::rows ? a[i * lda + p] : a[p * lda + i];
}

// Makes the compiler hold v in a register. Without it GCC folds each load of a
// B vector into every FMA that uses it (a memory operand per FMA, R loads
// instead of one), which measured 25-35% slower in the attention kernels.
template <class V>
inline void keep_in_register(V& v) noexcept {
#if defined(__GNUC__)
  asm("" : "+v"(v.data));
#else
  (void)v;
#endif
}

template <int R, int NV, a_layout Layout, class A>
inline void micro_kernel(index_t k, const A* a, index_t lda, const A* b, index_t ldb, A* c, index_t ldc,
                         bool accumulate) noexcept {
  using V = vec<A>;
  constexpr index_t W = V::size;
  V acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = accumulate ? V::load_unaligned(c + r * ldc + v * W) : V(A(0));
  for (index_t p = 0; p < k; ++p) {
    V bv[NV];
    for (int v = 0; v < NV; ++v) {
      bv[v] = V::load_unaligned(b + p * ldb + v * W);
      keep_in_register(bv[v]);
    }
    for (int r = 0; r < R; ++r) {
      const V av(a_at<A, Layout>(a, lda, r, p));
      for (int v = 0; v < NV; ++v) acc[r][v] = simd_detail::multiply_add(av, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v].store_unaligned(c + r * ldc + v * W);
}

// Rows in steps of R (then one at a time), full vectors of columns in groups of
// NV (then single vectors), leftover columns in scalar code.
template <a_layout Layout, class A>
void tile_product(index_t m, index_t n, index_t k, const A* a, index_t lda, const A* b, index_t ldb, A* c,
                  index_t ldc, bool accumulate) noexcept {
  constexpr index_t W = vec<A>::size;
  // 4 x 4 accumulators use half of AVX-512's 32 vector registers; with 16
  // registers (AVX2, SSE) 4 x 2 leaves room for the B row and the broadcast.
  constexpr int R = 4, NV = vec<float>::size >= 16 ? 4 : 2;
  const index_t vector_columns = n / W * W;
  index_t j = 0;
  auto rows = [&](auto nv, index_t col) {
    constexpr int NVc = decltype(nv)::value;
    auto first_row = [&](index_t i) { return Layout == a_layout::rows ? a + i * lda : a + i; };
    const index_t full = m / R * R;
    for (index_t i = 0; i < full; i += R)
      micro_kernel<R, NVc, Layout>(k, first_row(i), lda, b + col, ldb, c + i * ldc + col, ldc, accumulate);
    for (index_t tail = m - full; tail > 0; --tail) {
      const index_t i = m - tail;
      micro_kernel<1, NVc, Layout>(k, first_row(i), lda, b + col, ldb, c + i * ldc + col, ldc, accumulate);
    }
  };
  for (; j + NV * W <= vector_columns; j += NV * W) rows(std::integral_constant<int, NV>{}, j);
  for (; j < vector_columns; j += W) rows(std::integral_constant<int, 1>{}, j);
  for (; j < n; ++j)
    for (index_t i = 0; i < m; ++i) {
      A s = accumulate ? c[i * ldc + j] : A(0);
      for (index_t p = 0; p < k; ++p) s += a_at<A, Layout>(a, lda, i, p) * b[p * ldb + j];
      c[i * ldc + j] = s;
    }
}

}  // namespace difftx::simd_detail
