// CUDA linear forward/backward (shapes in difftx/ops/linear.hpp) through
// cuBLASLt, float accumulation (CUBLAS_COMPUTE_32F: no TF32 for float32) for
// float32, float16 and bfloat16; double throughout for float64
// (CUDA_R_64F with CUBLAS_COMPUTE_64F and double alpha and beta).
// cuBLASLt is column-major: a row-major [R, C] buffer is its [C, R] matrix,
// so each row-major product below is written as its transpose.
#pragma once

#include <type_traits>

#include <cublasLt.h>

#include "difftx/ops/linear.hpp"
#include "difftx/policy/cuda/device_types.cuh"
#include "difftx/policy/cuda/tag.cuh"

namespace difftx {

namespace cuda_detail {

template <class T>
constexpr cudaDataType_t blas_type() {
  if constexpr (std::is_same_v<T, float>)
    return CUDA_R_32F;
  else if constexpr (std::is_same_v<T, double>)
    return CUDA_R_64F;
  else if constexpr (std::is_same_v<T, Eigen::half>)
    return CUDA_R_16F;
  else
    return CUDA_R_16BF;
}

// The compute type and the type of alpha and beta: double for double, else float.
template <class T>
constexpr bool blas_in_double = std::is_same_v<T, double>;

// C[m, n] = alpha op(A) op(B) + beta C, column-major, A/B/C of type T, alpha = 1.
template <class T>
void lt_matmul(const policy::cuda& p, bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, const T* a,
               int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc, double beta) {
  const cudaDataType_t type = blas_type<T>();
  using Alpha = std::conditional_t<blas_in_double<T>, double, float>;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  auto release = [&] {
    if (preference) cublasLtMatmulPreferenceDestroy(preference);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
  };
  try {
    if constexpr (blas_in_double<T>)
      DIFFTX_CUDA_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_64F, CUDA_R_64F));
    else
      DIFFTX_CUDA_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    DIFFTX_CUDA_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    DIFFTX_CUDA_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    DIFFTX_CUDA_CHECK(cublasLtMatrixLayoutCreate(&la, type, transpose_a ? k : m, transpose_a ? m : k, lda));
    DIFFTX_CUDA_CHECK(cublasLtMatrixLayoutCreate(&lb, type, transpose_b ? n : k, transpose_b ? k : n, ldb));
    DIFFTX_CUDA_CHECK(cublasLtMatrixLayoutCreate(&lc, type, m, n, ldc));
    DIFFTX_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    DIFFTX_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &p.context->workspace_bytes, sizeof(std::size_t)));
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    DIFFTX_CUDA_CHECK(cublasLtMatmulAlgoGetHeuristic(p.context->blas, op, la, lb, lc, lc, preference, 1, &heuristic, &found));
    if (found == 0) throw cuda_error("cuBLASLt found no algorithm for a " + std::to_string(m) + "x" + std::to_string(n) +
                                     "x" + std::to_string(k) + " product");
    const Alpha alpha = 1, beta_typed = static_cast<Alpha>(beta);
    DIFFTX_CUDA_CHECK(cublasLtMatmul(p.context->blas, op, &alpha, a, la, b, lb, &beta_typed, c, lc, c, lc,
                                     &heuristic.algo, p.context->workspace, p.context->workspace_bytes, p.stream()));
  } catch (...) {
    release();
    throw;
  }
  release();
}

}  // namespace cuda_detail

// y[M, N] = x[M, K] · w[N, K]^T   (column-major: y^T[N, M] = w · x^T)
template <class T>
  requires supported_by<policy::cuda, T>
void linear_forward(const policy::cuda& p, cview<T, 2> x, cview<T, 2> w, TensorView<T, 2> y) {
  constexpr std::string_view where = "linear_forward";
  detail::check_linear(where, memory_space::device, x, w, y, "y");
  const int64_t M = x.extent(0), K = x.extent(1), N = w.extent(0);
  cuda_detail::lt_matmul<T>(p, true, false, N, M, K, w.data(), K, x.data(), K, y.data(), N, 0.0);
}

// dx[M, K] (=|+=) dy[M, N] · w[N, K]   (dx^T[K, M] = w^T · dy^T)
// dw[N, K] += dy^T · x                  (dw^T[K, N] = x^T · dy)
template <class T>
  requires supported_by<policy::cuda, T>
void linear_backward(const policy::cuda& p, cview<T, 2> x, cview<T, 2> w, cview<T, 2> dy, TensorView<T, 2> dx,
                     TensorView<T, 2> dw, write_mode dx_mode = write_mode::assign) {
  constexpr std::string_view where = "linear_backward";
  detail::check_linear_backward(where, memory_space::device, x, w, dy, dx, dw);
  const int64_t M = x.extent(0), K = x.extent(1), N = w.extent(0);
  cuda_detail::lt_matmul<T>(p, false, false, K, M, N, w.data(), K, dy.data(), N, dx.data(), K,
                            dx_mode == write_mode::add ? 1.0 : 0.0);
  cuda_detail::lt_matmul<T>(p, false, true, K, N, M, x.data(), K, dy.data(), N, dw.data(), K, 1.0);
}

}  // namespace difftx
