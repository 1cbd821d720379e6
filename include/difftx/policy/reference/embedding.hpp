// Reference embedding lookup and its scatter-add backward (difftx/ops/embedding.hpp).
#pragma once

#include <vector>

#include "difftx/ops/embedding.hpp"
#include "difftx/policy/reference/tag.hpp"

namespace difftx {

// tokens[M], w[V, C] -> y[M, C] = w[tokens[m], :]
template <Scalar T>
void embedding_forward(const policy::reference&, cview<token_t, 1> tokens, cview<T, 2> w, TensorView<T, 2> y) {
  constexpr std::string_view where = "embedding_forward";
  detail::check_embedding(where, memory_space::host, tokens, w, "w", y, "y");
  detail::check_token_range(where, "tokens", tokens, w.extent(0));
  const index_t M = tokens.extent(0), C = w.extent(1);
  for (index_t m = 0; m < M; ++m)
    for (index_t c = 0; c < C; ++c) y(m, c) = w(tokens(m), c);
}

// dy[M, C] -> dw[V, C] += scatter-add of dy's rows into rows tokens[m]
template <Scalar T>
void embedding_backward(const policy::reference&, cview<token_t, 1> tokens, cview<T, 2> dy, TensorView<T, 2> dw) {
  constexpr std::string_view where = "embedding_backward";
  detail::check_embedding(where, memory_space::host, tokens, dw, "dw", dy, "dy");
  detail::check_token_range(where, "tokens", tokens, dw.extent(0));
  using A = accum_t<T>;
  const index_t M = tokens.extent(0), V = dw.extent(0), C = dw.extent(1);
  // Sum in A per row, then add once, as the other parameter gradients do.
  std::vector<A> acc(static_cast<std::size_t>(V * C), A(0.0));
  std::vector<bool> touched(static_cast<std::size_t>(V), false);
  for (index_t m = 0; m < M; ++m) {
    const index_t v = tokens(m);
    touched[static_cast<std::size_t>(v)] = true;
    for (index_t c = 0; c < C; ++c) acc[static_cast<std::size_t>(v * C + c)] = acc[static_cast<std::size_t>(v * C + c)] + load(dy(m, c));
  }
  for (index_t v = 0; v < V; ++v)
    if (touched[static_cast<std::size_t>(v)])
      for (index_t c = 0; c < C; ++c) dw(v, c) = store<T>(load(dw(v, c)) + acc[static_cast<std::size_t>(v * C + c)]);
}

}  // namespace difftx
