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

#include "difftx/modules/diff_attn.hpp"
#include "difftx/modules/kv_cache.hpp"
#include "difftx/modules/sequences.hpp"
#include "difftx/modules/linear.hpp"
#include "difftx/ops/attention.hpp"
#include "difftx/ops/attention_decode.hpp"
#include "difftx/ops/rope.hpp"

namespace difftx {

struct AttentionConfig {
  index_t d_model = 0;   // C
  index_t heads = 1;     // H
  index_t kv_heads = 0;  // G; 0 means G = H
  double rope_theta = 10000.0;
  bool causal = true;
  index_t head_dim = 0;  // D; 0 means the compiled D (needed where D is difftx::dynamic)
};

template <Scalar T, index_t HeadDim, class Policy = policy::reference>
  requires supported_by<Policy, T>
class Attention {
  static_assert(valid_head_dim<HeadDim>,
                "difftx: the head size D must be positive and even (interleaved RoPE pairs), or difftx::dynamic");
  using linear_type = Linear<T, Policy>;

 public:
  using value_type = T;
  using policy_type = Policy;
  static constexpr index_t compiled_head_dim = HeadDim;  // may be difftx::dynamic
  struct saved_type {
    shape_t<3> input_shape{};
    typename linear_type::saved_type q_proj, k_proj, v_proj, out_proj;
    Tensor<T, 5> q;                 // [B, N, H, 1, D] projected and rotated
    Tensor<T, 5> k;                 // [B, N, G, 1, D] projected and rotated
    Tensor<T, 4> v;                 // [B, N, G, D]
    Tensor<accum_t<T>, 4> lse;      // [B, H, 1, N]
    Tensor<T, 4> o;                 // [B, N, H, D] softmax(Q K^T / sqrt(D)) V, the out_proj input
    std::vector<index_t> sequences;  // cu_seqlens of a packed batch (B = 1), empty for a dense one

    template <class F>
    void for_each_intermediate(const std::string& prefix, F&& f) const {
      f(prefix + "q", "the queries (projected, rotated)", q);
      f(prefix + "k", "the keys (projected, rotated)", k);
      f(prefix + "v", "the values", v);
      f(prefix + "lse", "the log-sum-exp of the attention scores", lse);
      f(prefix + "o", "the attention output", o);
    }
  };

  explicit Attention(const AttentionConfig& config, Policy policy = {})
      : policy_(std::move(policy)),
        config_(checked(config)),
        q_proj_(config_.d_model, config_.heads * config_.head_dim, policy_),
        k_proj_(config_.d_model, config_.kv_heads * config_.head_dim, policy_),
        v_proj_(config_.d_model, config_.kv_heads * config_.head_dim, policy_),
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
    constexpr std::string_view where = "Attention::forward";
    check_input(where, x, y, sequences);
    const index_t B = x.extent(0), N = x.extent(1);
    project(x, s);
    s.lse.resize({B, config_.heads, 1, N}, policy_.memory());
    detail::for_each_sequence(sequences, [&](const auto& seq) {
      rope_forward(policy_, seq.rows(detail::rope_vectors(s.q)), 0, config_.rope_theta);
      rope_forward(policy_, seq.rows(detail::rope_vectors(s.k)), 0, config_.rope_theta);
      attention_forward<1>(policy_, seq.rows(s.q.const_view()), seq.rows(s.k.const_view()), seq.rows(s.v.const_view()),
                           cview<accum_t<T>, 1>{}, config_.causal, seq.rows(s.o.view()), TensorView<T, 4>{},
                           seq.lse(s.lse.view()));
    });
    output(s, y);
    s.sequences.assign(sequences.begin(), sequences.end());
    s.input_shape = x.shape();
  }
  // The same output, keeping no state (inference): only this call's scratch.
  void forward(cview<T, 3> x, TensorView<T, 3> y, sequence_offsets sequences = {}) const {
    saved_type scratch;
    forward(x, y, scratch, sequences);
  }

  // dy [B, N, C] -> dx [B, N, C] (assign); every parameter gradient accumulates
  void backward(cview<T, 3> x, cview<T, 3> dy, const saved_type& s, TensorView<T, 3> dx) {
    constexpr std::string_view where = "Attention::backward";
    require_tokens(where, "x", x, config_.d_model, policy_.memory().space());
    require_saved(where, s.input_shape, x.shape());
    require_shape(where, "dy", dy, x.shape());
    require_shape(where, "dx", dx, x.shape());
    const index_t B = x.extent(0), N = x.extent(1), H = config_.heads, G = config_.kv_heads, D = config_.head_dim;
    auto& memory = policy_.memory();
    Tensor<T, 4> d_o(s.o.shape(), memory);
    Tensor<T, 5> dq(s.q.shape(), memory), dk(s.k.shape(), memory);
    Tensor<T, 4> dv(s.v.shape(), memory);
    out_proj_.backward(s.o.const_view().template reshape<3>({B, N, H * D}), dy, s.out_proj,
                       d_o.view().template reshape<3>({B, N, H * D}));
    detail::for_each_sequence(s.sequences, [&](const auto& seq) {
      attention_backward<1>(policy_, seq.rows(s.q.const_view()), seq.rows(s.k.const_view()), seq.rows(s.v.const_view()),
                            cview<accum_t<T>, 1>{}, config_.causal, seq.rows(s.o.const_view()), cview<T, 4>{},
                            seq.lse(s.lse.const_view()), seq.rows(d_o.const_view()), seq.rows(dq.view()),
                            seq.rows(dk.view()), seq.rows(dv.view()), TensorView<accum_t<T>, 1>{});
      rope_backward(policy_, seq.rows(detail::rope_vectors(dq)), 0, config_.rope_theta);
      rope_backward(policy_, seq.rows(detail::rope_vectors(dk)), 0, config_.rope_theta);
    });
    q_proj_.backward(x, dq.view().template reshape<3>({B, N, H * D}), s.q_proj, dx);
    k_proj_.backward(x, dk.view().template reshape<3>({B, N, G * D}), s.k_proj, dx, write_mode::add);
    v_proj_.backward(x, dv.view().template reshape<3>({B, N, G * D}), s.v_proj, dx, write_mode::add);
  }

  // Inference with a KV cache (modules/kv_cache.hpp): as MultiHead's.
  using cache_type = KVCache<T>;
  cache_type make_cache(index_t batch, index_t capacity) const {
    return cache_type(cache_shape(batch, capacity), policy_.memory());
  }
  // Prompts x [B, N, C] (or packed with cu_seqlens) -> y; the cache restarts with them.
  void prefill(cview<T, 3> x, cache_type& cache, TensorView<T, 3> y, sequence_offsets sequences = {}) const {
    constexpr std::string_view where = "Attention::prefill";
    check_input(where, x, y, sequences);
    detail::check_prefill(where, cache, cache_shape(0, 0), x, sequences, policy_.memory().space());
    saved_type s;
    forward(x, y, s, sequences);
    cache.reset();
    detail::append_prompts(cache, s.k.const_view(), s.v.const_view(), sequences);
  }
  // New tokens x [B, T, C] -> y [B, T, C] at each sequence's position; they join the cache.
  void decode(cview<T, 3> x, cache_type& cache, TensorView<T, 3> y) const {
    constexpr std::string_view where = "Attention::decode";
    check_input(where, x, y, {});
    cache.require_layout(where, cache_shape(x.extent(0), cache.capacity()), x.extent(0), policy_.memory().space());
    cache.require_decodable(where, x.extent(1));
    require(config_.causal, where, "config.causal", "a causal module (decoding appends to the past)", "non-causal");
    saved_type s;
    project(x, s);
    detail::rope_from_positions(policy_, detail::rope_vectors(s.q), cache.lengths(), config_.rope_theta);
    detail::rope_from_positions(policy_, detail::rope_vectors(s.k), cache.lengths(), config_.rope_theta);
    cache.append(s.k.view(), s.v.view());
    attention_decode<1>(policy_, s.q.const_view(), cache.keys(), cache.values(), cache.lengths(),
                        cview<accum_t<T>, 1>{}, s.o.view());
    output(s, y);
  }
  KVCacheShape cache_shape(index_t batch, index_t capacity) const noexcept {
    return {batch, capacity, config_.kv_heads, 1, config_.head_dim, config_.head_dim};
  }

  std::vector<parameter_ref<T>> parameters(const std::string& prefix = "") {
    std::vector<parameter_ref<T>> all;
    append_parameters(all, q_proj_.parameters(prefix + "q_proj."));
    append_parameters(all, k_proj_.parameters(prefix + "k_proj."));
    append_parameters(all, v_proj_.parameters(prefix + "v_proj."));
    append_parameters(all, out_proj_.parameters(prefix + "out_proj."));
    return all;
  }
  void reset_parameters(random_stream& rng) {
    q_proj_.reset_parameters(rng);
    k_proj_.reset_parameters(rng);
    v_proj_.reset_parameters(rng);
    out_proj_.reset_parameters(rng);
  }
  const Policy& policy() const noexcept { return policy_; }

 private:
  static AttentionConfig checked(AttentionConfig c) {
    require(c.d_model > 0, "Attention", "config.d_model", "d_model >= 1", std::to_string(c.d_model));
    c.kv_heads = detail::checked_kv_heads("Attention", c.heads, c.kv_heads);
    c.head_dim = detail::checked_head_dim<HeadDim>("Attention", c.head_dim);
    require(c.rope_theta > 0, "Attention", "config.rope_theta", "theta > 0", std::to_string(c.rope_theta));
    return c;
  }

  void check_input(std::string_view where, const cview<T, 3>& x, const TensorView<T, 3>& y,
                   sequence_offsets sequences) const {
    require_tokens(where, "x", x, config_.d_model, policy_.memory().space());
    require_shape(where, "y", y, x.shape());
    if (!sequences.empty()) detail::check_sequence_offsets(where, "x", x, sequences);
  }
  // x [B, N, C] -> s.q, s.k, s.v (not yet rotated); s.o sized
  void project(cview<T, 3> x, saved_type& s) const {
    const index_t B = x.extent(0), N = x.extent(1), H = config_.heads, G = config_.kv_heads, D = config_.head_dim;
    auto& memory = policy_.memory();
    s.q.resize({B, N, H, 1, D}, memory);
    s.k.resize({B, N, G, 1, D}, memory);
    s.v.resize({B, N, G, D}, memory);
    s.o.resize({B, N, H, D}, memory);
    q_proj_.forward(x, s.q.view().template reshape<3>({B, N, H * D}), s.q_proj);
    k_proj_.forward(x, s.k.view().template reshape<3>({B, N, G * D}), s.k_proj);
    v_proj_.forward(x, s.v.view().template reshape<3>({B, N, G * D}), s.v_proj);
  }
  // s.o [B, N, H, D] -> out_proj -> y [B, N, C]
  void output(saved_type& s, TensorView<T, 3> y) const {
    const index_t B = s.o.extent(0), N = s.o.extent(1);
    out_proj_.forward(s.o.const_view().template reshape<3>({B, N, config_.heads * config_.head_dim}), y, s.out_proj);
  }

  Policy policy_;
  AttentionConfig config_;
  linear_type q_proj_, k_proj_, v_proj_, out_proj_;
};

}  // namespace difftx
