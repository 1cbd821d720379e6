// The library's configs and module types of a spec's kind (module_kinds.hpp):
// what the runner builds (runner_impl.hpp) and what check_config checks.
#pragma once

#include <difftx/modules/attention.hpp>
#include <difftx/modules/decoder_layer.hpp>
#include <difftx/modules/multihead.hpp>
#include <difftx/modules/multihead_v2.hpp>

#include "module_kinds.hpp"

namespace difftx::cli {

// The attention module of each attention kind.
template <attention_kind A, class T, index_t D, class Policy>
struct attention_module_of;
template <class T, index_t D, class Policy>
struct attention_module_of<attention_kind::differential, T, D, Policy> {
  using type = MultiHead<T, D, Policy>;
};
template <class T, index_t D, class Policy>
struct attention_module_of<attention_kind::standard, T, D, Policy> {
  using type = Attention<T, D, Policy>;
};
template <class T, index_t D, class Policy>
struct attention_module_of<attention_kind::differential_v2, T, D, Policy> {
  using type = MultiHeadV2<T, D, Policy>;
};
template <attention_kind A, class T, index_t D, class Policy>
using attention_module = typename attention_module_of<A, T, D, Policy>::type;

// Its config from the spec: the shared AttentionHeadsConfig and the kind's own
// fields; layer_offset is added to the layer index (layer i of a stack).
template <attention_kind A>
auto attention_config(const module_spec& s, index_t layer_offset = 0) {
  if constexpr (A == attention_kind::differential)
    return with_attention_heads(MultiHeadConfig{.layer_index = s.layer_index + layer_offset}, s.attention);
  else if constexpr (A == attention_kind::standard)
    return AttentionConfig{s.attention};
  else
    return with_attention_heads(MultiHeadV2Config{.differential = s.differential}, s.attention);
}

// A decoder layer's config around it.
template <attention_kind A>
auto layer_config(const module_spec& s, index_t layer_offset = 0) {
  return BasicDecoderLayerConfig<decltype(attention_config<A>(s))>{attention_config<A>(s, layer_offset), s.ffn_dim, s.eps};
}

}  // namespace difftx::cli
