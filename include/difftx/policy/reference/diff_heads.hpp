// Reference V2 head combination (formulas in difftx/ops/diff_heads.hpp).
#pragma once

#include "difftx/ops/diff_heads.hpp"
#include "difftx/policy/reference/tag.hpp"

namespace difftx {

// a[M, 2h, D], z[M, h] -> o[M, h, D]
template <Scalar T>
void diff_heads_forward(const policy::reference&, cview<T, 3> a, cview<T, 2> z, TensorView<T, 3> o) {
  detail::check_diff_heads("diff_heads_forward", memory_space::host, a, z, o, "o");
  const index_t M = o.extent(0), h = o.extent(1), D = o.extent(2);
  for (index_t m = 0; m < M; ++m)
    for (index_t i = 0; i < h; ++i) {
      const auto lambda = detail::sigmoid<T>(load(z(m, i)));
      for (index_t c = 0; c < D; ++c) o(m, i, c) = store<T>(load(a(m, 2 * i, c)) - lambda * load(a(m, 2 * i + 1, c)));
    }
}

// do[M, h, D] -> da[M, 2h, D], dz[M, h] (assign)
template <Scalar T>
void diff_heads_backward(const policy::reference&, cview<T, 3> a, cview<T, 2> z, cview<T, 3> d_o, TensorView<T, 3> da,
                         TensorView<T, 2> dz) {
  detail::check_diff_heads_backward("diff_heads_backward", memory_space::host, a, z, d_o, da, dz);
  using A = accum_t<T>;
  const index_t M = d_o.extent(0), h = d_o.extent(1), D = d_o.extent(2);
  for (index_t m = 0; m < M; ++m)
    for (index_t i = 0; i < h; ++i) {
      const A lambda = detail::sigmoid<T>(load(z(m, i)));
      A dot(0.0);
      for (index_t c = 0; c < D; ++c) {
        const A grad = load(d_o(m, i, c));
        dot += grad * load(a(m, 2 * i + 1, c));
        da(m, 2 * i, c) = d_o(m, i, c);
        da(m, 2 * i + 1, c) = store<T>(-lambda * grad);
      }
      dz(m, i) = store<T>(-lambda * (A(1.0) - lambda) * dot);
    }
}

}  // namespace difftx
