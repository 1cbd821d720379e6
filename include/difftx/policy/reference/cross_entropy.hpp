// Reference softmax cross-entropy (formulas in difftx/ops/cross_entropy.hpp).
#pragma once

#include "difftx/ops/cross_entropy.hpp"
#include "difftx/policy/reference/tag.hpp"

namespace difftx {

namespace detail {
template <class Tg>
index_t counted_targets(const Tg& targets) {
  index_t count = 0;
  for (index_t m = 0; m < targets.size(); ++m) count += targets.data()[m] >= 0 ? 1 : 0;
  return count;
}
}  // namespace detail

// logits[M, V], targets[M] -> loss[1] (mean over rows with a target >= 0), lse[M].
// No output has type T, so callers name it: cross_entropy_forward<T>(policy, ...).
template <Scalar T>
void cross_entropy_forward(const policy::reference&, cview<T, 2> logits, cview<token_t, 1> targets,
                           TensorView<accum_t<T>, 1> loss, TensorView<accum_t<T>, 1> lse) {
  constexpr std::string_view where = "cross_entropy_forward";
  detail::check_cross_entropy(where, memory_space::host, logits, targets, loss, lse);
  detail::check_token_range(where, "targets", targets, logits.extent(1), true);
  using A = accum_t<T>;
  const index_t M = logits.extent(0), V = logits.extent(1);
  A total(0.0);
  for (index_t m = 0; m < M; ++m) {
    A row_max = load(logits(m, 0));
    for (index_t v = 1; v < V; ++v)
      if (row_max < load(logits(m, v))) row_max = load(logits(m, v));
    A sum(0.0);
    for (index_t v = 0; v < V; ++v) sum = sum + scalar_traits<T>::exp(load(logits(m, v)) - row_max);
    lse(m) = row_max + scalar_traits<T>::log(sum);
    if (targets(m) >= 0) total = total + (lse(m) - load(logits(m, targets(m))));
  }
  const index_t count = detail::counted_targets(targets);
  loss(0) = count > 0 ? total / A(static_cast<double>(count)) : A(0.0);
}

// dloss (the gradient at loss[0]) -> dlogits[M, V] (assign)
template <Scalar T>
void cross_entropy_backward(const policy::reference&, cview<T, 2> logits, cview<token_t, 1> targets,
                            cview<accum_t<T>, 1> lse, double dloss, TensorView<T, 2> dlogits) {
  constexpr std::string_view where = "cross_entropy_backward";
  detail::check_cross_entropy_backward(where, memory_space::host, logits, targets, lse, dlogits);
  detail::check_token_range(where, "targets", targets, logits.extent(1), true);
  using A = accum_t<T>;
  const index_t M = logits.extent(0), V = logits.extent(1);
  const index_t count = detail::counted_targets(targets);
  const A scale = count > 0 ? A(dloss / static_cast<double>(count)) : A(0.0);
  for (index_t m = 0; m < M; ++m) {
    const index_t t = targets(m);
    for (index_t v = 0; v < V; ++v) {
      if (t < 0) {
        dlogits(m, v) = store<T>(A(0.0));
        continue;
      }
      const A p = scalar_traits<T>::exp(load(logits(m, v)) - lse(m));
      dlogits(m, v) = store<T>(scale * (v == t ? p - A(1.0) : p));
    }
  }
}

}  // namespace difftx
