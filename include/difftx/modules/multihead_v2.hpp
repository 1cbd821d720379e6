// MultiHeadV2<T, D, Policy>: differential attention V2 (the authors'
// Diff-Transformer-V2, docs/semantics.md "Differential attention V2"). h output
// heads of size D (or difftx::dynamic: D from config.head_dim), 2h query heads
// and g key/value heads in one grouped-query softmax attention (SoftmaxHeads),
// then each output head pairs query heads 2i and 2i+1 with a per-token lambda:
//   a      = Attn_GQA(RoPE(x W_q^T), RoPE(x W_k^T), x W_v^T)   [B, N, 2h, D]
//   lambda = sigmoid(x W_lambda^T)                              [B, N, h]
//   o_i    = a_2i - lambda_i a_2i+1                             [B, N, h, D]
//   y      = o W_o^T                                            [B, N, C]
// No per-head RMSNorm, no (1 - lambda_init). With config.differential false it
// is the authors' matched baseline: h query heads, o = a, no lambda_proj.
// Parameters: "q_proj.weight" [2hD, C] (baseline: [hD, C]), "k_proj.weight"
// [gD, C], "v_proj.weight" [gD, C], "o_proj.weight" [C, hD],
// "lambda_proj.weight" [h, C] (differential only).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "difftx/core/head_dim.hpp"
#include "difftx/modules/architecture.hpp"
#include "difftx/modules/attention_heads.hpp"
#include "difftx/modules/kv_cache.hpp"
#include "difftx/modules/linear.hpp"
#include "difftx/modules/linear_weight_forms.hpp"
#include "difftx/modules/sequences.hpp"
#include "difftx/modules/softmax_heads.hpp"
#include "difftx/ops/diff_heads.hpp"

namespace difftx {

// AttentionHeadsConfig's fields (modules/attention_heads.hpp), flat, with
// differential among them.
struct MultiHeadV2Config {
  index_t d_model = 0;   // C
  index_t heads = 1;     // h output heads (2h query heads when differential)
  index_t kv_heads = 0;  // g key/value heads, dividing the query heads; 0 means g = h
  double rope_theta = 10000.0;
  bool causal = true;
  index_t head_dim = 0;       // D; 0 means the compiled D (needed where D is difftx::dynamic)
  bool differential = true;   // false: the matched baseline (the authors' use_diff_v2 = False)
  int logit_bits = logits_unquantized;  // 4..8: attention logits quantized (inference, docs/semantics.md)
  inference_dtype qk_dtype = inference_dtype::same;  // int8: Q·Kᵀ on int8 queries and keys (inference)
  difftx::rope_scaling rope_scaling = {};  // linear or llama3 frequencies (transformers' rope_type)
};

// modules/architecture.hpp: what a MultiHeadV2's weight shapes do not say (c with its head_dim resolved).
inline void describe_architecture(architecture& a, const std::string& prefix, const MultiHeadV2Config& c) {
  describe_architecture(a, prefix, attention_heads(c));
  a[prefix + "differential"] = architecture_value(c.differential);
}

template <Scalar T, index_t HeadDim, class Policy = policy::reference>
  requires supported_by<Policy, T>
class MultiHeadV2 : public detail::linear_weight_forms<MultiHeadV2<T, HeadDim, Policy>> {
  static_assert(valid_head_dim<HeadDim>,
                "difftx: the head size D must be positive and even (interleaved RoPE pairs), or difftx::dynamic");
  using linear_type = Linear<T, Policy>;
  using heads_type = detail::SoftmaxHeads<T, Policy>;

 public:
  using value_type = T;
  using policy_type = Policy;
  static constexpr index_t compiled_head_dim = HeadDim;  // may be difftx::dynamic
  // q, k, v, lse and o (o [B, N, 2h, D]: every query head's output) as SoftmaxHeads saves them, and:
  struct saved_type : heads_type::saved_type {
    typename linear_type::saved_type lambda_proj, o_proj;
    Tensor<T, 3> lambda_logits;  // [B, N, h] x W_lambda^T, before the sigmoid (differential only)
    Tensor<T, 4> diff;           // [B, N, h, D] a_2i - lambda a_2i+1, the o_proj input (differential only)

    template <class F>
    void for_each_intermediate(const std::string& prefix, F&& f) const {
      heads_type::saved_type::for_each_intermediate(prefix, f);
      f(prefix + "lambda_logits", "the lambda logits x W_lambda^T", lambda_logits);
      f(prefix + "diff", "the head differences a_2i - lambda a_2i+1", diff);
    }
  };

  explicit MultiHeadV2(const MultiHeadV2Config& config, Policy policy = {})
      : policy_(std::move(policy)),
        config_(checked(config)),
        heads_(softmax_heads_config(), policy_),
        o_proj_(config_.heads * config_.head_dim, config_.d_model, policy_) {
    if (config_.differential) lambda_proj_.emplace(config_.d_model, config_.heads, policy_);
    random_stream rng(0);
    reset_parameters(rng);
  }

  const MultiHeadV2Config& config() const noexcept { return config_; }
  index_t head_dim() const noexcept { return config_.head_dim; }  // D
  index_t query_heads() const noexcept { return config_.differential ? 2 * config_.heads : config_.heads; }
  // The one softmax attention behind it: query_heads() heads, the rest as configured.
  AttentionHeadsConfig softmax_heads_config() const {
    auto heads = attention_heads(config_);
    heads.heads = query_heads();
    return heads;
  }
  shape_t<3> output_shape(const shape_t<3>& input) const noexcept { return input; }

  // x [B, N, C] -> y [B, N, C]; or a packed batch x [1, total, C] with its
  // cu_seqlens (modules/sequences.hpp), each sequence attending within itself.
  void forward(cview<T, 3> x, TensorView<T, 3> y, saved_type& s, sequence_offsets sequences = {}) const {
    check_input("MultiHeadV2::forward", x, y, sequences);
    heads_.forward(x, s, sequences);
    output(x, s, y);
  }
  // The same output, keeping no state (inference): only this call's scratch.
  void forward(cview<T, 3> x, TensorView<T, 3> y, sequence_offsets sequences = {}) const {
    saved_type scratch;
    forward(x, y, scratch, sequences);
  }

  // dy [B, N, C] -> dx [B, N, C] (assign); every parameter gradient accumulates
  void backward(cview<T, 3> x, cview<T, 3> dy, const saved_type& s, TensorView<T, 3> dx) {
    constexpr std::string_view where = "MultiHeadV2::backward";
    detail::check_token_backward(where, x, dy, dx, s.input_shape, config_.d_model, policy_.memory().space());
    require_trainable(where);
    const index_t B = x.extent(0), N = x.extent(1), h = config_.heads, D = config_.head_dim;
    auto& memory = policy_.memory();
    Tensor<T, 4> d_in({B, N, h, D}, memory);  // the o_proj input's gradient
    o_proj_.backward(o_proj_input(s), dy, s.o_proj, d_in.view().template reshape<3>({B, N, h * D}));
    if (!config_.differential) {
      heads_.backward(x, s, d_in.const_view(), dx);
      return;
    }
    Tensor<T, 4> da(s.o.shape(), memory);
    Tensor<T, 3> dz(s.lambda_logits.shape(), memory);
    diff_heads_backward(policy_, per_token(s.o.const_view()), s.lambda_logits.const_view().template reshape<2>({B * N, h}),
                        per_token(d_in.const_view()), per_token(da.view()), dz.view().template reshape<2>({B * N, h}));
    heads_.backward(x, s, da.const_view(), dx);
    lambda_proj_->backward(x, dz.const_view(), s.lambda_proj, dx, write_mode::add);
  }

  // Throws input_error where the module computes for inference only (config.logit_bits, int8 weights).
  void require_trainable(std::string_view where) const {
    heads_.require_trainable(where);
    o_proj_.require_trainable(where);
    if (lambda_proj_) lambda_proj_->require_trainable(where);
  }

  // Inference with a KV cache (modules/kv_cache.hpp): the cache of a standard
  // transformer with g key/value heads of D, whatever h is.
  using cache_type = KVCache<T>;
  // storage int8: keys and values as int8 with steps (kv_cache.hpp; low-bit CPU policies).
  cache_type make_cache(index_t batch, index_t capacity, inference_dtype storage = inference_dtype::same) const {
    return cache_type(detail::with_storage<Policy>("MultiHeadV2::make_cache", cache_shape(batch, capacity), storage),
                      policy_.memory());
  }
  KVCacheShape cache_shape(index_t batch, index_t capacity) const noexcept { return heads_.cache_shape(batch, capacity); }
  // Prompts x [B, N, C] (or packed with cu_seqlens) -> y; the cache restarts with them.
  void prefill(cview<T, 3> x, cache_type& cache, TensorView<T, 3> y, sequence_offsets sequences = {}) const {
    constexpr std::string_view where = "MultiHeadV2::prefill";
    check_input(where, x, y, sequences);
    detail::check_prefill(where, cache, cache_shape(0, 0), x, sequences, policy_.memory().space());
    saved_type s;
    forward(x, y, s, sequences);
    heads_.fill(s, cache, sequences);
  }
  // New tokens x [B, T, C] -> y [B, T, C] at each sequence's position; they join the cache.
  void decode(cview<T, 3> x, cache_type& cache, TensorView<T, 3> y) const {
    constexpr std::string_view where = "MultiHeadV2::decode";
    check_input(where, x, y, {});
    saved_type s;
    heads_.decode(where, x, cache, s);
    output(x, s, y);
  }

  std::vector<parameter_ref<T>> parameters(const std::string& prefix = "") {
    std::vector<parameter_ref<T>> all;
    heads_.append_parameters_to(all, prefix);
    append_parameters(all, o_proj_.parameters(prefix + "o_proj."));
    if (lambda_proj_) append_parameters(all, lambda_proj_->parameters(prefix + "lambda_proj."));
    return all;
  }
  void reset_parameters(random_stream& rng) {
    heads_.reset_parameters(rng);
    o_proj_.reset_parameters(rng);
    if (lambda_proj_) lambda_proj_->reset_parameters(rng);
  }
  const Policy& policy() const noexcept { return policy_; }
  void describe_architecture(architecture& a, const std::string& prefix) const {
    difftx::describe_architecture(a, prefix, config_);
  }

  // config as this module runs it (kv_heads and head_dim resolved), or
  // input_error(module, "config.<field>", ...) naming the first field it
  // rejects. The constructor calls it; a caller may call it first to check a
  // config without building the module (the difftx tool does, to name the
  // flag or the file a field came from).
  static MultiHeadV2Config checked(MultiHeadV2Config c) {
    constexpr std::string_view where = "MultiHeadV2";
    require(c.d_model > 0, where, "config.d_model", "d_model >= 1", std::to_string(c.d_model));
    require(c.heads > 0, where, "config.heads", "heads >= 1", std::to_string(c.heads));
    const index_t query = c.differential ? 2 * c.heads : c.heads;
    const index_t g = c.kv_heads == 0 ? c.heads : c.kv_heads;
    require(g > 0 && query % g == 0, where, "config.kv_heads",
            "a group count dividing the " + std::to_string(query) + " query heads", std::to_string(c.kv_heads));
    c.kv_heads = g;
    c.head_dim = detail::checked_head_dim<HeadDim>(where, c.head_dim);
    detail::checked_logit_bits<Policy, accum_t<T>>(where, c.logit_bits);
    detail::checked_qk_dtype<Policy, accum_t<T>>(where, c.qk_dtype);
    detail::check_rope_parameters(where, "config.rope_theta", c.rope_theta, "config.rope_scaling", c.rope_scaling);
    return c;
  }

 private:
  friend detail::linear_weight_forms<MultiHeadV2>;
  // Every projection, lambda_proj's too, for linear_weight_forms (int8
  // weights, panels, packed copies).
  template <class Self, class F>
  static void visit_linears(Self& self, F& f) {
    self.heads_.for_each_linear(f);
    f(self.o_proj_);
    if (self.lambda_proj_) f(*self.lambda_proj_);
  }
  void check_input(std::string_view where, const cview<T, 3>& x, const TensorView<T, 3>& y,
                   sequence_offsets sequences) const {
    detail::check_token_call(where, x, y, sequences, config_.d_model, policy_.memory().space());
  }
  // [B, N, heads, D] seen as [B·N, heads, D]: the head combination is per token.
  template <class V>
  static auto per_token(V t) {
    return t.template reshape<3>({t.extent(0) * t.extent(1), t.extent(2), t.extent(3)});
  }
  // What o_proj reads, [B, N, hD]: the head differences, or the baseline's attention output.
  cview<T, 3> o_proj_input(const saved_type& s) const {
    const auto& in = config_.differential ? s.diff : s.o;
    return in.const_view().template reshape<3>({in.extent(0), in.extent(1), config_.heads * config_.head_dim});
  }
  // x [B, N, C] and s.o [B, N, 2h, D] -> lambda, the head differences -> o_proj -> y [B, N, C]
  void output(cview<T, 3> x, saved_type& s, TensorView<T, 3> y) const {
    if (config_.differential) {
      const index_t B = x.extent(0), N = x.extent(1), h = config_.heads;
      s.lambda_logits.resize({B, N, h}, policy_.memory());
      s.diff.resize({B, N, h, config_.head_dim}, policy_.memory());
      lambda_proj_->forward(x, s.lambda_logits.view(), s.lambda_proj);
      diff_heads_forward(policy_, per_token(s.o.const_view()),
                         s.lambda_logits.const_view().template reshape<2>({B * N, h}), per_token(s.diff.view()));
    }
    o_proj_.forward(o_proj_input(s), y, s.o_proj);
  }

  Policy policy_;
  MultiHeadV2Config config_;
  heads_type heads_;
  linear_type o_proj_;
  std::optional<linear_type> lambda_proj_;  // differential only
};

}  // namespace difftx
