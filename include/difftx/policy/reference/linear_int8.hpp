// Reference linear forward with int8 weights (formula in difftx/ops/linear.hpp):
// each row of x quantized (ops/int8.hpp), exact integer sums, two products.
#pragma once

#include <cstdint>
#include <vector>

#include "difftx/ops/int8.hpp"
#include "difftx/ops/linear.hpp"
#include "difftx/policy/reference/tag.hpp"

namespace difftx {

// y[M, N] = (x[M, K] quantized per row) · w8[N, K]^T, scaled
template <Scalar T>
void linear_forward(const policy::reference&, cview<T, 2> x, const int8_rows<accum_t<T>>& w, TensorView<T, 2> y) {
  using A = accum_t<T>;
  constexpr std::string_view where = "linear_forward";
  detail::check_linear_stored(where, memory_space::host, x, w, y, "int8 weights");
  detail::require_int8_arithmetic<A>(where, "x");
  if constexpr (std::is_floating_point_v<A>) {
    const index_t M = x.extent(0), K = x.extent(1), N = w.rows;
    std::vector<A> row(static_cast<std::size_t>(K));
    std::vector<std::int8_t> x8(static_cast<std::size_t>(K));
    for (index_t m = 0; m < M; ++m) {
      for (index_t k = 0; k < K; ++k) row[static_cast<std::size_t>(k)] = load(x(m, k));
      const A step = detail::quantize_int8(row.data(), K, x8.data());
      for (index_t n = 0; n < N; ++n) {
        std::int32_t sum = 0;
        for (index_t k = 0; k < K; ++k) sum += std::int32_t{x8[static_cast<std::size_t>(k)]} * std::int32_t{w.row(n)[k]};
        y(m, n) = store<T>(A(sum) * step * w.steps[static_cast<std::size_t>(n)]);
      }
    }
  }
}

}  // namespace difftx
