// Where a forward first went non-finite. Every module's saved_type lists its
// intermediates in the order the forward computes them
// (for_each_intermediate(prefix, f) calls f(name, what, tensor)), so when an
// output holds a NaN or an infinity although its inputs and weights are
// finite, the first intermediate holding one says where it began, e.g.
// "attn.lse (the log-sum-exp of the attention scores) holds +inf at flat
// index 7: it overflows float32".
#pragma once

#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "difftx/core/scalar_traits.hpp"
#include "difftx/core/tensor.hpp"

namespace difftx {

struct non_finite_value {
  std::string tensor;      // the intermediate's name, e.g. "attn.lse"
  std::string what;        // what it holds, in words
  std::string type_name;   // its element type, e.g. "float32"
  index_t flat_index = 0;  // the first non-finite element
  double value = 0;        // NaN, +inf or -inf

  std::string describe() const {
    const std::string v = std::isnan(value) ? "NaN" : value > 0 ? "+inf" : "-inf";
    return tensor + " (" + what + ") holds " + v + " at flat index " + std::to_string(flat_index) + ": " +
           (std::isnan(value) ? "an overflow or an undefined operation (inf - inf, 0 · inf) came before it in " + type_name
                              : "it overflows " + type_name);
  }
};

namespace detail {

// The index of the first non-finite element of data[0, count) in memory (host
// or device), or -1; value gets that element.
template <class X>
index_t first_non_finite_index(const X* data, index_t count, memory_resource& memory, double& value) {
  std::vector<X> copy;
  if (memory.space() != memory_space::host && count > 0) {
    copy.resize(static_cast<std::size_t>(count));
    memory.download(copy.data(), data, copy.size() * sizeof(X));
    data = copy.data();
  }
  for (index_t i = 0; i < count; ++i) {
    value = scalar_traits<X>::to_double(data[i]);
    if (!std::isfinite(value)) return i;
  }
  return -1;
}

}  // namespace detail

// The first intermediate of `saved` (a module's saved_type after a forward)
// holding a NaN or an infinity, or nothing if all are finite.
template <class Saved>
std::optional<non_finite_value> first_non_finite(const Saved& saved) {
  std::optional<non_finite_value> found;
  saved.for_each_intermediate("", [&]<class X, std::size_t R>(const std::string& name, const char* what,
                                                               const Tensor<X, R>& t) {
    if (found) return;
    double value = 0;
    if (const index_t i = detail::first_non_finite_index(t.data(), t.size(), t.memory(), value); i >= 0)
      found = non_finite_value{name, what, std::string(scalar_traits<X>::name), i, value};
  });
  return found;
}

}  // namespace difftx
