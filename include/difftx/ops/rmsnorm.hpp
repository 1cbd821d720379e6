// RMSNorm over the last axis, with an optional constant output scale s (the
// subln's 1 - lambda_init; 1 elsewhere).
//   forward : rstd[M] = 1 / sqrt(mean_c x[M, c]^2 + eps)
//             y[M, C] = s · x · rstd · w[C]
//   backward: g = s · w ⊙ dy,  x̂ = x · rstd
//             dx[M, C] = rstd · (g - x̂ · mean_c(g ⊙ x̂))  (assign)
//             dw[C]   += s · sum_M dy ⊙ x̂
// rstd is kept in the accumulation type: it is what the backward needs.
// A row whose sum of squares overflows the accumulation type (|x| near the
// square root of its largest value, 1.8e19 in float) is summed again scaled
// by its largest |x|, as BLAS's nrm2 does, so rstd is right wherever it is
// representable; the backward uses x̂ = x · rstd, never rstd², for the same reason.
#pragma once

#include "difftx/ops/common.hpp"

namespace difftx::detail {

template <class X, class W, class Y, class R>
void check_rmsnorm(std::string_view where, memory_space space, const X& x, const W& w, const Y& y, const R& rstd,
                   const char* y_name) {
  require_nonempty(where, "x", x);
  require_shape(where, "w", w, {x.extent(1)});
  require_shape(where, y_name, y, x.shape());
  require_shape(where, "rstd", rstd, {x.extent(0)});
  require_all_in(where, space, {{"x", x.space()}, {"w", w.space()}, {y_name, y.space()}, {"rstd", rstd.space()}});
}

template <class X, class W, class R, class DY, class DX, class DW>
void check_rmsnorm_backward(std::string_view where, memory_space space, const X& x, const W& w, const R& rstd,
                            const DY& dy, const DX& dx, const DW& dw) {
  check_rmsnorm(where, space, x, w, dy, rstd, "dy");
  require_shape(where, "dx", dx, x.shape());
  require_shape(where, "dw", dw, w.shape());
  require_all_in(where, space, {{"dx", dx.space()}, {"dw", dw.space()}});
}

}  // namespace difftx::detail
