// Token embedding: a row lookup in a table w [V, C] (nn.Embedding).
//   forward : y[M, C] = w[tokens[m], C]
//   backward: dw[V, C] += scatter-add over m of dy[m, C] into row tokens[m]
//             (parameter gradients accumulate; tokens are discrete, no dx)
// Every token must lie in [0, V).
#pragma once

#include "difftx/ops/common.hpp"

namespace difftx::detail {

template <class Tok, class W, class Y>
void check_embedding(std::string_view where, memory_space space, const Tok& tokens, const W& w, const char* w_name,
                     const Y& y, const char* y_name) {
  require_nonempty(where, "tokens", tokens);
  require_nonempty(where, w_name, w);
  require_shape(where, y_name, y, {tokens.extent(0), w.extent(1)});
  require_all_in(where, space, {{"tokens", tokens.space()}, {w_name, w.space()}, {y_name, y.space()}});
}

// Host token ids in [0, count): what an embedding row or a class index must be.
// Reads the ids, so a policy calls it where they are readable.
template <class Tok>
void check_token_range(std::string_view where, std::string_view argument, const Tok& tokens, index_t count,
                       bool allow_negative = false) {
  for (index_t m = 0; m < tokens.size(); ++m) {
    const index_t t = tokens.data()[m];
    if ((allow_negative && t < 0) || (t >= 0 && t < count)) continue;  // the message only for a bad id
    throw input_error(std::string(where), std::string(argument),
                      allow_negative ? "ids < " + std::to_string(count) + " (negative: ignored)"
                                     : "ids in [0, " + std::to_string(count) + ")",
                      std::to_string(t) + " at flat index " + std::to_string(m));
  }
}

}  // namespace difftx::detail
