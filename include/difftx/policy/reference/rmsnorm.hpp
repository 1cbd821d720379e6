// Reference RMSNorm forward/backward (shapes and formulas in difftx/ops/rmsnorm.hpp).
#pragma once

#include <limits>
#include <vector>

#include "difftx/ops/rmsnorm.hpp"
#include "difftx/policy/reference/tag.hpp"

namespace difftx {

// x[M, C], w[C] -> y[M, C] = scale · x · rstd · w,  rstd[M]
template <Scalar T>
void rmsnorm_forward(const policy::reference&, cview<T, 2> x, cview<T, 1> w, double eps, double scale,
                     TensorView<T, 2> y, TensorView<accum_t<T>, 1> rstd) {
  constexpr std::string_view where = "rmsnorm_forward";
  detail::check_rmsnorm(where, memory_space::host, x, w, y, rstd, "y");
  using A = accum_t<T>;
  const index_t M = x.extent(0), C = x.extent(1);
  const A s(scale);
  for (index_t m = 0; m < M; ++m) {
    A sum_sq(0.0);
    for (index_t c = 0; c < C; ++c) sum_sq = sum_sq + load(x(m, c)) * load(x(m, c));
    A r = A(1.0) / scalar_traits<T>::sqrt(sum_sq / A(static_cast<double>(C)) + A(eps));
    if (!(sum_sq < A(std::numeric_limits<double>::max()))) {  // overflowed (or merely large): rescale
      A largest(0.0);
      for (index_t c = 0; c < C; ++c) {
        const A v = load(x(m, c)), magnitude = v < A(0.0) ? -v : v;
        if (largest < magnitude) largest = magnitude;
      }
      A scaled_sq(0.0);
      for (index_t c = 0; c < C; ++c) scaled_sq = scaled_sq + (load(x(m, c)) / largest) * (load(x(m, c)) / largest);
      r = A(1.0) / (largest * scalar_traits<T>::sqrt(scaled_sq / A(static_cast<double>(C)) + A(eps) / (largest * largest)));
    }
    rstd(m) = r;
    for (index_t c = 0; c < C; ++c) y(m, c) = store<T>(s * load(x(m, c)) * r * load(w(c)));
  }
}

// dy[M, C] -> dx[M, C] (assign), dw[C] (+=)
template <Scalar T>
void rmsnorm_backward(const policy::reference&, cview<T, 2> x, cview<T, 1> w, cview<accum_t<T>, 1> rstd,
                      double scale, cview<T, 2> dy, TensorView<T, 2> dx, TensorView<T, 1> dw) {
  constexpr std::string_view where = "rmsnorm_backward";
  detail::check_rmsnorm_backward(where, memory_space::host, x, w, rstd, dy, dx, dw);
  using A = accum_t<T>;
  const index_t M = x.extent(0), C = x.extent(1);
  const A s(scale);
  std::vector<A> dw_acc(static_cast<std::size_t>(C), A(0.0));
  for (index_t m = 0; m < M; ++m) {
    const A r = rstd(m);
    A mean_g_xhat(0.0);
    for (index_t c = 0; c < C; ++c) {
      const A xhat = load(x(m, c)) * r;
      const A g = s * load(w(c)) * load(dy(m, c));
      mean_g_xhat = mean_g_xhat + g * xhat;
      dw_acc[static_cast<std::size_t>(c)] = dw_acc[static_cast<std::size_t>(c)] + s * load(dy(m, c)) * xhat;
    }
    mean_g_xhat = mean_g_xhat / A(static_cast<double>(C));
    for (index_t c = 0; c < C; ++c) {
      const A xhat = load(x(m, c)) * r;
      const A g = s * load(w(c)) * load(dy(m, c));
      dx(m, c) = store<T>(r * (g - xhat * mean_g_xhat));
    }
  }
  for (index_t c = 0; c < C; ++c) dw(c) = store<T>(load(dw(c)) + dw_acc[static_cast<std::size_t>(c)]);
}

}  // namespace difftx
