// The re-parameterised lambda of differential attention.
//   forward : lambda[1] = exp(lq1 · lk1) - exp(lq2 · lk2) + lambda_init,
//             lq1, lk1, lq2, lk2 [d]
//   backward: with e1 = exp(lq1 · lk1), e2 = exp(lq2 · lk2):
//             dlq1 += dlambda e1 lk1,  dlk1 += dlambda e1 lq1,
//             dlq2 -= dlambda e2 lk2,  dlk2 -= dlambda e2 lq2
// lambda_init = 0.8 - 0.6 exp(-0.3 l) for layer index l (see lambda_init()).
// The forward computes e1 - e2 as ±exp(max) · (1 - exp(-|a - b|)) for the two
// dot products a, b: equal products cancel to exactly 0 even where exp
// overflows, and the difference overflows only where its true value does.
// The backward needs e1 and e2 themselves, which overflow with them.
#pragma once

#include <cmath>

#include "difftx/ops/common.hpp"

namespace difftx {

inline double lambda_init(index_t layer_index) noexcept {
  return 0.8 - 0.6 * std::exp(-0.3 * static_cast<double>(layer_index));
}

namespace detail {

// Shapes, and that every tensor lies in `space`.
template <class P, class L>
void check_diff_lambda(std::string_view where, memory_space space, const P& lq1, const P& lk1, const P& lq2,
                       const P& lk2, const L& lambda, const char* lambda_name) {
  require_nonempty(where, "lambda_q1", lq1);
  require_shape(where, "lambda_k1", lk1, lq1.shape());
  require_shape(where, "lambda_q2", lq2, lq1.shape());
  require_shape(where, "lambda_k2", lk2, lq1.shape());
  require_shape(where, lambda_name, lambda, {1});
  require_all_in(where, space,
                 {{"lambda_q1", lq1.space()}, {"lambda_k1", lk1.space()}, {"lambda_q2", lq2.space()},
                  {"lambda_k2", lk2.space()}, {lambda_name, lambda.space()}});
}

template <class P, class L, class G>
void check_diff_lambda_backward(std::string_view where, memory_space space, const P& lq1, const P& lk1, const P& lq2,
                                const P& lk2, const L& dlambda, const G& dlq1, const G& dlk1, const G& dlq2,
                                const G& dlk2) {
  check_diff_lambda(where, space, lq1, lk1, lq2, lk2, dlambda, "dlambda");
  require_shape(where, "dlambda_q1", dlq1, lq1.shape());
  require_shape(where, "dlambda_k1", dlk1, lq1.shape());
  require_shape(where, "dlambda_q2", dlq2, lq1.shape());
  require_shape(where, "dlambda_k2", dlk2, lq1.shape());
  require_all_in(where, space,
                 {{"dlambda_q1", dlq1.space()}, {"dlambda_k1", dlk1.space()}, {"dlambda_q2", dlq2.space()},
                  {"dlambda_k2", dlk2.space()}});
}

}  // namespace detail
}  // namespace difftx
