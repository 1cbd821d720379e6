// How the retrieval report writes its numbers: proportions, their standard
// errors, fixed decimals.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>

#include <difftx/core/tensor.hpp>

namespace difftx::retrieval::detail {

inline double ratio(index_t a, index_t b) { return b ? static_cast<double>(a) / static_cast<double>(b) : 0.0; }

inline std::string fixed(double v, int digits = 3) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

// One standard error of a proportion, for the honesty of small evaluations.
inline double standard_error(index_t correct, index_t total) {
  if (total == 0) return 0;
  const double p = ratio(correct, total);
  return std::sqrt(p * (1 - p) / static_cast<double>(total));
}

}  // namespace difftx::retrieval::detail
