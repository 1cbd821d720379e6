// Reference rotary position embedding (formulas in difftx/ops/rope.hpp).
#pragma once

#include <cmath>
#include <utility>

#include "difftx/ops/rope.hpp"
#include "difftx/policy/reference/tag.hpp"

namespace difftx {

namespace detail {
// Rotates every interleaved pair i of x[B, N, V, d] at position p by
// cos_sin(p, i) = (c, s), s times sign.
template <Scalar T, class CosSin>
void rope_rotate(TensorView<T, 4> x, index_t offset, CosSin&& cos_sin, double sign) {
  using A = accum_t<T>;
  const index_t B = x.extent(0), N = x.extent(1), V = x.extent(2), d = x.extent(3);
  for (index_t n = 0; n < N; ++n)
    for (index_t i = 0; i < d / 2; ++i) {
      const auto [c, s_unsigned] = cos_sin(offset + n, i);
      const A s = sign < 0 ? -s_unsigned : s_unsigned;
      for (index_t b = 0; b < B; ++b)
        for (index_t v = 0; v < V; ++v) {
          const A x0 = load(x(b, n, v, 2 * i)), x1 = load(x(b, n, v, 2 * i + 1));
          x(b, n, v, 2 * i) = store<T>(x0 * c - x1 * s);
          x(b, n, v, 2 * i + 1) = store<T>(x0 * s + x1 * c);
        }
    }
}
// The angle's cosine and sine from theta: a constant of the position,
// computed in double whatever T is.
template <Scalar T>
auto rope_angles(index_t d, double theta, const rope_scaling& scaling) {
  return [=](index_t position, index_t i) {
    using A = accum_t<T>;
    const double angle = static_cast<double>(position) * rope_inverse_frequency(theta, scaling, i, d);
    return std::pair{A(std::cos(angle)), A(std::sin(angle))};
  };
}
// The cosine and sine a caller's table holds.
template <class A>
auto rope_table_entries(const rope_table<A>& table) {
  return [&table](index_t position, index_t i) { return std::pair{table.cos(position, i), table.sin(position, i)}; };
}
}  // namespace detail

// x[B, N, V, d] rotated in place by the angle of each position.
template <Scalar T>
void rope_forward(const policy::reference&, TensorView<T, 4> x, index_t offset, double theta,
                  const rope_scaling& scaling = {}) {
  detail::check_rope("rope_forward", memory_space::host, x, "x", offset, theta, scaling);
  detail::rope_rotate(x, offset, detail::rope_angles<T>(x.extent(3), theta, scaling), +1.0);
}

// dx[B, N, V, d] (given as dy, in place) = rotation by the negated angle.
template <Scalar T>
void rope_backward(const policy::reference&, TensorView<T, 4> dx, index_t offset, double theta,
                  const rope_scaling& scaling = {}) {
  detail::check_rope("rope_backward", memory_space::host, dx, "dx", offset, theta, scaling);
  detail::rope_rotate(dx, offset, detail::rope_angles<T>(dx.extent(3), theta, scaling), -1.0);
}

// The same with a caller's cos and sin tables (ops/rope.hpp, rope_table).
template <Scalar T>
void rope_forward(const policy::reference&, TensorView<T, 4> x, index_t offset, const rope_table<accum_t<T>>& table) {
  detail::check_rope("rope_forward", memory_space::host, x, "x", offset, table);
  detail::rope_rotate(x, offset, detail::rope_table_entries(table), +1.0);
}
template <Scalar T>
void rope_backward(const policy::reference&, TensorView<T, 4> dx, index_t offset,
                   const rope_table<accum_t<T>>& table) {
  detail::check_rope("rope_backward", memory_space::host, dx, "dx", offset, table);
  detail::rope_rotate(dx, offset, detail::rope_table_entries(table), -1.0);
}

}  // namespace difftx
