// simd lambda re-parameterisation: four dot products of D entries, not worth a
// kernel of its own; the reference loops run on the host data as they are.
#pragma once

#include "difftx/policy/reference/diff_lambda.hpp"
#include "difftx/policy/simd/tag.hpp"

namespace difftx {

template <class T>
  requires supported_by<policy::simd, T>
void diff_lambda_forward(const policy::simd&, TensorView<const T, 1> lq1, cview<T, 1> lk1, cview<T, 1> lq2,
                         cview<T, 1> lk2, double lambda_init, TensorView<accum_t<T>, 1> lambda) {
  diff_lambda_forward(policy::reference{}, lq1, lk1, lq2, lk2, lambda_init, lambda);
}

template <class T>
  requires supported_by<policy::simd, T>
void diff_lambda_backward(const policy::simd&, TensorView<const T, 1> lq1, cview<T, 1> lk1, cview<T, 1> lq2,
                          cview<T, 1> lk2, cview<accum_t<T>, 1> dlambda, TensorView<T, 1> dlq1, TensorView<T, 1> dlk1,
                          TensorView<T, 1> dlq2, TensorView<T, 1> dlk2) {
  diff_lambda_backward(policy::reference{}, lq1, lk1, lq2, lk2, dlambda, dlq1, dlk1, dlq2, dlk2);
}

}  // namespace difftx
