// SwiGLU<T, Policy>: (swish(x W_G^T) ⊙ x W_1^T) W_2^T.
// Parameters: "gate_proj.weight" [F, C], "up_proj.weight" [F, C], "down_proj.weight" [C, F].
#pragma once

#include <string>
#include <vector>

#include "difftx/modules/linear.hpp"
#include "difftx/modules/linear_weight_forms.hpp"
#include "difftx/ops/elementwise.hpp"
#include "difftx/ops/swiglu.hpp"

namespace difftx {

// The spec's default hidden size: 8/3 · C rounded up to a multiple of 64.
constexpr index_t default_ffn_dim(index_t d_model) noexcept { return ((8 * d_model + 3 * 64 - 1) / (3 * 64)) * 64; }

template <Scalar T, class Policy = policy::reference>
  requires supported_by<Policy, T>
class SwiGLU : public detail::linear_weight_forms<SwiGLU<T, Policy>> {

 public:
  using value_type = T;
  using policy_type = Policy;
  struct saved_type {
    shape_t<3> input_shape{};
    typename Linear<T, Policy>::saved_type gate_proj, up_proj, down_proj;
    Tensor<T, 3> gate;    // [B, N, F]  x W_G^T
    Tensor<T, 3> up;      // [B, N, F]  x W_1^T
    Tensor<T, 3> hidden;  // [B, N, F]  swish(gate) ⊙ up, the input of down_proj

    template <class F>
    void for_each_intermediate(const std::string& prefix, F&& f) const {
      f(prefix + "gate", "the gate projection", gate);
      f(prefix + "up", "the up projection", up);
      f(prefix + "hidden", "swish(gate) * up", hidden);
    }
  };

  // ffn_dim 0 selects default_ffn_dim(d_model).
  explicit SwiGLU(index_t d_model, index_t ffn_dim = 0, Policy policy = {})
      : policy_(std::move(policy)),
        d_model_(d_model),
        ffn_dim_(ffn_dim == 0 ? default_ffn_dim(d_model) : ffn_dim),
        gate_proj_(d_model_, ffn_dim_, policy_),
        up_proj_(d_model_, ffn_dim_, policy_),
        down_proj_(ffn_dim_, d_model_, policy_) {
    random_stream rng(0);
    reset_parameters(rng);
  }

  index_t d_model() const noexcept { return d_model_; }
  index_t ffn_dim() const noexcept { return ffn_dim_; }
  shape_t<3> output_shape(const shape_t<3>& input) const noexcept { return input; }

  // x [B, N, C] -> y [B, N, C]
  void forward(cview<T, 3> x, TensorView<T, 3> y, saved_type& saved) const {
    constexpr std::string_view where = "SwiGLU::forward";
    require_tokens(where, "x", x, d_model_, policy_.memory().space());
    require_shape(where, "y", y, x.shape());
    const shape_t<3> hidden_shape{x.extent(0), x.extent(1), ffn_dim_};
    for (auto* t : {&saved.gate, &saved.up, &saved.hidden}) t->resize(hidden_shape, policy_.memory());
    Linear<T, Policy>::forward_together(x, {{gate_proj_, saved.gate.view(), saved.gate_proj},
                                            {up_proj_, saved.up.view(), saved.up_proj}});
    swiglu_gate_forward(policy_, flatten_rows(saved.gate.const_view()), flatten_rows(saved.up.const_view()),
                        flatten_rows(saved.hidden.view()));
    down_proj_.forward(saved.hidden.view(), y, saved.down_proj);
    saved.input_shape = x.shape();
  }

  // dy [B, N, C] -> dx [B, N, C] (assign); the three weight gradients accumulate
  void backward(cview<T, 3> x, cview<T, 3> dy, const saved_type& saved, TensorView<T, 3> dx) {
    constexpr std::string_view where = "SwiGLU::backward";
    require_tokens(where, "x", x, d_model_, policy_.memory().space());
    require_saved(where, saved.input_shape, x.shape());
    require_shape(where, "dy", dy, x.shape());
    require_shape(where, "dx", dx, x.shape());
    require_trainable(where);
    Tensor<T, 3> d_hidden(saved.hidden.shape(), policy_.memory()), d_gate(saved.hidden.shape(), policy_.memory()),
        d_up(saved.hidden.shape(), policy_.memory());
    down_proj_.backward(saved.hidden.view(), dy, saved.down_proj, d_hidden.view());
    swiglu_gate_backward(policy_, flatten_rows(saved.gate.const_view()), flatten_rows(saved.up.const_view()),
                         flatten_rows(d_hidden.const_view()), flatten_rows(d_gate.view()), flatten_rows(d_up.view()));
    gate_proj_.backward(x, d_gate.view(), saved.gate_proj, dx);
    up_proj_.backward(x, d_up.view(), saved.up_proj, dx, write_mode::add);
  }

  std::vector<parameter_ref<T>> parameters(const std::string& prefix = "") {
    std::vector<parameter_ref<T>> all;
    append_parameters(all, gate_proj_.parameters(prefix + "gate_proj."));
    append_parameters(all, up_proj_.parameters(prefix + "up_proj."));
    append_parameters(all, down_proj_.parameters(prefix + "down_proj."));
    return all;
  }
  void reset_parameters(random_stream& rng) {
    gate_proj_.reset_parameters(rng);
    up_proj_.reset_parameters(rng);
    down_proj_.reset_parameters(rng);
  }
  const Policy& policy() const noexcept { return policy_; }

  void require_trainable(std::string_view where) const {
    this->for_each_linear([&](const auto& l) { l.require_trainable(where); });
  }

 private:
  friend detail::linear_weight_forms<SwiGLU>;
  // The three projections, for linear_weight_forms (int8 weights, panels,
  // packed copies; of the panels, only down_proj's rows are long enough).
  template <class Self, class F>
  static void visit_linears(Self& self, F& f) {
    for (auto* l : {&self.gate_proj_, &self.up_proj_, &self.down_proj_}) f(*l);
  }
  Policy policy_;
  index_t d_model_, ffn_dim_;
  Linear<T, Policy> gate_proj_, up_proj_, down_proj_;
};

}  // namespace difftx
