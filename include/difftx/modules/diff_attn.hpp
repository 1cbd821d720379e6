// DiffAttn<T, D, Policy>: the differential attention operator of one layer, on
// projected (and rotated) queries, keys and values (D: the half head size, or
// difftx::dynamic to take it from the config, core/head_dim.hpp):
//   O_i = (softmax(Q1 K1^T / sqrt(D)) - lambda softmax(Q2 K2^T / sqrt(D))) V_j,  j = i / (h / g)
//   lambda = exp(lambda_q1 · lambda_k1) - exp(lambda_q2 · lambda_k2) + lambda_init(layer_index)
// Parameters: "lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2", each [D].
#pragma once

#include <string>
#include <vector>

#include "difftx/core/checks.hpp"
#include "difftx/core/head_dim.hpp"
#include "difftx/modules/kv_cache.hpp"
#include "difftx/modules/parameter.hpp"
#include "difftx/modules/sequences.hpp"
#include "difftx/ops/attention.hpp"
#include "difftx/ops/attention_decode.hpp"
#include "difftx/ops/diff_lambda.hpp"
#include "difftx/ops/logit_quantization.hpp"
#include "difftx/policy/reference.hpp"

namespace difftx {

struct DiffAttnConfig {
  index_t heads = 1;        // h differential heads
  index_t kv_heads = 0;     // g key/value groups; 0 means g = h
  index_t layer_index = 0;  // l, sets lambda_init
  bool causal = true;
  index_t head_dim = 0;  // D; 0 means the compiled D (needed where D is difftx::dynamic)
  int logit_bits = logits_unquantized;  // 4..8: both maps' logits quantized (inference; ops/logit_quantization.hpp)
  inference_dtype qk_dtype = inference_dtype::same;  // int8: Q·Kᵀ on int8 queries and keys (inference; ops/attention.hpp)
};

namespace detail {
// Checks a head/group configuration shared by the attention modules; returns g.
inline index_t checked_kv_heads(std::string_view where, index_t heads, index_t kv_heads) {
  require(heads > 0, where, "config.heads", "heads >= 1", std::to_string(heads));
  const index_t g = kv_heads == 0 ? heads : kv_heads;
  require(g > 0 && heads % g == 0, where, "config.kv_heads",
          "a group count dividing heads = " + std::to_string(heads), std::to_string(kv_heads));
  return g;
}
}  // namespace detail

template <Scalar T, index_t HeadDim, class Policy = policy::reference>
  requires supported_by<Policy, T>
class DiffAttn {
  static_assert(valid_head_dim<HeadDim>,
                "difftx: the half head size D must be positive and even (interleaved RoPE pairs), or difftx::dynamic");

 public:
  using value_type = T;
  using policy_type = Policy;
  static constexpr index_t compiled_head_dim = HeadDim;  // may be difftx::dynamic
  struct saved_type {
    shape_t<3> input_shape{};          // [B, N, h]: what the forward ran on
    Tensor<accum_t<T>, 1> lambda;      // [1]
    Tensor<accum_t<T>, 4> lse;         // [B, h, 2, N] log-sum-exp of each row of both maps
    Tensor<T, 4> o2;                   // [B, N, h, 2D] softmax(Q2 K2^T / sqrt(D)) V
    std::vector<index_t> sequences;    // cu_seqlens of a packed batch (B = 1), empty for a dense one

    template <class F>
    void for_each_intermediate(const std::string& prefix, F&& f) const {
      f(prefix + "lambda", "lambda = exp(lq1·lk1) - exp(lq2·lk2) + lambda_init", lambda);
      f(prefix + "lse", "the log-sum-exp of the attention scores", lse);
      f(prefix + "o2", "the second map's output", o2);
    }
  };

  explicit DiffAttn(const DiffAttnConfig& config, Policy policy = {})
      : policy_(std::move(policy)),
        heads_(config.heads),
        kv_heads_(detail::checked_kv_heads("DiffAttn", config.heads, config.kv_heads)),
        layer_index_(checked_layer_index(config.layer_index)),
        head_dim_(detail::checked_head_dim<HeadDim>("DiffAttn", config.head_dim)),
        causal_(config.causal),
        logit_bits_(detail::checked_logit_bits<Policy, accum_t<T>>("DiffAttn", config.logit_bits)),
        qk_dtype_(detail::checked_qk_dtype<Policy, accum_t<T>>("DiffAttn", config.qk_dtype)),
        lambda_q1_({head_dim_}, policy_.memory()),
        lambda_k1_({head_dim_}, policy_.memory()),
        lambda_q2_({head_dim_}, policy_.memory()),
        lambda_k2_({head_dim_}, policy_.memory()) {
    random_stream rng(0);
    reset_parameters(rng);
  }

  index_t heads() const noexcept { return heads_; }
  index_t kv_heads() const noexcept { return kv_heads_; }
  index_t layer_index() const noexcept { return layer_index_; }
  index_t head_dim() const noexcept { return head_dim_; }  // D
  bool causal() const noexcept { return causal_; }
  int logit_bits() const noexcept { return logit_bits_; }
  double lambda_init() const noexcept { return difftx::lambda_init(layer_index_); }

  shape_t<5> q_shape(index_t B, index_t N) const noexcept { return {B, N, heads_, 2, head_dim_}; }
  shape_t<5> k_shape(index_t B, index_t N) const noexcept { return {B, N, kv_heads_, 2, head_dim_}; }
  shape_t<4> v_shape(index_t B, index_t N) const noexcept { return {B, N, kv_heads_, 2 * head_dim_}; }
  shape_t<4> output_shape(index_t B, index_t N) const noexcept { return {B, N, heads_, 2 * head_dim_}; }

  // q [B, N, h, 2, D], k [B, N, g, 2, D], v [B, N, g, 2D] -> o [B, N, h, 2D]
  // (B = 1 and N = total for a packed batch; each sequence attends within itself)
  void forward(cview<T, 5> q, cview<T, 5> k, cview<T, 4> v, TensorView<T, 4> o, saved_type& saved,
               sequence_offsets sequences = {}) const {
    constexpr std::string_view where = "DiffAttn::forward";
    const auto [B, N] = check_inputs(where, q, k, v, sequences);
    require_shape(where, "o", o, output_shape(B, N));
    saved.lambda.resize({1}, policy_.memory());
    saved.lse.resize({B, heads_, 2, N}, policy_.memory());
    saved.o2.resize(output_shape(B, N), policy_.memory());
    forward_lambda(saved.lambda.view());
    // A packed batch in one call where the policy has such a path, else a call per sequence.
    if (!attention_forward_packed<2>(policy_, q, k, v, saved.lambda.const_view(), causal_, o, saved.o2.view(),
                                     saved.lse.view(), sequences))
      detail::for_each_sequence(sequences, [&](const auto& seq) {
        if constexpr (low_bit_policy<Policy>)
          attention_forward<2>(policy_, seq.rows(q), seq.rows(k), seq.rows(v), saved.lambda.const_view(), causal_,
                               seq.rows(o), seq.rows(saved.o2.view()), seq.lse(saved.lse.view()), logit_bits_,
                               qk_dtype_);
        else
          attention_forward<2>(policy_, seq.rows(q), seq.rows(k), seq.rows(v), saved.lambda.const_view(), causal_,
                               seq.rows(o), seq.rows(saved.o2.view()), seq.lse(saved.lse.view()));
      });
    saved.sequences.assign(sequences.begin(), sequences.end());
    saved.input_shape = {B, N, heads_};
  }

  // o: the forward's output; do [B, N, h, 2D] -> dq, dk, dv (assign); the lambda
  // vectors' gradients accumulate.
  void backward(cview<T, 5> q, cview<T, 5> k, cview<T, 4> v, cview<T, 4> o, cview<T, 4> d_o,
                const saved_type& saved, TensorView<T, 5> dq, TensorView<T, 5> dk, TensorView<T, 4> dv) {
    constexpr std::string_view where = "DiffAttn::backward";
    const auto [B, N] = check_inputs(where, q, k, v, saved.sequences);
    require_saved(where, saved.input_shape, {B, N, heads_});
    require_shape(where, "o", o, output_shape(B, N));
    require_shape(where, "do", d_o, output_shape(B, N));
    require_shape(where, "dq", dq, q.shape());
    require_shape(where, "dk", dk, k.shape());
    require_shape(where, "dv", dv, v.shape());
    require_trainable(where);
    // A packed batch: lambda's gradient is a sum over its sequences, so each
    // call's dlambda goes through diff_lambda_backward, which accumulates.
    Tensor<accum_t<T>, 1> dlambda({1}, policy_.memory());
    auto lambda_backward = [&] {
      diff_lambda_backward(policy_, lambda_q1_.value.const_view(), lambda_k1_.value.const_view(),
                           lambda_q2_.value.const_view(), lambda_k2_.value.const_view(), dlambda.const_view(),
                           lambda_q1_.grad.view(), lambda_k1_.grad.view(), lambda_q2_.grad.view(),
                           lambda_k2_.grad.view());
    };
    if (attention_backward_packed<2>(policy_, q, k, v, saved.lambda.const_view(), causal_, o, saved.o2.const_view(),
                                     saved.lse.const_view(), d_o, dq, dk, dv, dlambda.view(), saved.sequences)) {
      lambda_backward();
      return;
    }
    detail::for_each_sequence(saved.sequences, [&](const auto& seq) {
      attention_backward<2>(policy_, seq.rows(q), seq.rows(k), seq.rows(v), saved.lambda.const_view(), causal_,
                            seq.rows(o), seq.rows(saved.o2.const_view()), seq.lse(saved.lse.const_view()),
                            seq.rows(d_o), seq.rows(dq), seq.rows(dk), seq.rows(dv), dlambda.view());
      lambda_backward();
    });
  }

  // Decoding: q [B, T, h, 2, D], the new tokens' queries, over the keys and
  // values of `cache` (the new tokens' included) -> o [B, T, h, 2D]. Nothing saved.
  void decode(cview<T, 5> q, const KVCache<T>& cache, TensorView<T, 4> o) const {
    constexpr std::string_view where = "DiffAttn::decode";
    require_nonempty(where, "q", q);
    const index_t B = q.extent(0), new_tokens = q.extent(1);
    require_shape(where, "q", q, q_shape(B, new_tokens));
    require_shape(where, "o", o, output_shape(B, new_tokens));
    cache.require_layout(where, cache_shape(B, cache.capacity()), B, policy_.memory().space());
    require(causal_, where, "config.causal", "a causal module (decoding appends to the past)", "non-causal");
    Tensor<accum_t<T>, 1> lambda({1}, policy_.memory());
    forward_lambda(lambda.view());
    if constexpr (low_bit_policy<Policy>) {
      if (cache.storage() == inference_dtype::int8)
        attention_decode<2>(policy_, q, cache.int8_view(), cache.lengths(), lambda.const_view(), o, logit_bits_);
      else
        attention_decode<2>(policy_, q, cache.keys(), cache.values(), cache.lengths(), lambda.const_view(), o,
                            logit_bits_);
    } else {
      attention_decode<2>(policy_, q, cache.keys(), cache.values(), cache.lengths(), lambda.const_view(), o);
    }
  }
  // What a cache of this operator holds: both key halves, values of 2D.
  KVCacheShape cache_shape(index_t batch, index_t capacity) const noexcept {
    return {batch, capacity, kv_heads_, 2, head_dim_, 2 * head_dim_};
  }

  // Quantized logits have a zero derivative almost everywhere: such a module is for inference.
  void require_trainable(std::string_view where) const {
    require(logit_bits_ == logits_unquantized, where, "config.logit_bits",
            "16 (a backward needs unquantized logits; quantization is for inference)", std::to_string(logit_bits_));
    require(qk_dtype_ == inference_dtype::same, where, "config.qk_dtype",
            "same (a backward needs the unquantized queries and keys; int8 is for inference)", "int8");
  }
  std::vector<parameter_ref<T>> parameters(const std::string& prefix = "") {
    return {lambda_q1_.ref(prefix + "lambda_q1"), lambda_k1_.ref(prefix + "lambda_k1"),
            lambda_q2_.ref(prefix + "lambda_q2"), lambda_k2_.ref(prefix + "lambda_k2")};
  }
  // The spec's initialisation: each lambda vector ~ N(0, 0.1^2).
  void reset_parameters(random_stream& rng) {
    for (auto* p : {&lambda_q1_, &lambda_k1_, &lambda_q2_, &lambda_k2_}) p->init_normal(rng, 0.1);
  }
  const Policy& policy() const noexcept { return policy_; }

 private:
  static index_t checked_layer_index(index_t l) {
    require(l >= 0, "DiffAttn", "config.layer_index", "a layer index >= 0", std::to_string(l));
    return l;
  }
  void forward_lambda(TensorView<accum_t<T>, 1> lambda) const {
    diff_lambda_forward(policy_, lambda_q1_.value.view(), lambda_k1_.value.view(), lambda_q2_.value.view(),
                        lambda_k2_.value.view(), lambda_init(), lambda);
  }
  std::pair<index_t, index_t> check_inputs(std::string_view where, const cview<T, 5>& q, const cview<T, 5>& k,
                                           const cview<T, 4>& v, sequence_offsets sequences) const {
    require_nonempty(where, "q", q);
    if (!sequences.empty()) detail::check_sequence_offsets(where, "q", q, sequences);
    const index_t B = q.extent(0), N = q.extent(1);
    require_shape(where, "q", q, q_shape(B, N));
    require_shape(where, "k", k, k_shape(B, N));
    require_shape(where, "v", v, v_shape(B, N));
    detail::require_all_in(where, policy_.memory().space(), {{"q", q.space()}, {"k", k.space()}, {"v", v.space()}});
    return {B, N};
  }

  Policy policy_;
  index_t heads_, kv_heads_, layer_index_, head_dim_;
  bool causal_;
  int logit_bits_;
  inference_dtype qk_dtype_;
  Parameter<T, 1> lambda_q1_, lambda_k1_, lambda_q2_, lambda_k2_;
};

}  // namespace difftx
