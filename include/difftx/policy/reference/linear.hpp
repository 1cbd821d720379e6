// Reference linear forward/backward (shapes in difftx/ops/linear.hpp).
#pragma once

#include "difftx/ops/linear.hpp"
#include "difftx/policy/reference/tag.hpp"

namespace difftx {

namespace detail {
// y[m, n] = Σ_k x[m, k] · w_at(n, k), summed left to right in A
template <class T, class WeightAt>
void reference_products(cview<T, 2> x, index_t N, WeightAt&& w_at, TensorView<T, 2> y) {
  using A = accum_t<T>;
  const index_t M = x.extent(0), K = x.extent(1);
  for (index_t m = 0; m < M; ++m)
    for (index_t n = 0; n < N; ++n) {
      A acc(0.0);
      for (index_t k = 0; k < K; ++k) acc = acc + load(x(m, k)) * load(w_at(n, k));
      y(m, n) = store<T>(acc);
    }
}
}  // namespace detail

// y[M, N] = x[M, K] · w[N, K]^T
template <Scalar T>
void linear_forward(const policy::reference&, cview<T, 2> x, cview<T, 2> w, TensorView<T, 2> y) {
  detail::check_linear("linear_forward", memory_space::host, x, w, y, "y");
  detail::reference_products(x, w.extent(0), [&](index_t n, index_t k) { return w(n, k); }, y);
}

// y[M, N] = x[M, K] · w^T with w as decoding panels (M ≤ max_rows): the same sums in the same order
template <Scalar T>
void linear_forward(const policy::reference&, cview<T, 2> x, const decoding_panels<T>& w, TensorView<T, 2> y) {
  detail::check_linear_panels("linear_forward", memory_space::host, x, w, y);
  detail::reference_products(x, w.rows, [&](index_t n, index_t k) { return w.at(n, k); }, y);
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
