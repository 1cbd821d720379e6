// Reference attention over a key/value cache (formulas in
// difftx/ops/attention_decode.hpp): one query row at a time, exactly as written.
#pragma once

#include <span>
#include <vector>

#include "difftx/ops/attention_decode.hpp"
#include "difftx/ops/int8.hpp"
#include "difftx/policy/reference/attention.hpp"

namespace difftx {

// q [B,T,H,Maps,d], k [B,S,G,Maps,d], v [B,S,G,dv], lengths [B] (host), lambda [1] (Maps = 2) -> o [B,T,H,dv]
// logit_bits: 16, or the logits quantized to 4..8 bits (ops/logit_quantization.hpp).
template <int Maps, Scalar T>
void attention_decode(const policy::reference&, cview<T, 5> q, cview<T, 5> k, cview<T, 4> v,
                      std::span<const index_t> lengths, cview<accum_t<T>, 1> lambda, TensorView<T, 4> o,
                      int logit_bits = logits_unquantized) {
  detail::check_attention_decode<Maps>("attention_decode", memory_space::host, q, k, v, lengths, lambda, o);
  detail::check_logit_bits<accum_t<T>>("attention_decode", logit_bits);
  using A = accum_t<T>;
  const index_t B = q.extent(0), new_tokens = q.extent(1), H = q.extent(2), d = q.extent(4);
  const index_t group_size = H / k.extent(2), dv = v.extent(3);
  const A scale = A(1.0) / scalar_traits<T>::sqrt(A(static_cast<double>(d)));
  std::vector<A> s;
  std::vector<A> o_maps(static_cast<std::size_t>(Maps * dv), A(0.0));
  for (index_t b = 0; b < B; ++b)
    for (index_t i = 0; i < new_tokens; ++i) {
      const index_t kv_end = lengths[static_cast<std::size_t>(b)] - new_tokens + i + 1;
      for (index_t h = 0; h < H; ++h) {
        for (index_t m = 0; m < Maps; ++m)
          detail::attention_row_output<T>(q, k, v, b, i, h, h / group_size, m, kv_end, scale, logit_bits, s,
                                          o_maps.data() + m * dv);
        for (index_t c = 0; c < dv; ++c) {
          A out = o_maps[static_cast<std::size_t>(c)];
          if constexpr (Maps == 2) out = out - lambda(0) * o_maps[static_cast<std::size_t>(dv + c)];
          o(b, i, h, c) = store<T>(out);
        }
      }
    }
}

// The same over an int8 cache (modules/kv_cache.hpp): the rows each sequence
// holds dequantized (step · int8), then the function above in A.
template <int Maps, Scalar T>
void attention_decode(const policy::reference& p, cview<T, 5> q, const int8_kv<accum_t<T>>& kv,
                      std::span<const index_t> lengths, cview<accum_t<T>, 1> lambda, TensorView<T, 4> o,
                      int logit_bits = logits_unquantized) {
  using A = accum_t<T>;
  detail::check_attention_decode_int8<Maps>("attention_decode", q, kv, lengths, lambda, o);
  detail::check_logit_bits<A>("attention_decode", logit_bits);
  detail::require_int8_arithmetic<A>("attention_decode", "q");
  if constexpr (std::is_floating_point_v<A>) {
    Tensor<A, 5> qa(q.shape()), keys(kv.keys8.shape());
    Tensor<A, 4> values(kv.values8.shape()), out(o.shape());
    for (index_t e = 0; e < q.size(); ++e) qa.data()[e] = load(q.data()[e]);
    const index_t G = keys.extent(2), d = keys.extent(4), dv = values.extent(3);
    for (index_t b = 0; b < keys.extent(0); ++b)
      for (index_t t = 0; t < lengths[static_cast<std::size_t>(b)]; ++t)
        for (index_t g = 0; g < G; ++g) {
          for (index_t m = 0; m < Maps; ++m)
            for (index_t c = 0; c < d; ++c) keys(b, t, g, m, c) = kv.key_steps(b, t, g, m) * A(kv.keys8(b, t, g, m, c));
          for (index_t c = 0; c < dv; ++c) values(b, t, g, c) = kv.value_steps(b, t, g) * A(kv.values8(b, t, g, c));
        }
    attention_decode<Maps, A>(p, qa.const_view(), keys.const_view(), values.const_view(), lengths, lambda, out.view(),
                              logit_bits);
    for (index_t e = 0; e < o.size(); ++e) o.data()[e] = store<T>(out.data()[e]);
  }
}

}  // namespace difftx
