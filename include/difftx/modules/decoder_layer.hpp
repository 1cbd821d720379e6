// The pre-RMSNorm decoder layer around an attention module Attn:
//   Y   = Attn(RMSNorm(X; w_attn_norm)) + X
//   Out = SwiGLU(RMSNorm(Y; w_ffn_norm)) + Y
// DecoderLayer<T, D, Policy> is the Differential Transformer layer (Attn =
// MultiHead<T, D, Policy>); BaselineLayer<T, D, Policy> is the same layer around
// the standard-softmax Attention<T, D, Policy>, the paper's matched baseline
// (give it 2h heads where the differential layer has h); DecoderLayerV2<T, D,
// Policy> is the layer around differential attention V2 (MultiHeadV2). D may be
// difftx::dynamic: the config's attention.head_dim then sets it.
// Parameters: "attn_norm.weight", "attn.<Attn names>", "ffn_norm.weight",
// "ffn.<SwiGLU names>".
#pragma once

#include <concepts>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "difftx/modules/architecture.hpp"
#include "difftx/modules/attention.hpp"
#include "difftx/modules/linear_weight_forms.hpp"
#include "difftx/modules/multihead.hpp"
#include "difftx/modules/multihead_v2.hpp"
#include "difftx/modules/rmsnorm.hpp"
#include "difftx/modules/swiglu.hpp"
#include "difftx/ops/elementwise.hpp"

namespace difftx {

template <class AttnConfig>
struct BasicDecoderLayerConfig {
  using attention_type = AttnConfig;
  AttnConfig attention;  // MultiHeadConfig, AttentionConfig or MultiHeadV2Config: d_model, heads, kv_heads, rope_theta, causal, ...
  index_t ffn_dim = 0;   // F; 0 means default_ffn_dim(d_model)
  double eps = 1e-5;     // of attn_norm and ffn_norm (the subln's is MultiHeadConfig::subln_eps)
};
using DecoderLayerConfig = BasicDecoderLayerConfig<MultiHeadConfig>;
using BaselineLayerConfig = BasicDecoderLayerConfig<AttentionConfig>;
using DecoderLayerV2Config = BasicDecoderLayerConfig<MultiHeadV2Config>;

// modules/architecture.hpp: the norms' eps and the attention's constants.
template <class AttnConfig>
void describe_architecture(architecture& a, const std::string& prefix, const BasicDecoderLayerConfig<AttnConfig>& c) {
  a[prefix + "attn_norm.eps"] = architecture_value(c.eps);
  describe_architecture(a, prefix + "attn.", c.attention);
  a[prefix + "ffn_norm.eps"] = architecture_value(c.eps);
}

// Ffn defaults to SwiGLU; parallel/tensor_parallel.hpp gives both parts split over ranks.
template <class Attn, class Ffn = SwiGLU<typename Attn::value_type, typename Attn::policy_type>>
class BasicDecoderLayer : public detail::linear_weight_forms<BasicDecoderLayer<Attn, Ffn>> {
 public:
  using value_type = typename Attn::value_type;
  using policy_type = typename Attn::policy_type;
  using attention_type = Attn;
  using config_type = BasicDecoderLayerConfig<std::remove_cvref_t<decltype(std::declval<const Attn&>().config())>>;
  static constexpr index_t compiled_head_dim = Attn::compiled_head_dim;  // may be difftx::dynamic

 private:
  using T = value_type;
  using Policy = policy_type;
  using norm_type = RMSNorm<T, Policy>;
  using ffn_type = Ffn;

 public:
  struct saved_type {
    shape_t<3> input_shape{};
    typename norm_type::saved_type attn_norm;
    Tensor<T, 3> attn_in;  // [B, N, C] RMSNorm(X)
    typename Attn::saved_type attn;
    Tensor<T, 3> y;  // [B, N, C] Attn(attn_in) + X
    typename norm_type::saved_type ffn_norm;
    Tensor<T, 3> ffn_in;  // [B, N, C] RMSNorm(Y)
    typename ffn_type::saved_type ffn;

    template <class F>
    void for_each_intermediate(const std::string& prefix, F&& f) const {
      attn_norm.for_each_intermediate(prefix + "attn_norm.", f);
      f(prefix + "attn_in", "the attention's input RMSNorm(x)", attn_in);
      attn.for_each_intermediate(prefix + "attn.", f);
      f(prefix + "y", "the residual attn(norm(x)) + x", y);
      ffn_norm.for_each_intermediate(prefix + "ffn_norm.", f);
      f(prefix + "ffn_in", "the FFN's input RMSNorm(y)", ffn_in);
      ffn.for_each_intermediate(prefix + "ffn.", f);
    }
  };

  explicit BasicDecoderLayer(const config_type& config, Policy policy = {})
      : policy_(std::move(policy)),
        config_(config),
        attn_norm_(config.attention.d_model, config.eps, 1.0, policy_),
        attn_(config.attention, policy_),
        ffn_norm_(config.attention.d_model, config.eps, 1.0, policy_),
        ffn_(config.attention.d_model, config.ffn_dim, policy_) {
    config_.attention = attn_.config();
    config_.ffn_dim = ffn_.ffn_dim();
  }
  // A layer whose attention and FFN are split over comm's ranks
  // (parallel/tensor_parallel.hpp): the same config as the whole layer's.
  template <class Comm>
    requires std::constructible_from<Attn, Comm&, const typename config_type::attention_type&, Policy>
  BasicDecoderLayer(const config_type& config, Comm& comm, Policy policy = {})
      : policy_(std::move(policy)),
        config_(config),
        attn_norm_(config.attention.d_model, config.eps, 1.0, policy_),
        attn_(comm, config.attention, policy_),
        ffn_norm_(config.attention.d_model, config.eps, 1.0, policy_),
        ffn_(comm, config.attention.d_model, config.ffn_dim, policy_) {
    config_.attention = attn_.config();
    config_.ffn_dim = ffn_.ffn_dim();
  }

  const config_type& config() const noexcept { return config_; }
  index_t d_model() const noexcept { return config_.attention.d_model; }
  index_t head_dim() const noexcept { return attn_.head_dim(); }  // D
  // The differential layer's lambda_init (only where Attn has one).
  double lambda_init() const noexcept
    requires requires(const Attn& a) { a.lambda_init(); }
  {
    return attn_.lambda_init();
  }
  // The attention module, e.g. to read its maps from saved.attn (attention_maps.hpp).
  const Attn& attention() const noexcept { return attn_; }
  shape_t<3> output_shape(const shape_t<3>& input) const noexcept { return input; }

  // x [B, N, C] -> out [B, N, C]; or a packed batch x [1, total, C] with its
  // cu_seqlens (modules/sequences.hpp), each sequence attending within itself.
  void forward(cview<T, 3> x, TensorView<T, 3> out, saved_type& s, sequence_offsets sequences = {}) const {
    constexpr std::string_view where = "DecoderLayer::forward";
    require_tokens(where, "x", x, d_model(), policy_.memory().space());
    require_shape(where, "out", out, x.shape());
    for (auto* t : {&s.attn_in, &s.y, &s.ffn_in}) t->resize(x.shape(), policy_.memory());
    attn_norm_.forward(x, s.attn_in.view(), s.attn_norm);
    attn_.forward(s.attn_in.view(), s.y.view(), s.attn, sequences);
    add_into(policy_, x, s.y.view());
    ffn_norm_.forward(s.y.view(), s.ffn_in.view(), s.ffn_norm);
    ffn_.forward(s.ffn_in.view(), out, s.ffn);
    add_into(policy_, s.y.const_view(), out);
    s.input_shape = x.shape();
  }

  // Inference, keeping no state: the same output with only this call's scratch.
  void forward(cview<T, 3> x, TensorView<T, 3> out, sequence_offsets sequences = {}) const {
    infer("DecoderLayer::forward", x, out, [&](cview<T, 3> in, TensorView<T, 3> y) { attn_.forward(in, y, sequences); });
  }
  // With a KV cache (modules/kv_cache.hpp): the attention's cache.
  using cache_type = typename Attn::cache_type;
  cache_type make_cache(index_t batch, index_t capacity, inference_dtype storage = inference_dtype::same) const {
    return attn_.make_cache(batch, capacity, storage);
  }
  KVCacheShape cache_shape(index_t batch, index_t capacity) const noexcept { return attn_.cache_shape(batch, capacity); }
  // Prompts x [B, N, C] (or packed with cu_seqlens) -> out; the cache restarts with them.
  void prefill(cview<T, 3> x, cache_type& cache, TensorView<T, 3> out, sequence_offsets sequences = {}) const {
    infer("DecoderLayer::prefill", x, out,
          [&](cview<T, 3> in, TensorView<T, 3> y) { attn_.prefill(in, cache, y, sequences); });
  }
  // New tokens x [B, T, C] -> out [B, T, C] at each sequence's position; they join the cache.
  void decode(cview<T, 3> x, cache_type& cache, TensorView<T, 3> out) const {
    infer("DecoderLayer::decode", x, out, [&](cview<T, 3> in, TensorView<T, 3> y) { attn_.decode(in, cache, y); });
  }

  // dout [B, N, C] -> dx [B, N, C] (assign); every parameter gradient accumulates
  void backward(cview<T, 3> x, cview<T, 3> dout, const saved_type& s, TensorView<T, 3> dx) {
    constexpr std::string_view where = "DecoderLayer::backward";
    detail::check_token_backward(where, x, dout, dx, s.input_shape, d_model(), policy_.memory().space(), "dout");
    require_trainable(where);
    Tensor<T, 3> dy(x.shape(), policy_.memory()), d_branch(x.shape(), policy_.memory());
    // Out = SwiGLU(RMSNorm(Y)) + Y
    ffn_.backward(s.ffn_in.view(), dout, s.ffn, d_branch.view());
    ffn_norm_.backward(s.y.view(), d_branch.view(), s.ffn_norm, dy.view());
    add_into(policy_, dout, dy.view());
    // Y = Attn(RMSNorm(X)) + X
    attn_.backward(s.attn_in.view(), dy.view(), s.attn, d_branch.view());
    attn_norm_.backward(x, d_branch.view(), s.attn_norm, dx);
    add_into(policy_, dy.const_view(), dx);
  }

  // Throws input_error where the layer computes for inference only (quantized logits, int8 weights).
  void require_trainable(std::string_view where) const {
    detail::require_trainable(attn_, where);
    detail::require_trainable(ffn_, where);
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
  void describe_architecture(architecture& a, const std::string& prefix) const {
    difftx::describe_architecture(a, prefix, config_);
  }

 private:
  friend detail::linear_weight_forms<BasicDecoderLayer>;
  // The attention's projections and the FFN's, for linear_weight_forms (int8
  // weights, panels, packed copies).
  template <class Self, class F>
  static void visit_linears(Self& self, F& f) {
    self.attn_.for_each_linear(f);
    self.ffn_.for_each_linear(f);
  }
  // The layer's forward with attend(attn_in, y) as its attention, two buffers of scratch.
  template <class Attend>
  void infer(std::string_view where, cview<T, 3> x, TensorView<T, 3> out, Attend&& attend) const {
    require_tokens(where, "x", x, d_model(), policy_.memory().space());
    require_shape(where, "out", out, x.shape());
    Tensor<T, 3> normed(x.shape(), policy_.memory()), y(x.shape(), policy_.memory());
    typename norm_type::saved_type norm_state;
    typename ffn_type::saved_type ffn_state;
    attn_norm_.forward(x, normed.view(), norm_state);
    attend(normed.const_view(), y.view());
    add_into(policy_, x, y.view());
    ffn_norm_.forward(y.view(), normed.view(), norm_state);
    ffn_.forward(normed.view(), out, ffn_state);
    add_into(policy_, y.const_view(), out);
  }

  Policy policy_;
  config_type config_;
  norm_type attn_norm_;
  Attn attn_;
  norm_type ffn_norm_;
  ffn_type ffn_;
};

// The Differential Transformer layer: h differential heads of 2·D.
template <Scalar T, index_t D, class Policy = policy::reference>
  requires supported_by<Policy, T>
using DecoderLayer = BasicDecoderLayer<MultiHead<T, D, Policy>>;

// The matched baseline layer: standard softmax heads of size D.
template <Scalar T, index_t D, class Policy = policy::reference>
  requires supported_by<Policy, T>
using BaselineLayer = BasicDecoderLayer<Attention<T, D, Policy>>;

// The differential attention V2 layer (modules/multihead_v2.hpp): h output
// heads of D; with attention.differential false, the authors' V2 baseline.
template <Scalar T, index_t D, class Policy = policy::reference>
  requires supported_by<Policy, T>
using DecoderLayerV2 = BasicDecoderLayer<MultiHeadV2<T, D, Policy>>;

}  // namespace difftx
