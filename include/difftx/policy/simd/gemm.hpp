// Matrix products on float16/bfloat16 storage with float arithmetic, without a
// conversion pass over the operands.
//
// Eigen's GEMM computes in the scalar type it is given, so a bfloat16 product
// through Eigen needs float copies of both operands (and of the result), made
// and written back once per call: a pass over every weight on every forward.
// Here the conversion is the packing step every blocked GEMM does anyway: each
// thread owns blocks of C (gemm_blocks.hpp), converts the slices of A and B it
// needs into its own float buffers (L2-sized, reused across calls), runs
// register-tiled kernels on them, and rounds its block of C back to T once.
// Float and double products stay with Eigen.
//
//   C[M, N] (=|+=) A[M, K] · B[K, N], in three layouts of A and B:
//     a_rows  · b_columns   y  = x · wᵀ      (both contiguous along K: dot-product kernel)
//     a_rows  · b_rows      dx = dy · w      (B contiguous along N: tile_product's kernel)
//     a_columns · b_rows    dw += dyᵀ · x    (A stored [K, M])
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>

#include "difftx/policy/simd/common.hpp"
#include "difftx/policy/simd/gemm_blocks.hpp"
#include "difftx/policy/simd/gemm_bf16_pairs.hpp"
#include "difftx/policy/simd/stream_prefetch.hpp"
#include "difftx/policy/simd/tile.hpp"

namespace difftx::simd_detail {

// --- b_columns: the dot-product form (y = x · wᵀ) --------------------------
// Both operands are read along K, so each output is a dot product: an R x 4
// block keeps R·4 = W vector accumulators (W the vector width), reduced across
// lanes together by lane_sums. Depth 512: the A and B rows
// the kernel streams (R + 4 rows of 2 KB) stay in L1.
constexpr index_t dot_depth = 512, dot_cols = 4;

template <class A>
inline constexpr int dot_rows = static_cast<int>(vec<A>::size) / dot_cols;

// C[r, c] += Σ_p a[r·lda + p] · b[c·ldb + p] for r < R, c < 4; k a multiple of W.
template <int R, class A>
inline void dot_micro_kernel(index_t k, const A* a, index_t lda, const A* b, index_t ldb, A* c, index_t ldc) noexcept {
  using V = vec<A>;
  constexpr index_t W = V::size;
  V acc[W];  // acc[r·4 + n]; rows past R stay zero
  for (auto& x : acc) x = V(A(0));
  for (index_t p = 0; p < k; p += W) {
    V av[R];
    for (int r = 0; r < R; ++r) {
      av[r] = V::load_unaligned(a + r * lda + p);
      keep_in_register(av[r]);  // else each FMA reloads it: 12 loads per 8 FMAs
    }
    for (int n = 0; n < dot_cols; ++n) {
      V bv = V::load_unaligned(b + n * ldb + p);
      keep_in_register(bv);
      for (int r = 0; r < R; ++r) acc[r * dot_cols + n] = simd_detail::multiply_add(av[r], bv, acc[r * dot_cols + n]);
    }
  }
  alignas(64) A sums[W];
  lane_sums(acc, sums);
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < dot_cols; ++n) c[r * ldc + n] += sums[r * dot_cols + n];
}

// C[m, n] += A[m, k] · B[n, k]ᵀ, B padded with zero rows to a multiple of 4.
template <class A>
void dot_tile_product(index_t m, index_t n, index_t k, const A* a, index_t lda, const A* b, index_t ldb, A* c,
                      index_t ldc) noexcept {
  constexpr int R = dot_rows<A>;
  for (index_t j = 0; j < n; j += dot_cols) {
    index_t i = 0;
    for (; i + R <= m; i += R) dot_micro_kernel<R>(k, a + i * lda, lda, b + j * ldb, ldb, c + i * ldc + j, ldc);
    for (; i < m; ++i) dot_micro_kernel<1>(k, a + i * lda, lda, b + j * ldb, ldb, c + i * ldc + j, ldc);
  }
}

// --- b_rows: the broadcast form (dx = dy · w, dw += dyᵀ · x) ----------------
// tile.hpp's micro-kernel, 6 rows x panel_cols: B is packed in panels of
// panel_cols columns, each [depth][panel_cols] contiguous, so the panel a
// kernel sweeps stays in L1 (rows of a wider block would share few L1 sets):
// 16 KB at depth 256 with AVX2's 16-column panels (AVX-512's 64-column panels
// take 64 KB, past L1: not tuned, no such machine here); C's block is padded
// to whole panels.
constexpr index_t axpy_depth = 256;
constexpr int axpy_rows = 6, axpy_vectors = vec<float>::size >= 16 ? 4 : 2;
template <class A>
inline constexpr index_t panel_cols = axpy_vectors * static_cast<index_t>(vec<A>::size);

template <a_layout Layout, class A>
void panel_product(index_t m, index_t n_pad, index_t k, const A* a, index_t lda, const A* b_panels, A* c,
                   index_t ldc) noexcept {
  constexpr index_t P = panel_cols<A>;
  auto row_at = [&](index_t i) { return Layout == a_layout::rows ? a + i * lda : a + i; };
  for (index_t j = 0; j < n_pad; j += P) {
    const A* panel = b_panels + j * k;
    index_t i = 0;
    for (; i + axpy_rows <= m; i += axpy_rows)
      micro_kernel<axpy_rows, axpy_vectors, Layout>(k, row_at(i), lda, panel, P, c + i * ldc + j, ldc, true);
    for (; i < m; ++i) micro_kernel<1, axpy_vectors, Layout>(k, row_at(i), lda, panel, P, c + i * ldc + j, ldc, true);
  }
}

// rows x cols values of T (row t at src + t·ld) as float at dst (row stride
// dst_ld); columns [cols, dst_ld) are zeroed.
template <class T>
void pack_rows(const T* src, index_t ld, index_t rows, index_t cols, accum_t<T>* dst, index_t dst_ld) {
  for (index_t t = 0; t < rows; ++t) {
    to_accum(src + t * ld, cols, dst + t * dst_ld);
    std::fill(dst + t * dst_ld + cols, dst + (t + 1) * dst_ld, accum_t<T>(0));
  }
}
// B's rows [k][n] into panels [n_pad / P][k][P], zero-padded to n_pad columns.
template <class T>
void pack_panels(const T* src, index_t ld, index_t k, index_t n, index_t n_pad, accum_t<T>* dst) {
  constexpr index_t P = panel_cols<accum_t<T>>;
  for (index_t j = 0; j < n_pad; j += P)
    pack_rows(src + j, ld, k, std::clamp<index_t>(n - j, 0, P), dst + j * k, P);
}

// x[K] as float in the layout bf16_pair_dots reads: each 2W values as the W
// of even index, then the W of odd index; K rounded up to 2W with zeros.
inline index_t split_pairs_size(index_t K) { return (K + 2 * vec<float>::size - 1) / (2 * vec<float>::size) * 2 * vec<float>::size; }
template <class T>
void split_pairs(const T* x, index_t K, float* split) {
  constexpr index_t W = vec<float>::size;
  for (index_t c0 = 0; c0 < K; c0 += 2 * W)
    for (index_t j = 0; j < W; ++j) {
      split[c0 + j] = c0 + 2 * j < K ? static_cast<float>(x[c0 + 2 * j]) : 0.0f;
      split[c0 + W + j] = c0 + 2 * j + 1 < K ? static_cast<float>(x[c0 + 2 * j + 1]) : 0.0f;
    }
}

// out[t] = Σ_c x[c] · R(t, c) for `rows` bfloat16 rows of even length k (row
// t at first + t·stride, stride even), x split by split_pairs. A row's 32-bit
// word holds the pair (c, c + 1): shifted left by 16 it is value c as a float,
// masked to its high half value c + 1, so a pair costs two plain integer
// operations where widening costs a shuffle per value. The products are
// exact; the sums are in float, in another order than dots_with_rows'. One
// row after the other, each read as one sequential stream into four partial
// sums, so that a slice of rows is one stream (gemm_bf16_pairs.hpp's
// row_dots), every line prefetched whole rows ahead (stream_prefetch.hpp):
// W rows side by side, as dots_with_rows reads them, made a 1B checkpoint's
// bfloat16 decode with --bf16-product converting about a sixth slower on
// Zen 4.
inline void bf16_pair_dots(const float* split, const Eigen::bfloat16* first, index_t stride, index_t rows, index_t k,
                           float* out) {
  using V = vec<float>;
  using U = xsimd::batch<std::uint32_t, typename V::arch_type>;
  constexpr index_t W = V::size;
  const index_t k_vec = k / (2 * W) * (2 * W);
  const U high(0xFFFF0000u);
  auto pair = [&](index_t t, index_t c, V& acc) {  // values c .. c + 2W of row t
    const U words = U::load_unaligned(reinterpret_cast<const std::uint32_t*>(first + t * stride + c));
    acc = simd_detail::multiply_add(V::load_unaligned(split + c), xsimd::bitwise_cast<V>(words << 16), acc);
    acc = simd_detail::multiply_add(V::load_unaligned(split + c + W), xsimd::bitwise_cast<V>(words & high), acc);
  };
  auto rest = [&](index_t t) {  // the pairs past the last whole 2W
    float sum = 0;
    for (index_t c = k_vec; c < k; c += 2)
      sum += split[k_vec + (c - k_vec) / 2] * static_cast<float>(first[t * stride + c]) +
             split[k_vec + W + (c - k_vec) / 2] * static_cast<float>(first[t * stride + c + 1]);
    return sum;
  };
  constexpr index_t unroll = 4, step = unroll * 2 * W;
  const stream_distance ahead = stream_ahead(stride * index_t{sizeof(Eigen::bfloat16)});
  for (index_t t = 0; t < rows; ++t) {
    V part[unroll];
    DIFFTX_UNROLL(4)
    for (auto& q : part) q = V(0.0f);
    index_t c = 0;
    for (; c + step <= k_vec; c += step)
      DIFFTX_UNROLL(4)
      for (index_t u = 0; u < unroll; ++u) {
        if (u * 2 * W * index_t{sizeof(Eigen::bfloat16)} % 64 == 0) prefetch_ahead(first + t * stride + c + u * 2 * W, ahead);
        pair(t, c + u * 2 * W, part[u]);
      }
    for (; c < k_vec; c += 2 * W) pair(t, c, part[0]);
    out[t] = xsimd::hadd((part[0] + part[1]) + (part[2] + part[3])) + rest(t);
  }
}

// Decoding's products (for_each_gemv_slice) with w converted in registers
// (dots_with_rows) and x's rows converted once for every part.
template <class T>
void reduced_gemv(const policy::simd& p, index_t M, index_t K, const T* x, std::span<const gemv_part<T>> parts) {
  using A = accum_t<T>;
  constexpr index_t W = vec<A>::size;
  // bfloat16 rows of even length read as pairs (bf16_pair_dots): decoding's
  // projections are bound by the bytes of w, and widening them cost 10-20%.
  constexpr bool bf16_floats = std::is_same_v<T, Eigen::bfloat16> && std::is_same_v<A, float>;
  const bool pairs = bf16_floats && K % 2 == 0;
  const index_t x_size = pairs ? split_pairs_size(K) : K;
  auto& scratch = gemm_scratch<A>::local();  // the calling thread's: x as A
  scratch.a.resize(static_cast<std::size_t>(M * x_size));
  A* const xa = scratch.a.data();
  if (pairs)
    for (index_t i = 0; i < M; ++i) split_pairs(x + i * K, K, xa + i * x_size);
  else
    to_accum(x, M * K, xa);
  for_each_gemv_slice(p, M, parts, W, [&](const gemv_part<T>& part, index_t i, index_t j, index_t n) {
    A out[W];  // the slice's sums, converted into y on the thread that made them
    const auto sums = [&] {
      if constexpr (bf16_floats)
        if (pairs) return bf16_pair_dots(xa + i * x_size, part.w + j * K, K, n, K, out);
      dots_with_rows(xa + i * K, part.w + j * K, K, n, K, out);
    };
    sums();
    from_accum(out, n, part.y + i * part.rows + j);
  });
}

// C = (C +) A · B with A and B converted to float while they are packed.
template <a_storage AS, b_storage BS, class T>
void converted_gemm(const policy::simd& p, index_t M, index_t N, index_t K, const T* a, index_t lda, const T* b,
                    index_t ldb, T* c, index_t ldc, bool accumulate) {
  static_assert(!(AS == a_storage::columns && BS == b_storage::columns), "no product uses Aᵀ · Bᵀ");
  using A = accum_t<T>;
  constexpr index_t W = vec<A>::size;
  constexpr bool dot_form = BS == b_storage::columns;
  constexpr index_t depth = dot_form ? dot_depth : axpy_depth;
  constexpr index_t col_align = dot_form ? dot_cols : panel_cols<A>;
  for_each_c_block(p, M, N, col_align, c, ldc, accumulate,
                   [&](index_t i0, index_t j0, index_t m, index_t n, index_t n_pad, A* cb) {
                     auto& scratch = gemm_scratch<A>::local();
                     scratch.a.resize(static_cast<std::size_t>(block_rows * depth));
                     scratch.b.resize(static_cast<std::size_t>((block_cols + col_align) * depth));
                     A *ab = scratch.a.data(), *bb = scratch.b.data();
                     for (index_t p0 = 0; p0 < K; p0 += depth) {
                       const index_t k = std::min(depth, K - p0);
                       if constexpr (dot_form) {
                         const index_t k_pad = (k + W - 1) / W * W;  // the kernel reads whole vectors
                         pack_rows(a + i0 * lda + p0, lda, m, k, ab, k_pad);
                         pack_rows(b + j0 * ldb + p0, ldb, n, k, bb, k_pad);
                         std::fill(bb + n * k_pad, bb + n_pad * k_pad, A(0));
                         dot_tile_product(m, n_pad, k_pad, ab, k_pad, bb, k_pad, cb, n_pad);
                       } else {
                         pack_panels(b + p0 * ldb + j0, ldb, k, n, n_pad, bb);
                         if constexpr (AS == a_storage::rows) {
                           pack_rows(a + i0 * lda + p0, lda, m, k, ab, k);  // [m][k]
                           panel_product<a_layout::rows>(m, n_pad, k, ab, k, bb, cb, n_pad);
                         } else {
                           pack_rows(a + p0 * lda + i0, lda, k, m, ab, m);  // [k][m]
                           panel_product<a_layout::transposed>(m, n_pad, k, ab, m, bb, cb, n_pad);
                         }
                       }
                     }
                   });
}

// C[M, N] (=|+=) A[M, K] · B[K, N] for float16/bfloat16 storage: bfloat16 on
// the dot-product instruction where the policy's setting resolves to it
// (bf16_product.hpp), the rest converted while packed. (Decoding's few rows
// of x · wᵀ go to decoding_gemv, linear.hpp, instead.)
template <a_storage AS, b_storage BS, class T>
  requires(!std::is_same_v<T, accum_t<T>>)
void reduced_gemm(const policy::simd& p, index_t M, index_t N, index_t K, const T* a, index_t lda, const T* b,
                  index_t ldb, T* c, index_t ldc, bool accumulate) {
  if (M == 0 || N == 0) return;
#if DIFFTX_BF16_PAIRS
  if constexpr (std::is_same_v<T, Eigen::bfloat16>)
    if (p.bf16_product_used() == policy::bf16_product::dot_instructions)
      return bf16_pair_gemm<AS, BS, avx512_bf16_pairs>(p, M, N, K, a, lda, b, ldb, c, ldc, accumulate);
#endif
  converted_gemm<AS, BS>(p, M, N, K, a, lda, b, ldb, c, ldc, accumulate);
}

}  // namespace difftx::simd_detail
