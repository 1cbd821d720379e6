// policy::simd's products of one x with several weights (ops/linear.hpp's
// linear_part: decoding's q, k and v; gate and up). A few rows of x
// (decoding) are one product: one parallel region, whose slices run over
// every part's rows, and x converted (float16, bfloat16) or quantized (int8
// weights) once. More rows: one product after the other. Either way the same
// bits as one linear_forward a part.
#pragma once

#include <span>
#include <vector>

#include "difftx/ops/linear.hpp"
#include "difftx/policy/simd/linear.hpp"
#include "difftx/policy/simd/linear_int8.hpp"

namespace difftx {

// y_k[M, N_k] = x[M, K] · w_k[N_k, K]^T
template <class T>
  requires supported_by<policy::simd, T>
void linear_forward(const policy::simd& p, cview<T, 2> x, std::span<const linear_part<cview<T, 2>, T>> parts) {
  using namespace simd_detail;
  detail::check_linear_parts("linear_forward", memory_space::host, x, parts);
  const index_t M = x.extent(0), K = x.extent(1);
  if (!decoding_streams<T>(p, M, K)) {
    for (const auto& part : parts) float_linear_forward(p, x, *part.w, nullptr, part.y);
    return;
  }
  std::vector<gemv_part<T>> gemv;
  for (const auto& part : parts) gemv.push_back({part.w->data(), part.w->extent(0), part.y.data()});
  decoding_gemv(p, M, K, x.data(), std::span<const gemv_part<T>>(gemv));
}

// y_k[M, N_k] = (x[M, K] quantized per row) · w8_k[N_k, K]^T, scaled
template <class T>
  requires supported_by<policy::simd, T>
void linear_forward(const policy::simd& p, cview<T, 2> x,
                    std::span<const linear_part<int8_rows<accum_t<T>>, T>> parts) {
  using namespace simd_detail;
  detail::check_linear_parts("linear_forward", memory_space::host, x, parts);
  if (x.extent(0) > gemv_max_rows) {
    for (const auto& part : parts) int8_linear_forward(p, x, *part.w, nullptr, part.y);
    return;
  }
  const auto x8 = quantized_rows<T>(p, x);
  std::vector<const int8_rows<accum_t<T>>*> w;
  for (const auto& part : parts) w.push_back(part.w);
  int8_gemv(p, x8, std::span<const int8_rows<accum_t<T>>* const>(w),
            [&](std::size_t k, index_t m, index_t j0, index_t n, const std::int32_t* sums) {
              store_scaled(x8, *parts[k].w, parts[k].y, m, j0, n, sums);
            });
}

}  // namespace difftx
