// int8 storage for inference (docs/semantics.md, "Low-bit inference"): a
// vector x of n values is stored as n int8 and one scale (the step),
//
//   m = max_i |x_i|,   step = m / 127,   x8_i = nearbyint(x_i · (127 / m))  in [-127, 127]
//
// in the accumulation type A, both factors computed once per vector, nearbyint
// rounding half to even; x_i is then read as step · x8_i, within step / 2 of
// it. A vector of zeros has step 0; one holding a NaN or an infinity has a NaN
// step (x8 = 0), so what reads it is NaN, as IEEE arithmetic would give.
// Weights (one vector per output channel), activations (one per row) and
// the key/value cache (one per token, group and map) all use this rule.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "difftx/core/checks.hpp"
#include "difftx/core/tensor.hpp"
#include "difftx/ops/logit_quantization.hpp"

namespace difftx {

// The storage of a KV cache or of a Linear's weights: the module's own type,
// or int8 with a scale per vector (CPU policies: low_bit_policy).
enum class inference_dtype { same, int8 };

// An int8 cache's tensors (KVCache::int8_view): keys8 [B, S, G, Maps, d] and
// key_steps [B, S, G, Maps]; values8 [B, S, G, dv] and value_steps [B, S, G].
template <class A>
struct int8_kv {
  cview<std::int8_t, 5> keys8;
  cview<A, 4> key_steps;
  cview<std::int8_t, 4> values8;
  cview<A, 3> value_steps;
};

namespace detail {

// The largest |x_i| of x[0, n), and whether every x_i is finite. For IEEE
// float and double, |x|'s bits read as an unsigned integer order as |x|
// does, with an infinity's above every finite value and a NaN's above that:
// one integer maximum, a reduction compilers vectorize (a floating maximum
// they leave scalar without -ffinite-math-only: 0.5 µs of every decoded row
// of 1024). The maximum is exact, so the order changes no bit.
template <class A>
std::pair<A, bool> largest_magnitude_if_finite(const A* x, index_t n) {
  if constexpr (std::numeric_limits<A>::is_iec559 && (sizeof(A) == 4 || sizeof(A) == 8)) {
    using bits = std::conditional_t<sizeof(A) == 4, std::uint32_t, std::uint64_t>;
    constexpr bits magnitude = std::numeric_limits<bits>::max() >> 1;
    bits largest = 0;
    for (index_t i = 0; i < n; ++i) largest = std::max(largest, static_cast<bits>(std::bit_cast<bits>(x[i]) & magnitude));
    const A m = std::bit_cast<A>(largest);
    return {m, m <= std::numeric_limits<A>::max()};  // false for an infinity or a NaN
  } else {
    A m(0);
    for (index_t i = 0; i < n; ++i) {
      const A a = std::abs(x[i]);
      if (!(a <= std::numeric_limits<A>::max())) return {a, false};
      m = std::max(m, a);
    }
    return {m, true};
  }
}

// x[0, n) as n int8 at out; returns the step (x_i ≈ step · out[i]).
template <class A>
A quantize_int8(const A* x, index_t n, std::int8_t* out) {
  const auto [m, finite] = largest_magnitude_if_finite(x, n);
  if (!finite || m == A(0)) {
    std::fill(out, out + n, std::int8_t{0});
    return finite ? A(0) : std::numeric_limits<A>::quiet_NaN();
  }
  const A to_levels = A(127) / m;
  for (index_t i = 0; i < n; ++i)
    out[i] = static_cast<std::int8_t>(std::clamp(std::nearbyint(x[i] * to_levels), A(-127), A(127)));
  return m / A(127);
}

// int8 needs a floating accumulation type to round in.
template <class A>
void require_int8_arithmetic(std::string_view where, std::string_view argument) {
  if constexpr (!std::is_floating_point_v<A>)
    require(false, where, argument, "a number type computed in float, double or long double (int8 storage rounds)",
            "another accumulation type");
}

// A module's qk_dtype: int8 needs a policy with the low-bit paths and a
// floating accumulation type.
template <class Policy, class A>
inference_dtype checked_qk_dtype(std::string_view where, inference_dtype qk) {
  if (qk == inference_dtype::int8) {
    require(low_bit_policy<Policy>, where, "config.qk_dtype", "a policy with int8 Q·Kᵀ (reference, simd)",
            std::string("policy::") + Policy::name);
    require_int8_arithmetic<A>(where, "config.qk_dtype");
  }
  return qk;
}

}  // namespace detail

// Rows of int8 with a step each, padded with zeros to a whole number of 64
// columns (the integer kernels read whole 64-byte vectors):
//   values [rows][padded]   row r is x_r / step[r], rounded (columns >= cols are 0)
//   steps  [rows]           in A
//   sums   [rows]           Σ_c values[r][c] (integer kernels that offset the other operand use it)
template <class A>
struct int8_rows {
  static constexpr index_t column_block = 64;
  index_t rows = 0, cols = 0, padded = 0;
  Tensor<std::int8_t, 1> values;  // tensor memory: huge pages for a large weight (core/memory.hpp)
  std::vector<A> steps;
  std::vector<std::int32_t> sums;

  int8_rows() = default;
  int8_rows(index_t r, index_t c)
      : rows(r), cols(c), padded((c + column_block - 1) / column_block * column_block),
        values({r * padded}), steps(static_cast<std::size_t>(r), A(0)),
        sums(static_cast<std::size_t>(r), 0) {}

  const std::int8_t* row(index_t r) const noexcept { return values.data() + r * padded; }
  // Row r from x[0, cols) (A).
  void set_row(index_t r, const A* x) {
    std::int8_t* out = values.data() + r * padded;
    steps[static_cast<std::size_t>(r)] = detail::quantize_int8(x, cols, out);
    std::int32_t s = 0;
    for (index_t c = 0; c < cols; ++c) s += out[c];
    sums[static_cast<std::size_t>(r)] = s;
  }
  std::size_t bytes() const noexcept {
    return static_cast<std::size_t>(values.size()) + steps.size() * sizeof(A) + sums.size() * sizeof(std::int32_t);
  }
  // The memory a product reads: the values, steps and sums.
  std::vector<std::span<const std::byte>> regions() const {
    return {std::as_bytes(std::span(values.data(), static_cast<std::size_t>(values.size()))),
            std::as_bytes(std::span(steps)), std::as_bytes(std::span(sums))};
  }
};

}  // namespace difftx
