// MultiHead<T, D, Policy>: multi-head differential attention (the spec's
// MultiHead(X)): projections, RoPE, DiffAttn per head, subln scaled by
// (1 - lambda_init), output projection. D is the half head size, or
// difftx::dynamic to take it from config.head_dim (core/head_dim.hpp).
// Parameters: "q_proj.weight" [2hD, C], "k_proj.weight" [2gD, C],
// "v_proj.weight" [2gD, C], "out_proj.weight" [C, 2hD], "lambda_q1",
// "lambda_k1", "lambda_q2", "lambda_k2" [D], "subln.weight" [2D].
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "difftx/modules/architecture.hpp"
#include "difftx/modules/attention_heads.hpp"
#include "difftx/modules/diff_attn.hpp"
#include "difftx/modules/kv_cache.hpp"
#include "difftx/modules/linear.hpp"
#include "difftx/modules/linear_weight_forms.hpp"
#include "difftx/modules/rmsnorm.hpp"
#include "difftx/modules/sequences.hpp"
#include "difftx/ops/rope.hpp"

namespace difftx {

// AttentionHeadsConfig's fields (modules/attention_heads.hpp), flat, with
// layer_index and subln_eps among them.
struct MultiHeadConfig {
  index_t d_model = 0;      // C
  index_t heads = 1;        // h differential heads
  index_t kv_heads = 0;     // g key/value groups; 0 means g = h
  index_t layer_index = 0;  // l, sets lambda_init = 0.8 - 0.6 exp(-0.3 l)
  double rope_theta = 10000.0;
  bool causal = true;
  index_t head_dim = 0;      // D, the half head size; 0 means the compiled D (needed where D is difftx::dynamic)
  double subln_eps = 1e-5;   // of the per-head RMSNorm (DiffLlama checkpoints: their rms_norm_eps)
  int logit_bits = logits_unquantized;  // 4..8: attention logits quantized (inference, docs/semantics.md)
  inference_dtype qk_dtype = inference_dtype::same;  // int8: Q·Kᵀ on int8 queries and keys (inference)
  difftx::rope_scaling rope_scaling = {};  // linear or llama3 frequencies (transformers' rope_type)
};

// modules/architecture.hpp: what a MultiHead's weight shapes do not say (c with its head_dim resolved).
inline void describe_architecture(architecture& a, const std::string& prefix, const MultiHeadConfig& c) {
  describe_architecture(a, prefix, attention_heads(c));
  a[prefix + "layer_index"] = architecture_value(c.layer_index);
  a[prefix + "subln.eps"] = architecture_value(c.subln_eps);
}

template <Scalar T, index_t HeadDim, class Policy = policy::reference>
  requires supported_by<Policy, T>
class MultiHead : public detail::linear_weight_forms<MultiHead<T, HeadDim, Policy>> {
  static_assert(valid_head_dim<HeadDim>,
                "difftx: the half head size D must be positive and even (interleaved RoPE pairs), or difftx::dynamic");
  using linear_type = Linear<T, Policy>;
  using attn_type = DiffAttn<T, HeadDim, Policy>;
  using norm_type = RMSNorm<T, Policy>;

 public:
  using value_type = T;
  using policy_type = Policy;
  static constexpr index_t compiled_head_dim = HeadDim;  // may be difftx::dynamic
  struct saved_type {
    shape_t<3> input_shape{};
    typename linear_type::saved_type q_proj, k_proj, v_proj, out_proj;
    Tensor<T, 5> q;  // [B, N, h, 2, D] projected and rotated
    Tensor<T, 5> k;  // [B, N, g, 2, D] projected and rotated
    Tensor<T, 4> v;  // [B, N, g, 2D]
    typename attn_type::saved_type attn;
    Tensor<T, 4> o;  // [B, N, h, 2D] (A1 - lambda A2) V, the subln input
    typename norm_type::saved_type subln;
    Tensor<T, 3> normed;  // [B, N, 2hD] subln output, the out_proj input
    index_t rope_table_positions = 0;  // P of the forward's rope_table, 0 without one

    template <class F>
    void for_each_intermediate(const std::string& prefix, F&& f) const {
      f(prefix + "q", "the queries (projected, rotated)", q);
      f(prefix + "k", "the keys (projected, rotated)", k);
      f(prefix + "v", "the values", v);
      attn.for_each_intermediate(prefix + "attn.", f);
      f(prefix + "o", "the attention output", o);
      subln.for_each_intermediate(prefix + "subln.", f);
      f(prefix + "normed", "the subln output", normed);
    }
  };

  explicit MultiHead(const MultiHeadConfig& config, Policy policy = {})
      : policy_(std::move(policy)),
        config_(checked(config)),
        q_proj_(config_.d_model, 2 * config_.heads * config_.head_dim, policy_),
        k_proj_(config_.d_model, 2 * config_.kv_heads * config_.head_dim, policy_),
        v_proj_(config_.d_model, 2 * config_.kv_heads * config_.head_dim, policy_),
        out_proj_(2 * config_.heads * config_.head_dim, config_.d_model, policy_),
        attn_({config_.heads, config_.kv_heads, config_.layer_index, config_.causal, config_.head_dim,
               config_.logit_bits, config_.qk_dtype},
              policy_),
        subln_(2 * config_.head_dim, config_.subln_eps, 1.0 - difftx::lambda_init(config_.layer_index), policy_) {
    random_stream rng(0);
    reset_parameters(rng);
  }

  const MultiHeadConfig& config() const noexcept { return config_; }
  index_t head_dim() const noexcept { return config_.head_dim; }  // D
  double lambda_init() const noexcept { return attn_.lambda_init(); }
  shape_t<3> output_shape(const shape_t<3>& input) const noexcept { return input; }

  // Rotation tables a caller gives in place of the config's RoPE (ops/rope.hpp):
  // cos, sin [P, D/2], row p for position p.
  using rope_table_type = rope_table<accum_t<T>>;

  // x [B, N, C] -> y [B, N, C]; or a packed batch x [1, total, C] with its
  // cu_seqlens (modules/sequences.hpp), each sequence attending within itself.
  // With a rope_table, RoPE rotates by its entries instead of config's theta
  // (positions from 0 in each sequence, as without); backward takes it again.
  void forward(cview<T, 3> x, TensorView<T, 3> y, saved_type& s, sequence_offsets sequences = {},
               const rope_table_type& table = {}) const {
    constexpr std::string_view where = "MultiHead::forward";
    check_input(where, x, y, sequences);
    project(x, s);
    detail::for_each_sequence(sequences, [&](const auto& seq) {
      rotate(seq.rows(detail::rope_vectors(s.q)), table, true);
      rotate(seq.rows(detail::rope_vectors(s.k)), table, true);
    });
    attn_.forward(s.q.view(), s.k.view(), s.v.view(), s.o.view(), s.attn, sequences);
    output(s, y);
    s.rope_table_positions = table.empty() ? 0 : table.positions();
    s.input_shape = x.shape();
  }
  // The same output, keeping no state (inference): only this call's scratch.
  void forward(cview<T, 3> x, TensorView<T, 3> y, sequence_offsets sequences = {},
               const rope_table_type& table = {}) const {
    saved_type scratch;
    forward(x, y, scratch, sequences, table);
  }

  // dy [B, N, C] -> dx [B, N, C] (assign); every parameter gradient accumulates.
  // table: the forward's rope_table, if it had one.
  void backward(cview<T, 3> x, cview<T, 3> dy, const saved_type& s, TensorView<T, 3> dx,
                const rope_table_type& table = {}) {
    constexpr std::string_view where = "MultiHead::backward";
    detail::check_token_backward(where, x, dy, dx, s.input_shape, config_.d_model, policy_.memory().space());
    require(table.empty() ? s.rope_table_positions == 0 : table.positions() == s.rope_table_positions, where, "table",
            [&] {
              return s.rope_table_positions == 0 ? std::string("none (the forward rotated by config.rope_theta)")
                                                 : "the forward's rope_table of " +
                                                       std::to_string(s.rope_table_positions) + " positions";
            },
            [&] { return table.empty() ? std::string("none") : std::to_string(table.positions()) + " positions"; });
    require_trainable(where);
    const index_t B = x.extent(0), N = x.extent(1), h = config_.heads, g = config_.kv_heads, D = config_.head_dim;
    auto& memory = policy_.memory();
    Tensor<T, 3> d_normed(s.normed.shape(), memory);
    Tensor<T, 4> d_o(s.o.shape(), memory);
    Tensor<T, 5> dq(s.q.shape(), memory), dk(s.k.shape(), memory);
    Tensor<T, 4> dv(s.v.shape(), memory);

    out_proj_.backward(s.normed.view(), dy, s.out_proj, d_normed.view());
    subln_.backward(per_head(s.o.view()), d_normed.const_view().template reshape<3>({B, N * h, 2 * D}), s.subln,
                    per_head(d_o.view()));
    attn_.backward(s.q.view(), s.k.view(), s.v.view(), s.o.view(), d_o.view(), s.attn, dq.view(), dk.view(),
                   dv.view());
    detail::for_each_sequence(s.attn.sequences, [&](const auto& seq) {
      rotate(seq.rows(detail::rope_vectors(dq)), table, false);
      rotate(seq.rows(detail::rope_vectors(dk)), table, false);
    });
    q_proj_.backward(x, dq.view().template reshape<3>({B, N, 2 * h * D}), s.q_proj, dx);
    k_proj_.backward(x, dk.view().template reshape<3>({B, N, 2 * g * D}), s.k_proj, dx, write_mode::add);
    v_proj_.backward(x, dv.view().template reshape<3>({B, N, 2 * g * D}), s.v_proj, dx, write_mode::add);
  }

  // Throws input_error where the module computes for inference only (config.logit_bits, int8 weights).
  void require_trainable(std::string_view where) const {
    attn_.require_trainable(where);
    this->for_each_linear([&](const auto& l) { l.require_trainable(where); });
  }

  // Inference with a KV cache (modules/kv_cache.hpp). A cache for `batch`
  // sequences of up to `capacity` tokens, in the policy's memory:
  using cache_type = KVCache<T>;
  // storage int8: keys and values as int8 with steps (kv_cache.hpp; low-bit CPU policies).
  cache_type make_cache(index_t batch, index_t capacity, inference_dtype storage = inference_dtype::same) const {
    return cache_type(detail::with_storage<Policy>("MultiHead::make_cache", attn_.cache_shape(batch, capacity), storage),
                      policy_.memory());
  }
  KVCacheShape cache_shape(index_t batch, index_t capacity) const noexcept { return attn_.cache_shape(batch, capacity); }
  // Prompts x [B, N, C] (or packed [1, total, C] with cu_seqlens, one cache
  // sequence each) -> y like x; the cache restarts holding their keys and values.
  void prefill(cview<T, 3> x, cache_type& cache, TensorView<T, 3> y, sequence_offsets sequences = {}) const {
    constexpr std::string_view where = "MultiHead::prefill";
    check_input(where, x, y, sequences);
    detail::check_prefill(where, cache, attn_.cache_shape(0, 0), x, sequences, policy_.memory().space());
    saved_type s;
    forward(x, y, s, sequences);
    cache.reset();
    detail::append_prompts(cache, s.k.const_view(), s.v.const_view(), sequences);
  }
  // T new tokens per sequence x [B, T, C] -> y [B, T, C], each at its position
  // (the sequence's cache length); their keys and values join the cache.
  void decode(cview<T, 3> x, cache_type& cache, TensorView<T, 3> y) const {
    constexpr std::string_view where = "MultiHead::decode";
    check_input(where, x, y, {});
    cache.require_layout(where, attn_.cache_shape(x.extent(0), cache.capacity()), x.extent(0), policy_.memory().space());
    cache.require_decodable(where, x.extent(1));
    saved_type s;
    project(x, s);
    detail::rope_from_positions(policy_, detail::rope_vectors(s.q), cache.lengths(), config_.rope_theta,
                                config_.rope_scaling);
    detail::rope_from_positions(policy_, detail::rope_vectors(s.k), cache.lengths(), config_.rope_theta,
                                config_.rope_scaling);
    cache.append(s.k.view(), s.v.view());
    attn_.decode(s.q.view(), cache, s.o.view());
    output(s, y);
  }

  std::vector<parameter_ref<T>> parameters(const std::string& prefix = "") {
    std::vector<parameter_ref<T>> all;
    append_parameters(all, q_proj_.parameters(prefix + "q_proj."));
    append_parameters(all, k_proj_.parameters(prefix + "k_proj."));
    append_parameters(all, v_proj_.parameters(prefix + "v_proj."));
    append_parameters(all, out_proj_.parameters(prefix + "out_proj."));
    append_parameters(all, attn_.parameters(prefix));
    append_parameters(all, subln_.parameters(prefix + "subln."));
    return all;
  }
  void reset_parameters(random_stream& rng) {
    q_proj_.reset_parameters(rng);
    k_proj_.reset_parameters(rng);
    v_proj_.reset_parameters(rng);
    out_proj_.reset_parameters(rng);
    attn_.reset_parameters(rng);
    subln_.reset_parameters(rng);
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
  static MultiHeadConfig checked(MultiHeadConfig c) {
    require(c.d_model > 0, "MultiHead", "config.d_model", "d_model >= 1", std::to_string(c.d_model));
    c.kv_heads = detail::checked_kv_heads("MultiHead", c.heads, c.kv_heads);
    c.head_dim = detail::checked_head_dim<HeadDim>("MultiHead", c.head_dim);
    require(c.layer_index >= 0, "MultiHead", "config.layer_index", "a layer index >= 0", std::to_string(c.layer_index));
    detail::check_rope_parameters("MultiHead", "config.rope_theta", c.rope_theta, "config.rope_scaling", c.rope_scaling);
    require(c.subln_eps > 0 && std::isfinite(c.subln_eps), "MultiHead", "config.subln_eps", "a finite eps > 0",
            std::to_string(c.subln_eps));
    detail::checked_logit_bits<Policy, accum_t<T>>("MultiHead", c.logit_bits);
    detail::checked_qk_dtype<Policy, accum_t<T>>("MultiHead", c.qk_dtype);
    return c;
  }

 private:
  friend detail::linear_weight_forms<MultiHead>;
  // The four projections, for linear_weight_forms (int8 weights, panels, packed copies).
  template <class Self, class F>
  static void visit_linears(Self& self, F& f) {
    for (auto* l : {&self.q_proj_, &self.k_proj_, &self.v_proj_, &self.out_proj_}) f(*l);
  }
  void check_input(std::string_view where, const cview<T, 3>& x, const TensorView<T, 3>& y,
                   sequence_offsets sequences) const {
    detail::check_token_call(where, x, y, sequences, config_.d_model, policy_.memory().space());
  }
  // RoPE of a forward (or its backward) on vectors [B, N, V, D] from position
  // 0: the caller's table where given, else config's theta and scaling.
  void rotate(TensorView<T, 4> vectors, const rope_table_type& table, bool forward) const {
    if (!table.empty()) {
      if (forward)
        rope_forward(policy_, vectors, 0, table);
      else
        rope_backward(policy_, vectors, 0, table);
    } else if (forward) {
      rope_forward(policy_, vectors, 0, config_.rope_theta, config_.rope_scaling);
    } else {
      rope_backward(policy_, vectors, 0, config_.rope_theta, config_.rope_scaling);
    }
  }
  // x [B, N, C] -> s.q, s.k, s.v (not yet rotated)
  void project(cview<T, 3> x, saved_type& s) const {
    const index_t B = x.extent(0), N = x.extent(1), h = config_.heads, g = config_.kv_heads, D = config_.head_dim;
    s.q.resize(attn_.q_shape(B, N), policy_.memory());
    s.k.resize(attn_.k_shape(B, N), policy_.memory());
    s.v.resize(attn_.v_shape(B, N), policy_.memory());
    s.o.resize(attn_.output_shape(B, N), policy_.memory());
    linear_type::forward_together(x, {{q_proj_, s.q.view().template reshape<3>({B, N, 2 * h * D}), s.q_proj},
                                      {k_proj_, s.k.view().template reshape<3>({B, N, 2 * g * D}), s.k_proj},
                                      {v_proj_, s.v.view().template reshape<3>({B, N, 2 * g * D}), s.v_proj}});
  }
  // s.o [B, N, h, 2D] -> subln -> out_proj -> y [B, N, C]
  void output(saved_type& s, TensorView<T, 3> y) const {
    const index_t B = s.o.extent(0), N = s.o.extent(1), h = config_.heads, D = config_.head_dim;
    s.normed.resize({B, N, 2 * h * D}, policy_.memory());
    subln_.forward(per_head(s.o.view()), s.normed.view().template reshape<3>({B, N * h, 2 * D}), s.subln);
    out_proj_.forward(s.normed.view(), y, s.out_proj);
  }
  // [B, N, h, 2D] seen as [B, N·h, 2D]: the subln normalises each head's vector.
  template <class V>
  static auto per_head(V o) {
    return o.template reshape<3>({o.extent(0), o.extent(1) * o.extent(2), o.extent(3)});
  }

  Policy policy_;
  MultiHeadConfig config_;
  linear_type q_proj_, k_proj_, v_proj_, out_proj_;
  attn_type attn_;
  norm_type subln_;
};

}  // namespace difftx
