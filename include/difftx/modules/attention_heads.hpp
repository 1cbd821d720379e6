// AttentionHeadsConfig: what every attention module's config holds — the
// width C, the query and key/value heads and their size, RoPE, causality and
// the low-bit inference switches. AttentionConfig is this struct;
// MultiHeadConfig and MultiHeadV2Config hold the same fields under the same
// names and add their own (MultiHead: layer_index and subln_eps; V2:
// differential). They keep them flat, not as a base class or a member,
// because a C++20 designated initializer names only a struct's own fields:
// `MultiHead<float, 8>({.d_model = 32, .heads = 2, .layer_index = 1})` works
// only with flat fields. attention_heads() and with_attention_heads() move the
// shared part between any of these configs, so code that builds one from
// another (the difftx tool, a module handing its heads to SoftmaxHeads)
// copies no field by hand.
#pragma once

#include <string>

#include "difftx/core/checks.hpp"
#include "difftx/modules/architecture.hpp"
#include "difftx/ops/int8.hpp"
#include "difftx/ops/logit_quantization.hpp"
#include "difftx/ops/rope.hpp"

namespace difftx {

struct AttentionHeadsConfig {
  index_t d_model = 0;   // C
  index_t heads = 1;     // query heads: h differential heads (MultiHead), H (Attention), h output heads (MultiHeadV2)
  index_t kv_heads = 0;  // key/value groups g (Attention: G); 0 means as many as heads
  double rope_theta = 10000.0;
  bool causal = true;
  index_t head_dim = 0;  // D (MultiHead: the half head size); 0 means the compiled D (needed where D is difftx::dynamic)
  int logit_bits = logits_unquantized;  // 4..8: attention logits quantized (inference, docs/semantics.md)
  inference_dtype qk_dtype = inference_dtype::same;  // int8: Q·Kᵀ on int8 queries and keys (inference)
  difftx::rope_scaling rope_scaling = {};  // linear or llama3 frequencies (transformers' rope_type)
};

namespace detail {
// to's AttentionHeadsConfig fields set to from's (either may be any attention config).
template <class To, class From>
void copy_attention_heads(To& to, const From& from) {
  // The nine fields: a tenth in AttentionHeadsConfig stops the build here until it is copied below too.
  [[maybe_unused]] const auto& [d_model, heads, kv_heads, rope_theta, causal, head_dim, logit_bits, qk_dtype,
                                rope_scaling] = AttentionHeadsConfig{};
  to.d_model = from.d_model;
  to.heads = from.heads;
  to.kv_heads = from.kv_heads;
  to.rope_theta = from.rope_theta;
  to.causal = from.causal;
  to.head_dim = from.head_dim;
  to.logit_bits = from.logit_bits;
  to.qk_dtype = from.qk_dtype;
  to.rope_scaling = from.rope_scaling;
}
}  // namespace detail

// The shared part of an attention config (MultiHeadConfig, MultiHeadV2Config, AttentionConfig).
template <class Config>
AttentionHeadsConfig attention_heads(const Config& config) {
  AttentionHeadsConfig heads;
  detail::copy_attention_heads(heads, config);
  return heads;
}

// config with its shared part replaced by heads; its own fields kept:
//   with_attention_heads(MultiHeadConfig{.layer_index = 3}, heads)
template <class Config>
Config with_attention_heads(Config config, const AttentionHeadsConfig& heads) {
  detail::copy_attention_heads(config, heads);
  return config;
}

// modules/architecture.hpp: the keys every attention module records (c with
// its kv_heads and head_dim resolved); each module adds its own.
inline void describe_architecture(architecture& a, const std::string& prefix, const AttentionHeadsConfig& c) {
  a[prefix + "heads"] = architecture_value(c.heads);
  a[prefix + "kv_heads"] = architecture_value(c.kv_heads == 0 ? c.heads : c.kv_heads);
  a[prefix + "head_dim"] = architecture_value(c.head_dim);
  describe_rope(a, prefix, c.rope_theta, c.rope_scaling);
  a[prefix + "causal"] = architecture_value(c.causal);
}

}  // namespace difftx
