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
