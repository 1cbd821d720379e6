// detail::SoftmaxHeads<T, D, Policy>: what the standard attention (Attention)
// and differential attention V2 (MultiHeadV2) share. H query heads and G
// key/value heads of size D projected from x [B, N, C], RoPE on q and k, and
// one grouped-query softmax attention:
//   o_i = softmax(Q_i K_j^T / sqrt(D)) V_j,  j = i / (H / G)        o [B, N, H, D]
// with its backward, prefill and decode. What follows o (an output projection;
// V2's pairing of heads) is the owning module's, and so are the config checks.
// Parameters: "q_proj.weight" [HD, C], "k_proj.weight" [GD, C], "v_proj.weight" [GD, C].
#pragma once

#include <string>
#include <vector>

#include "difftx/modules/attention_heads.hpp"
#include "difftx/modules/kv_cache.hpp"
#include "difftx/modules/linear.hpp"
#include "difftx/modules/linear_weight_forms.hpp"
#include "difftx/modules/sequences.hpp"
#include "difftx/ops/attention.hpp"
#include "difftx/ops/attention_decode.hpp"
#include "difftx/ops/logit_quantization.hpp"
#include "difftx/ops/rope.hpp"

namespace difftx::detail {

template <Scalar T, class Policy>
class SoftmaxHeads : public detail::linear_weight_forms<SoftmaxHeads<T, Policy>> {
  using linear_type = Linear<T, Policy>;

 public:
  struct saved_type {
    shape_t<3> input_shape{};
    typename linear_type::saved_type q_proj, k_proj, v_proj;
    Tensor<T, 5> q;                  // [B, N, H, 1, D] projected and rotated
    Tensor<T, 5> k;                  // [B, N, G, 1, D] projected and rotated
    Tensor<T, 4> v;                  // [B, N, G, D]
    Tensor<accum_t<T>, 4> lse;       // [B, H, 1, N]
    Tensor<T, 4> o;                  // [B, N, H, D] softmax(Q K^T / sqrt(D)) V per query head
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

  // config: H query heads, G key/value heads dividing H, as the owner checked it.
  SoftmaxHeads(const AttentionHeadsConfig& config, const Policy& policy)
      : policy_(policy),
        config_(config),
        q_proj_(config.d_model, config.heads * config.head_dim, policy),
        k_proj_(config.d_model, config.kv_heads * config.head_dim, policy),
        v_proj_(config.d_model, config.kv_heads * config.head_dim, policy) {}

  // x [B, N, C] (checked by the caller) -> s.o [B, N, H, D], saving q, k, v, lse.
  void forward(cview<T, 3> x, saved_type& s, sequence_offsets sequences) const {
    const index_t B = x.extent(0), N = x.extent(1);
    project(x, s);
    s.lse.resize({B, config_.heads, 1, N}, policy_.memory());
    for_each_sequence(sequences, [&](const auto& seq) {
      rope_forward(policy_, seq.rows(rope_vectors(s.q)), 0, config_.rope_theta, config_.rope_scaling);
      rope_forward(policy_, seq.rows(rope_vectors(s.k)), 0, config_.rope_theta, config_.rope_scaling);
    });
    // A packed batch in one call where the policy has such a path, else a call per sequence.
    if (!attention_forward_packed<1>(policy_, s.q.const_view(), s.k.const_view(), s.v.const_view(),
                                     cview<accum_t<T>, 1>{}, config_.causal, s.o.view(), TensorView<T, 4>{},
                                     s.lse.view(), sequences))
      for_each_sequence(sequences, [&](const auto& seq) {
        if constexpr (low_bit_policy<Policy>)
          attention_forward<1>(policy_, seq.rows(s.q.const_view()), seq.rows(s.k.const_view()),
                               seq.rows(s.v.const_view()), cview<accum_t<T>, 1>{}, config_.causal,
                               seq.rows(s.o.view()), TensorView<T, 4>{}, seq.lse(s.lse.view()), config_.logit_bits,
                               config_.qk_dtype);
        else
          attention_forward<1>(policy_, seq.rows(s.q.const_view()), seq.rows(s.k.const_view()),
                               seq.rows(s.v.const_view()), cview<accum_t<T>, 1>{}, config_.causal,
                               seq.rows(s.o.view()), TensorView<T, 4>{}, seq.lse(s.lse.view()));
      });
    s.sequences.assign(sequences.begin(), sequences.end());
    s.input_shape = x.shape();
  }

  // d_o [B, N, H, D] -> dx [B, N, C] (assign); the projections' gradients accumulate.
  void backward(cview<T, 3> x, const saved_type& s, cview<T, 4> d_o, TensorView<T, 3> dx) {
    const index_t B = x.extent(0), N = x.extent(1), H = config_.heads, G = config_.kv_heads, D = config_.head_dim;
    auto& memory = policy_.memory();
    Tensor<T, 5> dq(s.q.shape(), memory), dk(s.k.shape(), memory);
    Tensor<T, 4> dv(s.v.shape(), memory);
    if (!attention_backward_packed<1>(policy_, s.q.const_view(), s.k.const_view(), s.v.const_view(),
                                      cview<accum_t<T>, 1>{}, config_.causal, s.o.const_view(), cview<T, 4>{},
                                      s.lse.const_view(), d_o, dq.view(), dk.view(), dv.view(),
                                      TensorView<accum_t<T>, 1>{}, s.sequences))
      for_each_sequence(s.sequences, [&](const auto& seq) {
        attention_backward<1>(policy_, seq.rows(s.q.const_view()), seq.rows(s.k.const_view()),
                              seq.rows(s.v.const_view()), cview<accum_t<T>, 1>{}, config_.causal,
                              seq.rows(s.o.const_view()), cview<T, 4>{}, seq.lse(s.lse.const_view()), seq.rows(d_o),
                              seq.rows(dq.view()), seq.rows(dk.view()), seq.rows(dv.view()),
                              TensorView<accum_t<T>, 1>{});
      });
    for_each_sequence(s.sequences, [&](const auto& seq) {
      rope_backward(policy_, seq.rows(rope_vectors(dq)), 0, config_.rope_theta, config_.rope_scaling);
      rope_backward(policy_, seq.rows(rope_vectors(dk)), 0, config_.rope_theta, config_.rope_scaling);
    });
    q_proj_.backward(x, dq.view().template reshape<3>({B, N, H * D}), s.q_proj, dx);
    k_proj_.backward(x, dk.view().template reshape<3>({B, N, G * D}), s.k_proj, dx, write_mode::add);
    v_proj_.backward(x, dv.view().template reshape<3>({B, N, G * D}), s.v_proj, dx, write_mode::add);
  }

  // Quantized logits have a zero derivative almost everywhere: such a module is for inference.
  void require_trainable(std::string_view where) const {
    require(config_.logit_bits == logits_unquantized, where, "config.logit_bits",
            "16 (a backward needs unquantized logits; quantization is for inference)",
            std::to_string(config_.logit_bits));
    require(config_.qk_dtype == inference_dtype::same, where, "config.qk_dtype",
            "same (a backward needs the unquantized queries and keys; int8 is for inference)", "int8");
    this->for_each_linear([&](const auto& l) { l.require_trainable(where); });
  }

  // After forward(x, s, sequences) on the prompts: the cache restarts with their keys and values.
  void fill(const saved_type& s, KVCache<T>& cache, sequence_offsets sequences) const {
    cache.reset();
    append_prompts(cache, s.k.const_view(), s.v.const_view(), sequences);
  }
  // New tokens x [B, T, C] (checked by the caller) -> s.o [B, T, H, D], each at
  // its sequence's cache length; their keys and values join the cache.
  void decode(std::string_view where, cview<T, 3> x, KVCache<T>& cache, saved_type& s) const {
    cache.require_layout(where, cache_shape(x.extent(0), cache.capacity()), x.extent(0), policy_.memory().space());
    cache.require_decodable(where, x.extent(1));
    require(config_.causal, where, "config.causal", "a causal module (decoding appends to the past)", "non-causal");
    project(x, s);
    rope_from_positions(policy_, rope_vectors(s.q), cache.lengths(), config_.rope_theta, config_.rope_scaling);
    rope_from_positions(policy_, rope_vectors(s.k), cache.lengths(), config_.rope_theta, config_.rope_scaling);
    cache.append(s.k.view(), s.v.view());
    if constexpr (low_bit_policy<Policy>) {
      if (cache.storage() == inference_dtype::int8)
        attention_decode<1>(policy_, s.q.const_view(), cache.int8_view(), cache.lengths(), cview<accum_t<T>, 1>{},
                            s.o.view(), config_.logit_bits);
      else
        attention_decode<1>(policy_, s.q.const_view(), cache.keys(), cache.values(), cache.lengths(),
                            cview<accum_t<T>, 1>{}, s.o.view(), config_.logit_bits);
    } else {
      attention_decode<1>(policy_, s.q.const_view(), cache.keys(), cache.values(), cache.lengths(),
                          cview<accum_t<T>, 1>{}, s.o.view());
    }
  }
  KVCacheShape cache_shape(index_t batch, index_t capacity) const noexcept {
    return {batch, capacity, config_.kv_heads, 1, config_.head_dim, config_.head_dim};
  }

  void append_parameters_to(std::vector<parameter_ref<T>>& all, const std::string& prefix) {
    append_parameters(all, q_proj_.parameters(prefix + "q_proj."));
    append_parameters(all, k_proj_.parameters(prefix + "k_proj."));
    append_parameters(all, v_proj_.parameters(prefix + "v_proj."));
  }
  void reset_parameters(random_stream& rng) {
    q_proj_.reset_parameters(rng);
    k_proj_.reset_parameters(rng);
    v_proj_.reset_parameters(rng);
  }

 private:
  friend detail::linear_weight_forms<SoftmaxHeads>;
  // The projections, for linear_weight_forms (int8 weights, panels, packed copies).
  template <class Self, class F>
  static void visit_linears(Self& self, F& f) {
    for (auto* l : {&self.q_proj_, &self.k_proj_, &self.v_proj_}) f(*l);
  }
  // x [B, N, C] -> s.q, s.k, s.v (not yet rotated); s.o sized
  void project(cview<T, 3> x, saved_type& s) const {
    const index_t B = x.extent(0), N = x.extent(1), H = config_.heads, G = config_.kv_heads, D = config_.head_dim;
    auto& memory = policy_.memory();
    s.q.resize({B, N, H, 1, D}, memory);
    s.k.resize({B, N, G, 1, D}, memory);
    s.v.resize({B, N, G, D}, memory);
    s.o.resize({B, N, H, D}, memory);
    linear_type::forward_together(x, {{q_proj_, s.q.view().template reshape<3>({B, N, H * D}), s.q_proj},
                                      {k_proj_, s.k.view().template reshape<3>({B, N, G * D}), s.k_proj},
                                      {v_proj_, s.v.view().template reshape<3>({B, N, G * D}), s.v_proj}});
  }

  Policy policy_;
  AttentionHeadsConfig config_;  // checked by the owner, kv_heads and head_dim resolved
  linear_type q_proj_, k_proj_, v_proj_;
};

}  // namespace difftx::detail
