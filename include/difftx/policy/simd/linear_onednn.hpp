// Linear's products on oneDNN's matmul (onednn_matmul.hpp) where policy::simd
// takes it (matmuls, onednn_takes); each returns false, having written
// nothing, where it does not, and linear.hpp computes the product itself.
//   forward        y[M, N] = x[M, K] · w[N, K]ᵀ
//   input gradient dx[M, K] (=|+=) dy[M, N] · w[N, K]
//   weight gradient dw[N, K] += dy[M, N]ᵀ · x[M, K]
#pragma once

#include <string>
#include <string_view>

#include "difftx/ops/linear.hpp"
#include "difftx/policy/simd/common.hpp"
#include "difftx/policy/simd/onednn_matmul.hpp"

namespace difftx::simd_detail {

#if defined(DIFFTX_ONEDNN)
// Whether automatic takes oneDNN for T: where its kernels were measured faster
// than difftx's own products (docs/benchmarks.md, "Linear's products against
// oneDNN and PyTorch"): float and bfloat16 on Zen 4 (brgemm on AVX-512 and
// AVX512_BF16) and on an AMX Xeon. float16 (kernels only with AVX512_FP16)
// has not been measured: forced only.
template <class T>
constexpr bool onednn_measured_faster() {
  return std::is_same_v<T, float> || std::is_same_v<T, Eigen::bfloat16>;
}
#endif

// Whether oneDNN multiplies a product of M rows in T under p: never decoding's
// few rows (difftx's GEMV streams the weights once), never without the library.
template <class T>
bool onednn_takes([[maybe_unused]] const policy::simd& p, [[maybe_unused]] index_t M) {
#if defined(DIFFTX_ONEDNN)
  if constexpr (onednn_computes<T>) {
    using library = policy::simd::matmul_library;
    if (M <= gemv_max_rows || p.matmuls == library::difftx) return false;
    return p.matmuls == library::onednn || onednn_measured_faster<T>();
  }
#endif
  return false;
}

}  // namespace difftx::simd_detail

template <class T>
std::string difftx::policy::simd::matmul_kernel() const {
#if defined(DIFFTX_ONEDNN)
  if constexpr (simd_detail::onednn_computes<T>)
    if (simd_detail::onednn_takes<T>(*this, simd_detail::gemv_max_rows + 1))
      if (const auto kernel = simd_detail::onednn_matmuls::instance().implementation(
              simd_detail::onednn_type<T>(), simd_detail::thread_count(*this));
          !kernel.empty())
        return "onednn " + kernel;
#endif
  return "";
}

namespace difftx::simd_detail {

template <class T>
bool onednn_linear_forward([[maybe_unused]] const policy::simd& p, [[maybe_unused]] cview<T, 2> x,
                           [[maybe_unused]] cview<T, 2> w, [[maybe_unused]] TensorView<T, 2> y) {
#if defined(DIFFTX_ONEDNN)
  if constexpr (onednn_computes<T>) {
    const index_t M = x.extent(0), K = x.extent(1), N = w.extent(0);
    if (onednn_takes<T>(p, M))
      return onednn_matmuls::instance().run(onednn_type<T>(), M, N, K, {x.data(), K, 1}, {w.data(), 1, K}, y.data(),
                                            N, false, thread_count(p));
  }
#endif
  return false;
}

template <class T>
bool onednn_input_gradient([[maybe_unused]] const policy::simd& p, [[maybe_unused]] cview<T, 2> w,
                           [[maybe_unused]] cview<T, 2> dy, [[maybe_unused]] TensorView<T, 2> dx,
                           [[maybe_unused]] bool add) {
#if defined(DIFFTX_ONEDNN)
  if constexpr (onednn_computes<T>) {
    const index_t M = dy.extent(0), N = dy.extent(1), K = w.extent(1);
    if (onednn_takes<T>(p, M))
      return onednn_matmuls::instance().run(onednn_type<T>(), M, K, N, {dy.data(), N, 1}, {w.data(), K, 1}, dx.data(),
                                            K, add, thread_count(p));
  }
#endif
  return false;
}

template <class T>
bool onednn_weight_gradient([[maybe_unused]] const policy::simd& p, [[maybe_unused]] cview<T, 2> x,
                            [[maybe_unused]] cview<T, 2> dy, [[maybe_unused]] TensorView<T, 2> dw) {
#if defined(DIFFTX_ONEDNN)
  if constexpr (onednn_computes<T>) {
    const index_t M = x.extent(0), K = x.extent(1), N = dy.extent(1);
    if (onednn_takes<T>(p, M))
      return onednn_matmuls::instance().run(onednn_type<T>(), N, K, M, {dy.data(), 1, N}, {x.data(), K, 1}, dw.data(),
                                            K, true, thread_count(p));
  }
#endif
  return false;
}

}  // namespace difftx::simd_detail
