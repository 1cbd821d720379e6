// The difference measure difftx's tests use to compare two computations of the
// same tensor: normwise relative,
//   max_i |a_i - b_i| / max(max_i |b_i|, floor)
// with b the reference. Elementwise relative error means nothing where b_i is
// near 0; the floor keeps a tensor whose true value is (nearly) zero from being
// judged by its rounding noise alone: pass a fraction of the scale of the
// computation it belongs to (the largest gradient of the module, say).
#pragma once

#include <algorithm>
#include <cmath>

#include "difftx/core/scalar_traits.hpp"
#include "difftx/core/tensor.hpp"

namespace difftx::testing {

// Gradient tensors are compared with a floor of 10% of the largest gradient of
// the module. A tensor that is zero in exact arithmetic (q_proj and k_proj at
// N = 1, where softmax over one key is constant) holds only rounding noise: the
// backward forms dS = P (dP - rowsum(dO ⊙ O)) from O stored in T, so the noise
// is ~1 u of the module's gradient scale (0.6 to 0.9 u measured in float16 and
// bfloat16). Against a 10% floor that reads as ~9 u, inside every backward bar;
// a wrong formula still shows as O(1) in float and double. (The four lambda
// gradients are alike: sums of dO ⊙ O2 over every token, head and channel that
// cancel to ~1e-3 of the scale, so in float32 with another summation order, or
// in bfloat16 at all, they keep few digits of their own.)
constexpr double gradient_floor_fraction = 0.1;

template <class A, class B>
double normwise_difference(const A* a, const B* b, index_t n, double floor = 0.0) {
  double diff = 0, scale = floor;
  for (index_t i = 0; i < n; ++i) {
    const double av = scalar_traits<A>::to_double(a[i]), bv = scalar_traits<B>::to_double(b[i]);
    diff = std::max(diff, std::abs(av - bv));
    scale = std::max(scale, std::abs(bv));
  }
  return scale > 0 ? diff / scale : diff;
}

template <class B>
double max_abs(const B* b, index_t n) {
  double m = 0;
  for (index_t i = 0; i < n; ++i) m = std::max(m, std::abs(scalar_traits<B>::to_double(b[i])));
  return m;
}

}  // namespace difftx::testing
