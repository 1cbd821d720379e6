// Reference rotary position embedding (formulas in difftx/ops/rope.hpp).
#pragma once

#include <cmath>

#include "difftx/ops/rope.hpp"
#include "difftx/policy/reference/tag.hpp"

namespace difftx {

namespace detail {
// Rotates every interleaved pair of x[B, N, V, d] by sign · angle(p, i).
template <Scalar T>
void rope_rotate(TensorView<T, 4> x, index_t offset, double theta, const rope_scaling& scaling, double sign) {
  using A = accum_t<T>;
  const index_t B = x.extent(0), N = x.extent(1), V = x.extent(2), d = x.extent(3);
  for (index_t n = 0; n < N; ++n)
    for (index_t i = 0; i < d / 2; ++i) {
      // The angle is a constant of the position, computed in double whatever T is.
      const double angle = static_cast<double>(offset + n) * rope_inverse_frequency(theta, scaling, i, d);
      const A c(std::cos(angle)), s(sign * std::sin(angle));
      for (index_t b = 0; b < B; ++b)
        for (index_t v = 0; v < V; ++v) {
          const A x0 = load(x(b, n, v, 2 * i)), x1 = load(x(b, n, v, 2 * i + 1));
          x(b, n, v, 2 * i) = store<T>(x0 * c - x1 * s);
          x(b, n, v, 2 * i + 1) = store<T>(x0 * s + x1 * c);
        }
    }
}
}  // namespace detail

// x[B, N, V, d] rotated in place by the angle of each position.
template <Scalar T>
void rope_forward(const policy::reference&, TensorView<T, 4> x, index_t offset, double theta,
                  const rope_scaling& scaling = {}) {
  detail::check_rope("rope_forward", memory_space::host, x, "x", offset, theta, scaling);
  detail::rope_rotate(x, offset, theta, scaling, +1.0);
}

// dx[B, N, V, d] (given as dy, in place) = rotation by the negated angle.
template <Scalar T>
void rope_backward(const policy::reference&, TensorView<T, 4> dx, index_t offset, double theta,
                  const rope_scaling& scaling = {}) {
  detail::check_rope("rope_backward", memory_space::host, dx, "dx", offset, theta, scaling);
  detail::rope_rotate(dx, offset, theta, scaling, -1.0);
}

}  // namespace difftx
