// Linear's products on oneDNN's matmul (onednn_matmul.hpp) where policy::simd
// takes it (matmuls, onednn_takes); each returns false, having written
// nothing, where it does not, and linear.hpp computes the product itself.
//   forward        y[M, N] = x[M, K] · w[N, K]ᵀ
//   input gradient dx[M, K] (=|+=) dy[M, N] · w[N, K]
//   weight gradient dw[N, K] += dy[M, N]ᵀ · x[M, K]
//   int8 weights   sums[M, N] = x8[M, K] · w8[N, K]ᵀ exactly in int32, the
//                  products of linear_int8.hpp (gemm_int8.hpp's own elsewhere)
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "difftx/ops/int8.hpp"
#include "difftx/ops/linear.hpp"
#include "difftx/policy/simd/common.hpp"
#include "difftx/policy/simd/gemm_int8.hpp"
#include "difftx/policy/simd/onednn_matmul.hpp"

namespace difftx::simd_detail {

#if defined(DIFFTX_ONEDNN)
// Whether automatic takes oneDNN for T: where its kernels were measured faster
// than difftx's own products (docs/benchmarks.md, "Linear's products against
// oneDNN and PyTorch"): float and bfloat16 on Zen 4 (brgemm on AVX-512 and
// AVX512_BF16) and on an AMX Xeon. float16 (kernels only with AVX512_FP16)
// has not been measured: forced only.
// int8 weights' products (T = std::int8_t) were measured on Zen 4 (oneDNN's
// u8·s8 brgemm on AVX512_VNNI); on an AMX Xeon oneDNN picks AMX-INT8 itself;
// CPUs without VNNI never take them (onednn_int8_exact).
template <class T>
constexpr bool onednn_measured_faster() {
  return std::is_same_v<T, float> || std::is_same_v<T, Eigen::bfloat16> || std::is_same_v<T, std::int8_t>;
}
// Below this many rows difftx's int8 kernels were measured faster than
// oneDNN's on Zen 4 (docs/design.md, "oneDNN's matmul"): automatic keeps them.
inline constexpr index_t onednn_int8_min_rows = 32;

// The types of oneDNN's product for Linear in T (std::int8_t: int8 weights).
template <class T>
constexpr matmul_types onednn_types() {
  if constexpr (std::is_same_v<T, std::int8_t>) return int8_products_types;
  else return matmul_types::all(onednn_type<T>());
}
#endif

// The rows of a prefill or training product, for asking what such a product runs on.
inline constexpr index_t many_rows = 4096;

// Whether oneDNN multiplies a product of M rows in T (std::int8_t: int8
// weights) under p: never decoding's few rows (difftx's GEMV streams the
// weights once), never without the library, int8 only where its sums are exact.
template <class T>
bool onednn_takes([[maybe_unused]] const policy::simd& p, [[maybe_unused]] index_t M) {
#if defined(DIFFTX_ONEDNN)
  if constexpr (onednn_computes<T> || std::is_same_v<T, std::int8_t>) {
    using library = policy::simd::matmul_library;
    if (M <= gemv_max_rows || p.matmuls == library::difftx) return false;
    if constexpr (std::is_same_v<T, std::int8_t>) {
      if (!onednn_int8_exact()) return false;  // forced too: difftx's int8 kernels are exact everywhere
      if (p.matmuls == library::automatic && M < onednn_int8_min_rows) return false;
    }
    return p.matmuls == library::onednn || onednn_measured_faster<T>();
  }
#endif
  return false;
}

}  // namespace difftx::simd_detail

template <class T>
std::string difftx::policy::simd::matmul_kernel() const {
#if defined(DIFFTX_ONEDNN)
  if (simd_detail::onednn_takes<T>(*this, simd_detail::many_rows))
    if (const auto kernel = simd_detail::onednn_matmuls::instance().implementation(simd_detail::onednn_types<T>(),
                                                                                   simd_detail::thread_count(*this));
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
      return onednn_matmuls::instance().run(onednn_types<T>(), M, N, K, {x.data(), K, 1}, {w.data(), 1, K}, y.data(),
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
      return onednn_matmuls::instance().run(onednn_types<T>(), M, K, N, {dy.data(), N, 1}, {w.data(), K, 1}, dx.data(),
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
      return onednn_matmuls::instance().run(onednn_types<T>(), N, K, M, {dy.data(), 1, N}, {x.data(), K, 1}, dw.data(),
                                            K, true, thread_count(p));
  }
#endif
  return false;
}

// The exact int8 sums of a's rows with b's (same padding) on oneDNN, handed to
// store(i, j0, n, sums) as gemm_int8.hpp's int8_products hands them: in blocks
// of columns (16 MiB of sums, or 64 columns past 64k rows), each block's rows
// stored on the policy's threads. a goes in offset to unsigned bytes (a + 128, u8 · s8: the
// products x86's int8 instructions make, vpdpbusd and AMX's tdpbusd) and each
// sum comes out less 128·Σ_p b[j, p] (gemm_int8.hpp's helpers for both). False
// where oneDNN does not take the product; then, or if a block has no kernel,
// the caller's int8_products computes every sum again.
template <class A, class Store>
bool onednn_int8_products([[maybe_unused]] const policy::simd& p, [[maybe_unused]] const int8_rows<A>& a,
                          [[maybe_unused]] const int8_rows<A>& b, [[maybe_unused]] Store&& store) {
#if defined(DIFFTX_ONEDNN)
  const index_t M = a.rows, N = b.rows, kp = a.padded;
  if (!onednn_takes<std::int8_t>(p, M)) return false;
  const int threads = thread_count(p);
  const auto offset = offset_to_unsigned(p, a);
  constexpr index_t block_sums = index_t{4} << 20;
  const index_t width = std::min(N, std::max<index_t>(64, block_sums / M / 64 * 64));
  aligned_vector<std::int32_t> sums(static_cast<std::size_t>(M * width));
  for (index_t j0 = 0; j0 < N; j0 += width) {
    const index_t n = std::min(width, N - j0);
    if (!onednn_matmuls::instance().run(int8_products_types, M, n, kp, {offset.data(), kp, 1}, {b.row(j0), 1, kp},
                                        sums.data(), n, false, threads))
      return false;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (index_t i = 0; i < M; ++i) {
      std::int32_t* row = sums.data() + i * n;
      remove_unsigned_offset(row, b, j0, n);
      store(i, j0, n, static_cast<const std::int32_t*>(row));
    }
  }
  return true;
#else
  return false;
#endif
}

}  // namespace difftx::simd_detail
