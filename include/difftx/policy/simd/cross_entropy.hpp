// simd softmax cross-entropy: O(M·V) over the logits, small next to the layers
// that produce them; the reference loops run on the host data as they are.
#pragma once

#include "difftx/policy/reference/cross_entropy.hpp"
#include "difftx/policy/simd/tag.hpp"

namespace difftx {

template <class T>
  requires supported_by<policy::simd, T>
void cross_entropy_forward(const policy::simd&, cview<T, 2> logits, cview<token_t, 1> targets,
                           TensorView<accum_t<T>, 1> loss, TensorView<accum_t<T>, 1> lse) {
  cross_entropy_forward<T>(policy::reference{}, logits, targets, loss, lse);
}

template <class T>
  requires supported_by<policy::simd, T>
void cross_entropy_backward(const policy::simd&, TensorView<const T, 2> logits, cview<token_t, 1> targets,
                            cview<accum_t<T>, 1> lse, double dloss, TensorView<T, 2> dlogits) {
  cross_entropy_backward(policy::reference{}, logits, targets, lse, dloss, dlogits);
}

}  // namespace difftx
