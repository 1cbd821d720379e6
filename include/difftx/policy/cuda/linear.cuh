// CUDA linear forward/backward (shapes in difftx/ops/linear.hpp) through
// cuBLASLt, float accumulation (CUBLAS_COMPUTE_32F: no TF32 for float32) for
// float32, float16 and bfloat16; double throughout for float64
// (CUDA_R_64F with CUBLAS_COMPUTE_64F and double alpha and beta).
// cuBLASLt is column-major: a row-major [R, C] buffer is its [C, R] matrix,
// so each row-major product below is written as its transpose.
#pragma once

#include <memory>
#include <string>
#include <type_traits>
#include <utility>

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

// The plan of a product: built for its key, and kept in the context
// (plan_cache.hpp) where the context keeps plans (its default: context.cuh).
template <class T>
std::shared_ptr<const matmul_plan> lt_plan(const policy::cuda& p, const matmul_key& key) {
  auto build = [&] {
    const cudaDataType_t type = blas_type<T>();
    auto plan = std::make_shared<matmul_plan>();  // its destructor frees what was made before a throw
    if constexpr (blas_in_double<T>)
      DIFFTX_CUDA_CHECK(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_64F, CUDA_R_64F));
    else
      DIFFTX_CUDA_CHECK(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = key.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                            tb = key.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    DIFFTX_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    DIFFTX_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    const int64_t m = key.m, n = key.n, k = key.k;
    DIFFTX_CUDA_CHECK(cublasLtMatrixLayoutCreate(&plan->a, type, key.transpose_a ? k : m, key.transpose_a ? m : k, key.lda));
    DIFFTX_CUDA_CHECK(cublasLtMatrixLayoutCreate(&plan->b, type, key.transpose_b ? n : k, key.transpose_b ? k : n, key.ldb));
    DIFFTX_CUDA_CHECK(cublasLtMatrixLayoutCreate(&plan->c, type, m, n, key.ldc));
    cublasLtMatmulPreference_t preference = nullptr;
    DIFFTX_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    const std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, decltype(&cublasLtMatmulPreferenceDestroy)> release(
        preference, &cublasLtMatmulPreferenceDestroy);
    for (const auto& [attribute, bytes] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
                                           std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
                                           std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
                                           std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c}})
      DIFFTX_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &bytes, sizeof bytes));
    DIFFTX_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &p.context->workspace_bytes, sizeof(std::size_t)));
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    DIFFTX_CUDA_CHECK(cublasLtMatmulAlgoGetHeuristic(p.context->blas, plan->op, plan->a, plan->b, plan->c, plan->c,
                                                     preference, 1, &heuristic, &found));
    if (found == 0)
      throw cuda_error("cuBLASLt found no algorithm for a " + std::to_string(m) + "x" + std::to_string(n) + "x" +
                       std::to_string(k) + " product");
    plan->algo = heuristic.algo;
    return std::shared_ptr<const matmul_plan>(std::move(plan));
  };
  return p.context->keep_matmul_plans ? p.context->matmul_plans.get(key, build) : build();
}

// C[m, n] = alpha op(A) op(B) + beta C, column-major, A/B/C of type T, alpha = 1.
template <class T>
void lt_matmul(const policy::cuda& p, bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, const T* a,
               int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc, double beta) {
  using Alpha = std::conditional_t<blas_in_double<T>, double, float>;
  const auto plan = lt_plan<T>(p, {static_cast<int>(blas_type<T>()), transpose_a, transpose_b, m, n, k, lda, ldb, ldc,
                                   pointer_alignment(a), pointer_alignment(b), pointer_alignment(c)});
  const Alpha alpha = 1, beta_typed = static_cast<Alpha>(beta);
  DIFFTX_CUDA_CHECK(cublasLtMatmul(p.context->blas, plan->op, &alpha, a, plan->a, b, plan->b, &beta_typed, c, plan->c, c,
                                   plan->c, &plan->algo, p.context->workspace, p.context->workspace_bytes, p.stream()));
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
