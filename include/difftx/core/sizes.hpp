// Sizes that come from outside (file headers, command lines, shapes multiplied
// into buffer sizes), multiplied with overflow detection: a product that does
// not fit is an input_error naming where it came from, never a wrapped small
// number that passes a later check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "difftx/core/error.hpp"

namespace difftx {

// The most elements one tensor may hold (2^48, 256 TiB of bytes): beyond any
// machine, far below where index_t arithmetic on offsets could wrap.
inline constexpr std::uint64_t max_tensor_elements = std::uint64_t{1} << 48;

// a · b for a, b >= 0, or input_error(where, argument, ...) when the product
// exceeds `limit`.
inline std::uint64_t checked_multiply(std::uint64_t a, std::uint64_t b, std::uint64_t limit, std::string_view where,
                                      std::string_view argument, std::string_view what = "a product") {
  if (a != 0 && b > limit / a)
    throw input_error(std::string(where), std::string(argument), std::string(what) + " of at most " + std::to_string(limit),
                      std::to_string(a) + " · " + std::to_string(b) + ", more than that");
  return a * b;
}

// The element count of a shape (any range of integer extents), checked: each
// extent non-negative, the product at most max_tensor_elements.
template <class Extents>
std::uint64_t checked_element_count(const Extents& shape, std::string_view where, std::string_view argument) {
  std::uint64_t count = 1;
  for (auto e : shape) {
    if (e < 0)
      throw input_error(std::string(where), std::string(argument), "non-negative extents",
                        "an extent of " + std::to_string(e));
    count = checked_multiply(count, static_cast<std::uint64_t>(e), max_tensor_elements, where, argument,
                             "an element count");
  }
  return count;
}

// count elements of `element_size` bytes, checked to fit std::size_t.
inline std::size_t checked_bytes(std::uint64_t count, std::size_t element_size, std::string_view where,
                                 std::string_view argument) {
  return static_cast<std::size_t>(checked_multiply(count, element_size, std::numeric_limits<std::size_t>::max(), where,
                                                   argument, "a size in bytes"));
}

}  // namespace difftx
