// How the float16/bfloat16 matrix products (gemm.hpp, gemm_bf16_pairs.hpp)
// split C[M, N] (=|+=) A[M, K] · B[K, N] over threads: each thread owns
// blocks of C, accumulates one block at a time in float in its own buffer,
// and rounds it back to T once. What differs between the products is how a
// block's A · B is packed and multiplied, which the caller passes in.
#pragma once

#include <algorithm>

#include "difftx/policy/simd/common.hpp"

namespace difftx::simd_detail {

// How A[M, K] is stored: a[i·lda + p] (rows) or a[p·lda + i] (columns, i.e. Aᵀ row-major).
enum class a_storage { rows, columns };
// How B[K, N] is stored: b[p·ldb + j] (rows) or b[j·ldb + p] (columns, i.e. Bᵀ row-major).
enum class b_storage { rows, columns };

// Blocks: C's block_rows x block_cols block stays in L2 across the depth loop
// (32 KB as float); so do the slices of A and B that the kernels sweep.
constexpr index_t block_rows = 66, block_cols = 128;

// The per-thread buffers: they outlive the call, so that repeated products
// (every decode step, every layer) do not allocate and fault in fresh pages
// every time.
template <class E>
struct gemm_scratch {
  aligned_vector<E> a, b, c;
  static gemm_scratch& local() {
    thread_local gemm_scratch scratch;
    return scratch;
  }
};

// Runs C's blocks on the policy's threads. For each block (rows [i0, i0 + m),
// columns [j0, j0 + n)) the float accumulator cb[m][n_pad] (n rounded up to
// col_align, the padding never stored) starts as zero or as C, then
// add_product(i0, j0, m, n, n_pad, cb) adds the block's A · B into it.
template <class T, class AddProduct>
void for_each_c_block(const policy::simd& p, index_t M, index_t N, index_t col_align, T* c, index_t ldc,
                      bool accumulate, AddProduct&& add_product) {
  using A = accum_t<T>;
  if (M == 0 || N == 0) return;
  const index_t row_blocks = (M + block_rows - 1) / block_rows, col_blocks = (N + block_cols - 1) / block_cols;
  const index_t blocks = row_blocks * col_blocks;
  const int threads = static_cast<int>(std::min<index_t>(thread_count(p), blocks));

#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (threads > 1)
  for (index_t block = 0; block < blocks; ++block) {
    auto& scratch = gemm_scratch<A>::local();
    const index_t i0 = block / col_blocks * block_rows, j0 = block % col_blocks * block_cols;
    const index_t m = std::min(block_rows, M - i0), n = std::min(block_cols, N - j0);
    const index_t n_pad = (n + col_align - 1) / col_align * col_align;
    scratch.c.resize(static_cast<std::size_t>(block_rows * (block_cols + col_align)));
    A* cb = scratch.c.data();
    for (index_t i = 0; i < m; ++i) {  // padded columns too: the kernels update them
      std::fill(cb + i * n_pad, cb + (i + 1) * n_pad, A(0));
      if (accumulate) to_accum(c + (i0 + i) * ldc + j0, n, cb + i * n_pad);
    }
    add_product(i0, j0, m, n, n_pad, cb);
    for (index_t i = 0; i < m; ++i) from_accum(cb + i * n_pad, n, c + (i0 + i) * ldc + j0);
  }
}

// Decoding's y[M, N] = x[M, K] · w[N, K]ᵀ for a few rows of x: nothing to
// reuse a packed copy of w for, so w streams once, straight from memory.
// row_dots(i, j, rows) writes out[i·N + j + t] for t < rows ≤ slice, the dot
// products of x's row i with w's rows j + t; w's slice of rows stays in
// cache for every row of x. Guided scheduling: each thread first takes a
// long run of rows (half, then a quarter of what is left ...), which
// streams at the memory's rate, and the last runs are short, so neither
// thread waits long for the other (fixed runs of 64 rows read 5-7% slower).
constexpr index_t gemv_max_rows = 4;
template <class RowDots>
void for_each_gemv_slice(const policy::simd& p, index_t M, index_t N, index_t slice, RowDots&& row_dots) {
  const index_t slices = (N + slice - 1) / slice;
  const int threads = static_cast<int>(std::min<index_t>(thread_count(p), slices));
#pragma omp parallel for num_threads(threads) schedule(guided, 1) if (threads > 1)
  for (index_t s = 0; s < slices; ++s) {
    const index_t j = s * slice;
    for (index_t i = 0; i < M; ++i) row_dots(i, j, std::min(slice, N - j));
  }
}

}  // namespace difftx::simd_detail
