// Properties of what the readers accept, checked independently of the readers'
// own arithmetic by the fuzz targets (a violation aborts: a finding).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string_view>

#include <difftx/io/tensor_file.hpp>

namespace difftx::fuzz {

[[noreturn]] inline void finding(std::string_view target, std::string_view what) {
  std::cerr << target << ": finding: " << what << "\n";
  std::abort();
}

// Whether t's data is exactly as long as its shape says, with the element count
// computed without overflow (a wrapped product could match a short buffer).
inline bool exact_size(const io::stored_tensor& t) {
  constexpr unsigned __int128 limit = static_cast<unsigned __int128>(1) << 64;  // more than any buffer
  unsigned __int128 n = io::size_of(t.type);
  for (const auto e : t.shape) {
    if (e < 0) return false;
    if (e == 0) return t.bytes.empty();
  }
  for (const auto e : t.shape) {
    n *= static_cast<unsigned __int128>(e);
    if (n > limit) return false;
  }
  return n == t.bytes.size();
}

// Checks an accepted tensor: its size as above, and every element decodes.
inline void check_tensor(std::string_view target, const io::stored_tensor& t) {
  if (!exact_size(t)) finding(target, "accepted a tensor whose data is not as long as its shape says");
  (void)t.values();
}

// Whether every element of t is finite.
inline bool all_finite(const io::stored_tensor& t) {
  for (const double x : t.values())
    if (!std::isfinite(x)) return false;
  return true;
}

}  // namespace difftx::fuzz
