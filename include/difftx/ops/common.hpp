// What every op shares: how an op writes its main output, and the check that
// all of an op's tensors live where its policy computes.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "difftx/core/checks.hpp"

namespace difftx {

// assign: out = result; add: out += result (lets a caller sum several
// contributions, e.g. dX from the Q, K and V projections, without a temporary).
enum class write_mode { assign, add };

// A token id (embedding rows, cross-entropy targets). 32 bits as in most
// tokenizers' outputs; a negative cross-entropy target means "no loss here".
using token_t = std::int32_t;

namespace detail {
// sigmoid(z) = 1 / (1 + exp(-z)) in T's accumulation type (the SwiGLU gate, V2's lambda).
template <Scalar T>
accum_t<T> sigmoid(const accum_t<T>& z) {
  using A = accum_t<T>;
  return A(1.0) / (A(1.0) + scalar_traits<T>::exp(-z));
}

// require_all_in(where, memory_space::host, {{"x", x.space()}, {"y", y.space()}})
// Every detail::check_<op> takes the memory space its policy computes in and
// ends with this over the op's tensors, so a policy's entry makes one call.
inline void require_all_in(std::string_view where, memory_space space,
                           std::initializer_list<std::pair<const char*, memory_space>> arguments) {
  for (const auto& [name, got] : arguments) require_memory(where, name, got, space);
}
}  // namespace detail

}  // namespace difftx
