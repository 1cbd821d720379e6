// Attention of a few new tokens over a key/value cache (decoding), with one or
// two softmax maps per head (Maps = 1 standard, Maps = 2 differential), the
// formulas of ops/attention.hpp with the keys taken from the cache:
//
//   q [B, T, H, Maps, d]       the T new tokens of every sequence (rotated)
//   k [B, S, G, Maps, d]       the key cache, S its capacity (rotated keys)
//   v [B, S, G, dv]            the value cache
//   lengths[b] (host memory)   the keys sequence b holds, the new tokens'
//                              included: T <= lengths[b] <= S
//   query i of sequence b sits at position p = lengths[b] - T + i and sees the
//   keys t <= p (decoding is causal); head h reads group j = h / (H / G).
//   o [B, T, H, dv] = O_1 (Maps = 1) or O_1 - lambda O_2 (Maps = 2, lambda [1])
//
// Forward only: nothing is saved. Rows past lengths[b] are never read, so a
// cache need not be cleared between uses.
//
// An int8 cache (modules/kv_cache.hpp, int8_kv): the same formulas over the
// keys step_k · k8 and values step_v · v8 it holds, read in place.
#pragma once

#include <span>

#include "difftx/ops/common.hpp"

namespace difftx::detail {

template <int Maps, class Q, class K, class V, class L, class O>
void check_attention_decode(std::string_view where, memory_space space, const Q& q, const K& k, const V& v,
                            std::span<const index_t> lengths, const L& lambda, const O& o) {
  static_assert(Maps == 1 || Maps == 2, "difftx: attention has one (standard) or two (differential) maps");
  require_nonempty(where, "q", q);
  const index_t B = q.extent(0), T = q.extent(1), H = q.extent(2), d = q.extent(4);
  require(q.extent(3) == Maps, where, "q", [&] { return "shape [B, T, H, " + std::to_string(Maps) + ", d]"; },
          [&] { return shape_string(q.shape()); });
  require_nonempty(where, "k", k);
  const index_t S = k.extent(1), G = k.extent(2);
  require_shape(where, "k", k, {B, S, G, Maps, d});
  require(H % G == 0, where, "k", [&] { return "a group count G dividing the head count H = " + std::to_string(H); },
          [&] { return "G = " + std::to_string(G); });
  require_nonempty(where, "v", v);
  require(v.extent(0) == B && v.extent(1) == S && v.extent(2) == G, where, "v",
          [&] { return "shape [" + std::to_string(B) + ", " + std::to_string(S) + ", " + std::to_string(G) + ", dv]"; },
          [&] { return shape_string(v.shape()); });
  require_shape(where, "o", o, {B, T, H, v.extent(3)});
  require(static_cast<index_t>(lengths.size()) == B, where, "lengths",
          [&] { return "one length per sequence (" + std::to_string(B) + ")"; },
          [&] { return std::to_string(lengths.size()); });
  for (std::size_t b = 0; b < lengths.size(); ++b)
    require(lengths[b] >= T && lengths[b] <= S, where, "lengths",
            [&] { return "lengths in [T, S] = [" + std::to_string(T) + ", " + std::to_string(S) + "]"; },
            [&] { return std::to_string(lengths[b]) + " for sequence " + std::to_string(b); });
  if constexpr (Maps == 2) {
    require_shape(where, "lambda", lambda, {1});
    require_all_in(where, space, {{"lambda", lambda.space()}});
  } else {
    require(lambda.empty(), where, "lambda", "an empty tensor for standard attention",
            [&] { return shape_string(lambda.shape()); });
  }
  require_all_in(where, space, {{"q", q.space()}, {"k", k.space()}, {"v", v.space()}, {"o", o.space()}});
}

// An int8 cache: as above with its int8 tensors, and steps of their shapes.
template <int Maps, class Q, class KV, class L, class O>
void check_attention_decode_int8(std::string_view where, const Q& q, const KV& kv, std::span<const index_t> lengths,
                                 const L& lambda, const O& o) {
  check_attention_decode<Maps>(where, memory_space::host, q, kv.keys8, kv.values8, lengths, lambda, o);
  const index_t B = kv.keys8.extent(0), S = kv.keys8.extent(1), G = kv.keys8.extent(2);
  require_shape(where, "key_steps", kv.key_steps, {B, S, G, Maps});
  require_shape(where, "value_steps", kv.value_steps, {B, S, G});
}

}  // namespace difftx::detail
