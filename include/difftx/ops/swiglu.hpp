// The SwiGLU gate between the projections: h = swish(g) ⊙ u, swish(z) = z σ(z).
//   forward : g[M, F], u[M, F] -> h[M, F]
//   backward: dg = dh ⊙ u ⊙ σ(g) (1 + g (1 - σ(g))),  du = dh ⊙ swish(g)  (assign)
// The projections around it (gate_proj, up_proj, down_proj) are linear ops.
#pragma once

#include "difftx/ops/common.hpp"

namespace difftx::detail {

template <class G, class U, class H>
void check_swiglu_gate(std::string_view where, const G& g, const U& u, const H& h, const char* h_name) {
  require_nonempty(where, "g", g);
  require_shape(where, "u", u, g.shape());
  require_shape(where, h_name, h, g.shape());
}

}  // namespace difftx::detail
