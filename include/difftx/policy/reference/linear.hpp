// Reference linear forward/backward (shapes in difftx/ops/linear.hpp).
#pragma once

#include "difftx/ops/linear.hpp"
#include "difftx/policy/reference/tag.hpp"

namespace difftx {

// y[M, N] = x[M, K] · w[N, K]^T
template <Scalar T>
void linear_forward(const policy::reference&, cview<T, 2> x, cview<T, 2> w, TensorView<T, 2> y) {
  constexpr std::string_view where = "linear_forward";
  detail::check_linear(where, memory_space::host, x, w, y, "y");
  using A = accum_t<T>;
  const index_t M = x.extent(0), K = x.extent(1), N = w.extent(0);
  for (index_t m = 0; m < M; ++m)
    for (index_t n = 0; n < N; ++n) {
      A acc(0.0);
      for (index_t k = 0; k < K; ++k) acc = acc + load(x(m, k)) * load(w(n, k));
      y(m, n) = store<T>(acc);
    }
}

// dx[M, K] (=|+=) dy[M, N] · w[N, K];  dw[N, K] += dy^T · x
template <Scalar T>
void linear_backward(const policy::reference&, cview<T, 2> x, cview<T, 2> w, cview<T, 2> dy, TensorView<T, 2> dx,
                     TensorView<T, 2> dw, write_mode dx_mode = write_mode::assign) {
  constexpr std::string_view where = "linear_backward";
  detail::check_linear_backward(where, memory_space::host, x, w, dy, dx, dw);
  using A = accum_t<T>;
  const index_t M = x.extent(0), K = x.extent(1), N = w.extent(0);
  for (index_t m = 0; m < M; ++m)
    for (index_t k = 0; k < K; ++k) {
      A acc = dx_mode == write_mode::add ? load(dx(m, k)) : A(0.0);
      for (index_t n = 0; n < N; ++n) acc = acc + load(dy(m, n)) * load(w(n, k));
      dx(m, k) = store<T>(acc);
    }
  for (index_t n = 0; n < N; ++n)
    for (index_t k = 0; k < K; ++k) {
      A acc = load(dw(n, k));
      for (index_t m = 0; m < M; ++m) acc = acc + load(dy(m, n)) * load(x(m, k));
      dw(n, k) = store<T>(acc);
    }
}

}  // namespace difftx
