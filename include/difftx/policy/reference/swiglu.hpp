// Reference SwiGLU gate (formulas in difftx/ops/swiglu.hpp).
#pragma once

#include "difftx/ops/swiglu.hpp"
#include "difftx/policy/reference/tag.hpp"

namespace difftx {

// h[M, F] = swish(g) ⊙ u
template <Scalar T>
void swiglu_gate_forward(const policy::reference&, cview<T, 2> g, cview<T, 2> u, TensorView<T, 2> h) {
  constexpr std::string_view where = "swiglu_gate_forward";
  detail::check_swiglu_gate(where, memory_space::host, g, u, h, "h");
  const index_t M = g.extent(0), F = g.extent(1);
  for (index_t m = 0; m < M; ++m)
    for (index_t f = 0; f < F; ++f) {
      const auto z = load(g(m, f));
      h(m, f) = store<T>(z * detail::sigmoid<T>(z) * load(u(m, f)));
    }
}

// dh[M, F] -> dg, du (assign)
template <Scalar T>
void swiglu_gate_backward(const policy::reference&, cview<T, 2> g, cview<T, 2> u, cview<T, 2> dh,
                          TensorView<T, 2> dg, TensorView<T, 2> du) {
  constexpr std::string_view where = "swiglu_gate_backward";
  detail::check_swiglu_gate_backward(where, memory_space::host, g, u, dh, dg, du);
  using A = accum_t<T>;
  const index_t M = g.extent(0), F = g.extent(1);
  for (index_t m = 0; m < M; ++m)
    for (index_t f = 0; f < F; ++f) {
      const A z = load(g(m, f)), sig = detail::sigmoid<T>(z), grad = load(dh(m, f));
      dg(m, f) = store<T>(grad * load(u(m, f)) * sig * (A(1.0) + z * (A(1.0) - sig)));
      du(m, f) = store<T>(grad * z * sig);
    }
}

}  // namespace difftx
