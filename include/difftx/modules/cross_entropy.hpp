// CrossEntropyLoss<T, Policy>: the mean softmax cross-entropy of logits
// [B, N, V] against targets [B, N], over the positions whose target is >= 0
// (a negative target masks its position out). Formulas in ops/cross_entropy.hpp.
// No parameters.
#pragma once

#include <string_view>

#include "difftx/core/checks.hpp"
#include "difftx/ops/cross_entropy.hpp"
#include "difftx/policy/reference.hpp"

namespace difftx {

template <Scalar T, class Policy = policy::reference>
  requires supported_by<Policy, T>
class CrossEntropyLoss {
 public:
  using value_type = T;
  using policy_type = Policy;
  struct saved_type {
    shape_t<3> input_shape{};
    Tensor<accum_t<T>, 1> lse;   // [B·N] log-sum-exp of each row of logits
    Tensor<accum_t<T>, 1> loss;  // [1]
  };

  explicit CrossEntropyLoss(Policy policy = {}) : policy_(std::move(policy)) {}

  // logits [B, N, V], targets [B, N] (each < V; negative: ignored) -> the mean loss
  double forward(cview<T, 3> logits, cview<token_t, 2> targets, saved_type& s) const {
    constexpr std::string_view where = "CrossEntropyLoss::forward";
    require_nonempty(where, "logits", logits);
    require_shape(where, "targets", targets, {logits.extent(0), logits.extent(1)});
    const index_t M = logits.extent(0) * logits.extent(1);
    s.lse.resize({M}, policy_.memory());
    s.loss.resize({1}, policy_.memory());
    cross_entropy_forward<T>(policy_, flatten_rows(logits), flat(targets), s.loss.view(), s.lse.view());
    s.input_shape = logits.shape();
    if (s.loss.space() == memory_space::host) return static_cast<double>(s.loss(0));
    accum_t<T> loss{};  // in device memory: read it back (this waits for the forward)
    policy_.memory().download(&loss, s.loss.data(), sizeof loss);
    return static_cast<double>(loss);
  }

  // dloss: the gradient at the loss (1 for the loss itself) -> dlogits [B, N, V] (assign)
  void backward(cview<T, 3> logits, cview<token_t, 2> targets, const saved_type& s, TensorView<T, 3> dlogits,
                double dloss = 1.0) const {
    constexpr std::string_view where = "CrossEntropyLoss::backward";
    require_nonempty(where, "logits", logits);
    require_saved(where, s.input_shape, logits.shape());
    require_shape(where, "targets", targets, {logits.extent(0), logits.extent(1)});
    require_shape(where, "dlogits", dlogits, logits.shape());
    cross_entropy_backward(policy_, flatten_rows(logits), flat(targets), s.lse.const_view(), dloss, flatten_rows(dlogits));
  }

  const Policy& policy() const noexcept { return policy_; }

 private:
  static cview<token_t, 1> flat(const cview<token_t, 2>& t) { return t.template reshape<1>({t.size()}); }
  Policy policy_;
};

}  // namespace difftx
