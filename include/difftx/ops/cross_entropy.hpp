// Softmax cross-entropy over chosen rows: the loss of a language model's logits
// at its target positions. A negative target ignores its row (no loss, zero
// gradient), so one call scores only the positions that carry an answer.
//   forward : lse[m] = log sum_v exp(z[m, v])                         z = logits [M, V]
//             loss[0] = (1 / K) sum_{m : t_m >= 0} (lse[m] - z[m, t_m]),   K = #{m : t_m >= 0}
//   backward: dz[m, v] = dloss / K · (softmax(z_m)_v - [v = t_m])   for t_m >= 0   (assign)
//             dz[m, :] = 0                                           for t_m < 0
// softmax(z_m)_v = exp(z[m, v] - lse[m]); lse is saved in the accumulation type.
// With K = 0 the loss is 0 and every gradient 0. Targets must be < V.
#pragma once

#include "difftx/ops/common.hpp"
#include "difftx/ops/embedding.hpp"

namespace difftx::detail {

template <class Z, class Tg, class L, class S>
void check_cross_entropy(std::string_view where, memory_space space, const Z& logits, const Tg& targets, const L& loss,
                         const S& lse) {
  require_nonempty(where, "logits", logits);
  require_shape(where, "targets", targets, {logits.extent(0)});
  require_shape(where, "loss", loss, {1});
  require_shape(where, "lse", lse, {logits.extent(0)});
  require_all_in(where, space,
                 {{"logits", logits.space()}, {"targets", targets.space()}, {"loss", loss.space()}, {"lse", lse.space()}});
}

template <class Z, class Tg, class S, class DZ>
void check_cross_entropy_backward(std::string_view where, memory_space space, const Z& logits, const Tg& targets,
                                  const S& lse, const DZ& dlogits) {
  require_nonempty(where, "logits", logits);
  require_shape(where, "targets", targets, {logits.extent(0)});
  require_shape(where, "lse", lse, {logits.extent(0)});
  require_shape(where, "dlogits", dlogits, logits.shape());
  require_all_in(where, space, {{"logits", logits.space()}, {"targets", targets.space()}, {"lse", lse.space()},
                                {"dlogits", dlogits.space()}});
}

}  // namespace difftx::detail
