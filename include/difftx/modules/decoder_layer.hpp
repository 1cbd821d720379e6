// DecoderLayer<T, D, Policy>: the pre-RMSNorm Differential Transformer layer.
//   Y   = MultiHead(RMSNorm(X; w_attn_norm)) + X
//   Out = SwiGLU(RMSNorm(Y; w_ffn_norm)) + Y
// Parameters: "attn_norm.weight", "attn.<MultiHead names>", "ffn_norm.weight",
// "ffn.<SwiGLU names>".
#pragma once

#include <string>
#include <vector>

#include "difftx/modules/multihead.hpp"
#include "difftx/modules/rmsnorm.hpp"
#include "difftx/modules/swiglu.hpp"
#include "difftx/ops/elementwise.hpp"

namespace difftx {

struct DecoderLayerConfig {
  MultiHeadConfig attention;  // d_model, heads, kv_heads, layer_index, rope_theta, causal
  index_t ffn_dim = 0;        // F; 0 means default_ffn_dim(d_model)
  double eps = 1e-5;          // of attn_norm and ffn_norm (the subln's is fixed at 1e-5)
};

template <Scalar T, index_t D, class Policy = policy::reference>
  requires supported_by<Policy, T>
class DecoderLayer {
  using norm_type = RMSNorm<T, Policy>;
  using attn_type = MultiHead<T, D, Policy>;
  using ffn_type = SwiGLU<T, Policy>;

 public:
  using value_type = T;
  using policy_type = Policy;
  static constexpr index_t head_dim = D;
  struct saved_type {
    shape_t<3> input_shape{};
    typename norm_type::saved_type attn_norm;
    Tensor<T, 3> attn_in;  // [B, N, C] RMSNorm(X)
    typename attn_type::saved_type attn;
    Tensor<T, 3> y;  // [B, N, C] MultiHead(attn_in) + X
    typename norm_type::saved_type ffn_norm;
    Tensor<T, 3> ffn_in;  // [B, N, C] RMSNorm(Y)
    typename ffn_type::saved_type ffn;
  };

  explicit DecoderLayer(const DecoderLayerConfig& config, Policy policy = {})
      : policy_(std::move(policy)),
        config_(config),
        attn_norm_(config.attention.d_model, config.eps, 1.0, policy_),
        attn_(config.attention, policy_),
        ffn_norm_(config.attention.d_model, config.eps, 1.0, policy_),
        ffn_(config.attention.d_model, config.ffn_dim, policy_) {
    config_.attention = attn_.config();
    config_.ffn_dim = ffn_.ffn_dim();
  }

  const DecoderLayerConfig& config() const noexcept { return config_; }
  index_t d_model() const noexcept { return config_.attention.d_model; }
  double lambda_init() const noexcept { return attn_.lambda_init(); }
  shape_t<3> output_shape(const shape_t<3>& input) const noexcept { return input; }

  // x [B, N, C] -> out [B, N, C]
  void forward(cview<T, 3> x, TensorView<T, 3> out, saved_type& s) const {
    constexpr std::string_view where = "DecoderLayer::forward";
    require_tokens(where, "x", x, d_model(), policy_.memory().space());
    require_shape(where, "out", out, x.shape());
    for (auto* t : {&s.attn_in, &s.y, &s.ffn_in}) t->resize(x.shape(), policy_.memory());
    attn_norm_.forward(x, s.attn_in.view(), s.attn_norm);
    attn_.forward(s.attn_in.view(), s.y.view(), s.attn);
    add_into(policy_, x, s.y.view());
    ffn_norm_.forward(s.y.view(), s.ffn_in.view(), s.ffn_norm);
    ffn_.forward(s.ffn_in.view(), out, s.ffn);
    add_into(policy_, s.y.const_view(), out);
    s.input_shape = x.shape();
  }

  // dout [B, N, C] -> dx [B, N, C] (assign); every parameter gradient accumulates
  void backward(cview<T, 3> x, cview<T, 3> dout, const saved_type& s, TensorView<T, 3> dx) {
    constexpr std::string_view where = "DecoderLayer::backward";
    require_tokens(where, "x", x, d_model(), policy_.memory().space());
    require_saved(where, s.input_shape, x.shape());
    require_shape(where, "dout", dout, x.shape());
    require_shape(where, "dx", dx, x.shape());
    Tensor<T, 3> dy(x.shape(), policy_.memory()), d_branch(x.shape(), policy_.memory());
    // Out = SwiGLU(RMSNorm(Y)) + Y
    ffn_.backward(s.ffn_in.view(), dout, s.ffn, d_branch.view());
    ffn_norm_.backward(s.y.view(), d_branch.view(), s.ffn_norm, dy.view());
    add_into(policy_, dout, dy.view());
    // Y = MultiHead(RMSNorm(X)) + X
    attn_.backward(s.attn_in.view(), dy.view(), s.attn, d_branch.view());
    attn_norm_.backward(x, d_branch.view(), s.attn_norm, dx);
    add_into(policy_, dy.const_view(), dx);
  }

  std::vector<parameter_ref<T>> parameters(const std::string& prefix = "") {
    std::vector<parameter_ref<T>> all;
    append_parameters(all, attn_norm_.parameters(prefix + "attn_norm."));
    append_parameters(all, attn_.parameters(prefix + "attn."));
    append_parameters(all, ffn_norm_.parameters(prefix + "ffn_norm."));
    append_parameters(all, ffn_.parameters(prefix + "ffn."));
    return all;
  }
  void reset_parameters(random_stream& rng) {
    attn_norm_.reset_parameters(rng);
    attn_.reset_parameters(rng);
    ffn_norm_.reset_parameters(rng);
    ffn_.reset_parameters(rng);
  }
  const Policy& policy() const noexcept { return policy_; }

 private:
  Policy policy_;
  DecoderLayerConfig config_;
  norm_type attn_norm_;
  attn_type attn_;
  norm_type ffn_norm_;
  ffn_type ffn_;
};

}  // namespace difftx
