// e^x for x <= 0 in double, as the sampler chain weighs its candidates
// (exp(score - largest score)): branch-free arithmetic on the value's bits,
// which compilers vectorize over a row of the vocabulary where std::exp is
// a call per token. Every operation is a correctly rounded add, multiply or
// bit move, so a token's weight has the same bits in a vectorized loop and
// alone, on every CPU.
//
//   double w = difftx::exp_nonpositive(score - largest);  // within 2 ulp of std::exp; 0 below -708.39
#pragma once

#include <bit>
#include <cstdint>

namespace difftx {

// x = n ln2 + r with n = round(x / ln2) and |r| <= ln2/2, then e^r by its
// Taylor series to r^13 (the remainder, under 4e-18, is below half an ulp)
// and 2^n built as a double's exponent field. Results that would be
// subnormal (x < -708.39, weights under 2^-1022 of the largest) are 0: they
// cannot move a sum that holds the largest candidate's weight 1.
inline double exp_nonpositive(double x) noexcept {
  constexpr double log2e = 1.4426950408889634;
  constexpr double ln2_hi = 0x1.62e42feep-1;  // 32 significant bits: n · ln2_hi is exact for |n| < 2^20
  constexpr double ln2_lo = 0x1.a39ef35793c76p-33;
  constexpr double round_shift = 0x1.8p52;  // adding it rounds to an integer, held in the low bits
  constexpr double smallest_normal_x = -708.39;
  const double clamped = x < -745.0 ? -745.0 : x;
  const double shifted = clamped * log2e + round_shift;
  const double n = shifted - round_shift;
  const double r = (clamped - n * ln2_hi) - n * ln2_lo;
  double p = 1.0 / 6227020800.0;  // 1/13!
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  const std::int64_t exponent = std::bit_cast<std::int64_t>(shifted) - std::bit_cast<std::int64_t>(round_shift);
  const double two_to_n = std::bit_cast<double>(static_cast<std::uint64_t>(exponent + 1023) << 52);
  return x < smallest_normal_x ? 0.0 : p * two_to_n;
}

}  // namespace difftx
