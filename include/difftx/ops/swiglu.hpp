// The SwiGLU gate between the projections: h = swish(g) ⊙ u, swish(z) = z σ(z).
//   forward : g[M, F], u[M, F] -> h[M, F]
//   backward: dg = dh ⊙ u ⊙ σ(g) (1 + g (1 - σ(g))),  du = dh ⊙ swish(g)  (assign)
// The projections around it (gate_proj, up_proj, down_proj) are linear ops.
#pragma once

#include "difftx/ops/common.hpp"

namespace difftx::detail {

template <class G, class U, class H>
void check_swiglu_gate(std::string_view where, memory_space space, const G& g, const U& u, const H& h,
                       const char* h_name) {
  require_nonempty(where, "g", g);
  require_shape(where, "u", u, g.shape());
  require_shape(where, h_name, h, g.shape());
  require_all_in(where, space, {{"g", g.space()}, {"u", u.space()}, {h_name, h.space()}});
}

template <class G, class U, class DH, class D>
void check_swiglu_gate_backward(std::string_view where, memory_space space, const G& g, const U& u, const DH& dh,
                                const D& dg, const D& du) {
  check_swiglu_gate(where, space, g, u, dh, "dh");
  require_shape(where, "dg", dg, g.shape());
  require_shape(where, "du", du, g.shape());
  require_all_in(where, space, {{"dg", dg.space()}, {"du", du.space()}});
}

}  // namespace difftx::detail
