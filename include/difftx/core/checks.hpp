// Argument checks shared by every public entry. Each throws input_error naming
// the entry, the argument, what was expected and what came; none writes anything.
//
// The checks run on every call, a decode step's a few hundred times, so a
// message costs nothing until a check fails: require takes the argument's
// name and each part as text or as a callable that builds it
// ([&] { return "shape " + shape_string(s); }), called only then.
#pragma once

#include <cmath>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "difftx/core/error.hpp"
#include "difftx/core/scalar_traits.hpp"
#include "difftx/core/tensor.hpp"

namespace difftx {

namespace detail {
// A message part as text: itself, or what the callable builds.
template <class Part>
std::string message_part(Part&& part) {
  if constexpr (std::is_invocable_v<Part&>)
    return std::string(part());
  else
    return std::string(std::forward<Part>(part));
}
}  // namespace detail

// Throws input_error(where, argument, expected, got) unless ok; argument,
// expected and got are text or callables returning it.
template <class Argument, class Expected, class Got>
void require(bool ok, std::string_view where, Argument&& argument, Expected&& expected, Got&& got) {
  if (ok) [[likely]]
    return;
  throw input_error(std::string(where), detail::message_part(argument), detail::message_part(expected),
                    detail::message_part(got));
}

template <class T, std::size_t Rank>
void require_shape(std::string_view where, std::string_view argument, const TensorView<T, Rank>& view,
                   const shape_t<Rank>& expected) {
  require(view.shape() == expected, where, argument, [&] { return "shape " + shape_string(expected); },
          [&] { return shape_string(view.shape()); });
}

template <class T, std::size_t Rank>
void require_nonempty(std::string_view where, std::string_view argument, const TensorView<T, Rank>& view) {
  require(!view.empty() && view.data() != nullptr, where, argument, "a non-empty tensor",
          [&] { return "shape " + shape_string(view.shape()) + (view.data() ? "" : " with no data"); });
}

// An argument held in `got` memory where `space` is expected.
inline void require_memory(std::string_view where, std::string_view argument, memory_space got, memory_space space) {
  require(got == space, where, argument, [&] { return std::string(to_string(space)) + " memory"; },
          [&] { return std::string(to_string(got)) + " memory"; });
}

template <class T, std::size_t Rank>
void require_space(std::string_view where, std::string_view argument, const TensorView<T, Rank>& view,
                   memory_space space) {
  require_memory(where, argument, view.space(), space);
}

// A module input [B, N, C]: non-empty, last axis C, in the policy's memory.
template <class T>
void require_tokens(std::string_view where, std::string_view argument, const TensorView<T, 3>& x, index_t width,
                    memory_space space) {
  require_nonempty(where, argument, x);
  require(x.extent(2) == width, where, argument, [&] { return "shape [B, N, " + std::to_string(width) + "]"; },
          [&] { return shape_string(x.shape()); });
  require_space(where, argument, x, space);
}

// A backward's saved state must come from a forward on the same input shape
// (x [B, N, C] for most modules, token ids [B, N] for the embedding).
template <std::size_t Rank>
void require_saved(std::string_view where, const shape_t<Rank>& saved_for, const shape_t<Rank>& input,
                   std::string_view input_name = "x") {
  if (saved_for == input) return;  // the common case builds no message
  const std::string on = " on " + std::string(input_name) + " ";
  require(saved_for == input, where, "saved", "the saved state of a forward" + on + shape_string(input),
          saved_for == shape_t<Rank>{} ? std::string("a state no forward has filled")
                                       : "the state of a forward" + on + shape_string(saved_for));
}

// Throws if any element is NaN or infinite (host memory), naming the first one.
template <class T, std::size_t Rank>
void require_finite(std::string_view where, std::string_view argument, const TensorView<T, Rank>& view) {
  require_space(where, argument, view, memory_space::host);
  const auto* data = view.data();
  for (index_t i = 0; i < view.size(); ++i) {
    const double x = scalar_traits<std::remove_const_t<T>>::to_double(data[i]);
    if (!std::isfinite(x))  // the message is built only on failure: this runs per element
      throw input_error(std::string(where), std::string(argument), "finite values",
                        std::to_string(x) + " at flat index " + std::to_string(i));
  }
}

}  // namespace difftx
