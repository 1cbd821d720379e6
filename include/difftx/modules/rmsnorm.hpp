// RMSNorm<T, Policy>: y = scale · x / sqrt(mean(x^2) + eps) · w over the last
// axis. Parameter: "weight" [C]. scale is a constant (the subln's 1 - lambda_init).
#pragma once

#include <string>
#include <vector>

#include "difftx/core/checks.hpp"
#include "difftx/modules/architecture.hpp"
#include "difftx/modules/parameter.hpp"
#include "difftx/ops/rmsnorm.hpp"
#include "difftx/policy/reference.hpp"

namespace difftx {

template <Scalar T, class Policy = policy::reference>
  requires supported_by<Policy, T>
class RMSNorm {

 public:
  using value_type = T;
  using policy_type = Policy;
  struct saved_type {
    shape_t<3> input_shape{};
    Tensor<accum_t<T>, 1> rstd;  // [B·N]: 1 / rms of each row

    // f(name, what, tensor) for each intermediate, in the order computed.
    template <class F>
    void for_each_intermediate(const std::string& prefix, F&& f) const {
      f(prefix + "rstd", "1/rms of each row", rstd);
    }
  };

  explicit RMSNorm(index_t dim, double eps = 1e-5, double scale = 1.0, Policy policy = {})
      : policy_(std::move(policy)), dim_(dim), eps_(eps), scale_(scale), weight_(checked_shape(dim, eps), policy_.memory()) {
    weight_.init_constant(1.0);
  }

  index_t dim() const noexcept { return dim_; }
  double eps() const noexcept { return eps_; }
  double scale() const noexcept { return scale_; }
  shape_t<3> output_shape(const shape_t<3>& input) const noexcept { return input; }

  // x [B, N, C] -> y [B, N, C]
  void forward(cview<T, 3> x, TensorView<T, 3> y, saved_type& saved) const {
    constexpr std::string_view where = "RMSNorm::forward";
    require_tokens(where, "x", x, dim_, policy_.memory().space());
    require_shape(where, "y", y, x.shape());
    saved.rstd.resize({x.extent(0) * x.extent(1)}, policy_.memory());
    rmsnorm_forward(policy_, flatten_rows(x), weight_.value.view(), eps_, scale_, flatten_rows(y), saved.rstd.view());
    saved.input_shape = x.shape();
  }

  // dy [B, N, C] -> dx [B, N, C] (assign); dw += ...
  void backward(cview<T, 3> x, cview<T, 3> dy, const saved_type& saved, TensorView<T, 3> dx) {
    constexpr std::string_view where = "RMSNorm::backward";
    require_tokens(where, "x", x, dim_, policy_.memory().space());
    require_saved(where, saved.input_shape, x.shape());
    require_shape(where, "dy", dy, x.shape());
    require_shape(where, "dx", dx, x.shape());
    rmsnorm_backward(policy_, flatten_rows(x), weight_.value.view(), saved.rstd.view(), scale_, flatten_rows(dy), flatten_rows(dx),
                     weight_.grad.view());
  }

  std::vector<parameter_ref<T>> parameters(const std::string& prefix = "") { return {weight_.ref(prefix + "weight")}; }
  void reset_parameters(random_stream&) { weight_.init_constant(1.0); }
  const Policy& policy() const noexcept { return policy_; }
  // modules/architecture.hpp: eps (the scale is its owner's: MultiHead's subln).
  void describe_architecture(architecture& a, const std::string& prefix) const {
    a[prefix + "eps"] = architecture_value(eps_);
  }

 private:
  static shape_t<1> checked_shape(index_t dim, double eps) {
    require(dim > 0, "RMSNorm", "dim", "a positive size", std::to_string(dim));
    require(eps > 0, "RMSNorm", "eps", "eps > 0", std::to_string(eps));
    return {dim};
  }

  Policy policy_;
  index_t dim_;
  double eps_, scale_;
  Parameter<T, 1> weight_;
};

}  // namespace difftx
