// Reference attention over a key/value cache (formulas in
// difftx/ops/attention_decode.hpp): one query row at a time, exactly as written.
#pragma once

#include <span>
#include <vector>

#include "difftx/ops/attention_decode.hpp"
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

}  // namespace difftx
