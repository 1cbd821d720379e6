// Attention-logit quantization (the paper's §3.7; docs/semantics.md, "Low-bit
// inference"): dynamic absmax quantization of the scaled logits S = Q K^T / sqrt(d)
// to b bits, one scale per query row of each map, before the softmax.
//
//   m     = max_t |s_t| over the row's visible keys (masked keys excluded)
//   q_max = 2^(b-1) - 1                      (b = 8: 127, 6: 31, 4: 7)
//   s'_t  = nearbyint(s_t · (q_max / m)) · (m / q_max)
//
// in the accumulation type, both factors computed once per row, nearbyint
// rounding half to even. A row with m = 0 or m not finite stays as it is.
// b = 16 means off: no instruction of the unquantized path changes, so its
// output is the unquantized one bit for bit. Every attention forward and
// decode op of the CPU policies takes the bit count as its last argument.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>
#include <type_traits>

#include "difftx/core/checks.hpp"

namespace difftx {

// The bit count that means "not quantized" (the paper's 16-bit reference point).
inline constexpr int logits_unquantized = 16;

// A policy with the low-bit inference paths (logit quantization, int8 caches
// and weights): policy::reference and policy::simd.
template <class Policy>
concept low_bit_policy = requires { requires Policy::low_bit; };

namespace detail {

// b in {4, ..., 8} or 16; A must round (float, double, long double).
template <class A>
void check_logit_bits(std::string_view where, int bits) {
  require((bits >= 4 && bits <= 8) || bits == logits_unquantized, where, "logit_bits",
          "4, 5, 6, 7 or 8 bits, or 16 (not quantized)", [&] { return std::to_string(bits); });
  if constexpr (!std::is_floating_point_v<A>)
    require(bits == logits_unquantized, where, "logit_bits",
            "16 (logit quantization rounds, so it needs float, double or long double arithmetic)",
            [&] { return std::to_string(bits); });
}

// A module's logit_bits: as check_logit_bits, and 16 on a policy without the paths.
template <class Policy, class A>
int checked_logit_bits(std::string_view where, int bits) {
  if constexpr (low_bit_policy<Policy>)
    check_logit_bits<A>(where, bits);
  else
    require(bits == logits_unquantized, where, "config.logit_bits",
            std::string("16: policy::") + Policy::name + " does not quantize attention logits", std::to_string(bits));
  return bits;
}

// The grid of one row: its step m / q_max and the factor q_max / m; off
// (nothing changes) for bits = 16, m = 0 or m not finite. A kernel that sees a
// row in pieces (blocks of keys) takes m over all of them first.
template <class A>
struct logit_grid {
  A to_levels{0}, step{0};
  bool active = false;

  logit_grid() = default;
  logit_grid(A m, int bits) {
    if constexpr (std::is_floating_point_v<A>) {
      if (bits == logits_unquantized || !(m > A(0)) || !std::isfinite(m)) return;
      const A levels = A((1 << (bits - 1)) - 1);
      to_levels = levels / m;
      step = m / levels;
      active = true;
    }
  }
  // s[0, n) in place.
  void apply(A* s, index_t n) const {
    if constexpr (std::is_floating_point_v<A>)
      if (active)
        for (index_t t = 0; t < n; ++t) s[t] = std::nearbyint(s[t] * to_levels) * step;
  }
};

// max_t |s_t| over s[0, n) (0 for n = 0).
template <class A>
A largest_magnitude(const A* s, index_t n) {
  A m(0);
  if constexpr (std::is_floating_point_v<A>)
    for (index_t t = 0; t < n; ++t) m = std::max(m, std::abs(s[t]));
  return m;
}

// A whole row s[0, n) quantized in place.
template <class A>
void quantize_logits(A* s, index_t n, int bits) {
  if (bits != logits_unquantized) logit_grid<A>(largest_magnitude(s, n), bits).apply(s, n);
}

}  // namespace detail

}  // namespace difftx
