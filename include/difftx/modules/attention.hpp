// Attention<T, D, Policy>: the baseline standard causal softmax attention with
// H heads of size D (or difftx::dynamic: D from config.head_dim), G key/value
// groups and RoPE, no subln:
//   Attn(X) = Concat_i(softmax(Q_i K_j^T / sqrt(D)) V_j) W_O^T,  j = i / (H / G).
// The paper's matched baseline for MultiHead<T, D> with h heads is H = 2h.
// Parameters: "q_proj.weight" [HD, C], "k_proj.weight" [GD, C],
// "v_proj.weight" [GD, C], "out_proj.weight" [C, HD].
#pragma once

#include <string>
#include <vector>

#include "difftx/modules/architecture.hpp"
#include "difftx/modules/attention_heads.hpp"
#include "difftx/modules/diff_attn.hpp"
#include "difftx/modules/kv_cache.hpp"
#include "difftx/modules/linear.hpp"
#include "difftx/modules/linear_weight_forms.hpp"
#include "difftx/modules/sequences.hpp"
#include "difftx/modules/softmax_heads.hpp"

namespace difftx {

// H heads of size D, G key/value groups: exactly what every attention
// config shares (modules/attention_heads.hpp), with nothing of its own.
using AttentionConfig = AttentionHeadsConfig;

template <Scalar T, index_t HeadDim, class Policy = policy::reference>
  requires supported_by<Policy, T>
class Attention : public detail::linear_weight_forms<Attention<T, HeadDim, Policy>> {
  static_assert(valid_head_dim<HeadDim>,
                "difftx: the head size D must be positive and even (interleaved RoPE pairs), or difftx::dynamic");
  using linear_type = Linear<T, Policy>;
  using heads_type = detail::SoftmaxHeads<T, Policy>;

 public:
  using value_type = T;
  using policy_type = Policy;
  static constexpr index_t compiled_head_dim = HeadDim;  // may be difftx::dynamic
  // q, k, v, lse, o (o [B, N, H, D]: the out_proj input), as SoftmaxHeads saves them.
  struct saved_type : heads_type::saved_type {
    typename linear_type::saved_type out_proj;
  };

  explicit Attention(const AttentionConfig& config, Policy policy = {})
      : policy_(std::move(policy)),
        config_(checked(config)),
        heads_(config_, policy_),
        out_proj_(config_.heads * config_.head_dim, config_.d_model, policy_) {
    random_stream rng(0);
    reset_parameters(rng);
  }

  const AttentionConfig& config() const noexcept { return config_; }
  index_t head_dim() const noexcept { return config_.head_dim; }  // D
  shape_t<3> output_shape(const shape_t<3>& input) const noexcept { return input; }

  // x [B, N, C] -> y [B, N, C]; or a packed batch x [1, total, C] with its
  // cu_seqlens (modules/sequences.hpp), each sequence attending within itself.
  void forward(cview<T, 3> x, TensorView<T, 3> y, saved_type& s, sequence_offsets sequences = {}) const {
    check_input("Attention::forward", x, y, sequences);
    heads_.forward(x, s, sequences);
    output(s, y);
  }
  // The same output, keeping no state (inference): only this call's scratch.
  void forward(cview<T, 3> x, TensorView<T, 3> y, sequence_offsets sequences = {}) const {
    saved_type scratch;
    forward(x, y, scratch, sequences);
  }

  // dy [B, N, C] -> dx [B, N, C] (assign); every parameter gradient accumulates
  void backward(cview<T, 3> x, cview<T, 3> dy, const saved_type& s, TensorView<T, 3> dx) {
    constexpr std::string_view where = "Attention::backward";
    detail::check_token_backward(where, x, dy, dx, s.input_shape, config_.d_model, policy_.memory().space());
    require_trainable(where);
    const index_t B = x.extent(0), N = x.extent(1), HD = config_.heads * config_.head_dim;
    Tensor<T, 4> d_o(s.o.shape(), policy_.memory());
    out_proj_.backward(s.o.const_view().template reshape<3>({B, N, HD}), dy, s.out_proj,
                       d_o.view().template reshape<3>({B, N, HD}));
    heads_.backward(x, s, d_o.const_view(), dx);
  }

  // Throws input_error where the module computes for inference only (config.logit_bits, int8 weights).
  void require_trainable(std::string_view where) const {
    heads_.require_trainable(where);
    out_proj_.require_trainable(where);
  }

  // Inference with a KV cache (modules/kv_cache.hpp): as MultiHead's.
  using cache_type = KVCache<T>;
  // storage int8: keys and values as int8 with steps (kv_cache.hpp; low-bit CPU policies).
  cache_type make_cache(index_t batch, index_t capacity, inference_dtype storage = inference_dtype::same) const {
    return cache_type(detail::with_storage<Policy>("Attention::make_cache", cache_shape(batch, capacity), storage),
                      policy_.memory());
  }
  // Prompts x [B, N, C] (or packed with cu_seqlens) -> y; the cache restarts with them.
  void prefill(cview<T, 3> x, cache_type& cache, TensorView<T, 3> y, sequence_offsets sequences = {}) const {
    constexpr std::string_view where = "Attention::prefill";
    check_input(where, x, y, sequences);
    detail::check_prefill(where, cache, cache_shape(0, 0), x, sequences, policy_.memory().space());
    saved_type s;
    forward(x, y, s, sequences);
    heads_.fill(s, cache, sequences);
  }
  // New tokens x [B, T, C] -> y [B, T, C] at each sequence's position; they join the cache.
  void decode(cview<T, 3> x, cache_type& cache, TensorView<T, 3> y) const {
    constexpr std::string_view where = "Attention::decode";
    check_input(where, x, y, {});
    saved_type s;
    heads_.decode(where, x, cache, s);
    output(s, y);
  }
  KVCacheShape cache_shape(index_t batch, index_t capacity) const noexcept { return heads_.cache_shape(batch, capacity); }

  std::vector<parameter_ref<T>> parameters(const std::string& prefix = "") {
    std::vector<parameter_ref<T>> all;
    heads_.append_parameters_to(all, prefix);
    append_parameters(all, out_proj_.parameters(prefix + "out_proj."));
    return all;
  }
  void reset_parameters(random_stream& rng) {
    heads_.reset_parameters(rng);
    out_proj_.reset_parameters(rng);
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
  static AttentionConfig checked(AttentionConfig c) {
    require(c.d_model > 0, "Attention", "config.d_model", "d_model >= 1", std::to_string(c.d_model));
    c.kv_heads = detail::checked_kv_heads("Attention", c.heads, c.kv_heads);
    c.head_dim = detail::checked_head_dim<HeadDim>("Attention", c.head_dim);
    detail::checked_logit_bits<Policy, accum_t<T>>("Attention", c.logit_bits);
    detail::checked_qk_dtype<Policy, accum_t<T>>("Attention", c.qk_dtype);
    detail::check_rope_parameters("Attention", "config.rope_theta", c.rope_theta, "config.rope_scaling", c.rope_scaling);
    return c;
  }

 private:
  friend detail::linear_weight_forms<Attention>;
  // The four projections, for linear_weight_forms (int8 weights, panels, packed copies).
  template <class Self, class F>
  static void visit_linears(Self& self, F& f) {
    self.heads_.for_each_linear(f);
    f(self.out_proj_);
  }
  void check_input(std::string_view where, const cview<T, 3>& x, const TensorView<T, 3>& y,
                   sequence_offsets sequences) const {
    detail::check_token_call(where, x, y, sequences, config_.d_model, policy_.memory().space());
  }
  // s.o [B, N, H, D] -> out_proj -> y [B, N, C]
  void output(saved_type& s, TensorView<T, 3> y) const {
    const index_t B = s.o.extent(0), N = s.o.extent(1);
    out_proj_.forward(s.o.const_view().template reshape<3>({B, N, config_.heads * config_.head_dim}), y, s.out_proj);
  }

  Policy policy_;
  AttentionConfig config_;
  heads_type heads_;
  linear_type out_proj_;
};

}  // namespace difftx
