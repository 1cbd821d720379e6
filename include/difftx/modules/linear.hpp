// Linear<T, Policy>: y = x W^T with W [out, in] (nn.Linear without bias), the
// projection every other module is built from. Parameter: "weight".
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "difftx/core/checks.hpp"
#include "difftx/modules/parameter.hpp"
#include "difftx/ops/linear.hpp"
#include "difftx/policy/reference.hpp"

namespace difftx {

template <Scalar T, class Policy = policy::reference>
  requires supported_by<Policy, T>
class Linear {

 public:
  using value_type = T;
  using policy_type = Policy;
  // x is all the backward needs, and the caller passes it again.
  struct saved_type {
    shape_t<3> input_shape{};
  };

  Linear(index_t in_features, index_t out_features, Policy policy = {})
      : policy_(std::move(policy)), in_(in_features), out_(out_features), weight_(checked_shape(in_, out_), policy_.memory()) {}

  index_t in_features() const noexcept { return in_; }
  index_t out_features() const noexcept { return out_; }
  shape_t<3> output_shape(const shape_t<3>& input) const noexcept { return {input[0], input[1], out_}; }

  // x [B, N, in] -> y [B, N, out]
  void forward(cview<T, 3> x, TensorView<T, 3> y, saved_type& saved) const {
    constexpr std::string_view where = "Linear::forward";
    require_tokens(where, "x", x, in_, policy_.memory().space());
    require_shape(where, "y", y, output_shape(x.shape()));
    linear_forward(policy_, flatten_rows(x), weight_.value.view(), flatten_rows(y));
    saved.input_shape = x.shape();
  }

  // dy [B, N, out] -> dx [B, N, in] (assign, or add with write_mode::add); dW += dy^T x
  void backward(cview<T, 3> x, cview<T, 3> dy, const saved_type& saved, TensorView<T, 3> dx,
                write_mode dx_mode = write_mode::assign) {
    constexpr std::string_view where = "Linear::backward";
    require_tokens(where, "x", x, in_, policy_.memory().space());
    require_saved(where, saved.input_shape, x.shape());
    require_shape(where, "dy", dy, output_shape(x.shape()));
    require_shape(where, "dx", dx, x.shape());
    linear_backward(policy_, flatten_rows(x), weight_.value.view(), flatten_rows(dy), flatten_rows(dx), weight_.grad.view(), dx_mode);
  }

  std::vector<parameter_ref<T>> parameters(const std::string& prefix = "") { return {weight_.ref(prefix + "weight")}; }

  // nn.Linear's default: U(-1/sqrt(in), 1/sqrt(in)).
  void reset_parameters(random_stream& rng) { weight_.init_uniform(rng, 1.0 / std::sqrt(static_cast<double>(in_))); }

  const Policy& policy() const noexcept { return policy_; }

 private:
  static shape_t<2> checked_shape(index_t in, index_t out) {
    require(in > 0, "Linear", "in_features", "a positive size", std::to_string(in));
    require(out > 0, "Linear", "out_features", "a positive size", std::to_string(out));
    return {out, in};
  }

  Policy policy_;
  index_t in_, out_;
  Parameter<T, 2> weight_;
};

}  // namespace difftx
