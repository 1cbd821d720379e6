// What every op shares: how an op writes its main output, and the check that
// all of an op's tensors live where its policy computes.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
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

// A packed batch's cumulative offsets cu_seqlens [S + 1] (modules/sequences.hpp);
// empty for a dense batch.
using sequence_offsets = std::span<const index_t>;

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

// offsets: 0 = o_0 < o_1 < ... < o_S = total, with total the rows of a [1, total, ...] input.
template <class X>
void check_sequence_offsets(std::string_view where, std::string_view argument, const X& x,
                            sequence_offsets offsets) {
  require(offsets.size() >= 2, where, "cu_seqlens", "offsets [0, ..., total] of at least one sequence",
          std::to_string(offsets.size()) + " offsets");
  require(x.extent(0) == 1, where, argument, "a packed batch [1, total, ...] with cu_seqlens",
          shape_string(x.shape()));
  require(offsets.front() == 0, where, "cu_seqlens", "a first offset of 0", std::to_string(offsets.front()));
  for (std::size_t s = 1; s < offsets.size(); ++s)
    require(offsets[s] > offsets[s - 1], where, "cu_seqlens", "strictly increasing offsets (no empty sequence)",
            std::to_string(offsets[s - 1]) + " then " + std::to_string(offsets[s]) + " at index " + std::to_string(s));
  require(offsets.back() == x.extent(1), where, "cu_seqlens",
          "a last offset equal to the packed token count " + std::to_string(x.extent(1)), std::to_string(offsets.back()));
}

}  // namespace detail

}  // namespace difftx
