// How close a module run in number type T must come to the same module run in
// long double on the same inputs and weights (both exactly representable in
// T), as a normwise relative difference max |a - b| / max |b| per tensor.
//
// Two kinds of rounding make the difference, so the bar has two terms:
//   bar = c_store · u_T + c_accum · u_A
// u_T is T's unit roundoff (scalar_traits<T>::epsilon) and u_A that of its
// accumulation type (float for float16 and bfloat16, T itself otherwise).
//  - c_store counts roundings of stored activations to T on the longest path:
//    a DecoderLayer stores ~12 intermediates on its forward path (norm, q/k/v,
//    RoPE, attention, subln, out_proj, residual, norm, gate/up, hidden,
//    down_proj, residual), and its backward path is about twice as long.
//    Independent roundings add like a random walk (sqrt(12) ≈ 3.5), exp and
//    1/rms amplify them by up to their argument's size, so: forward 8, backward 32.
//  - c_accum covers sums in the accumulation type: dot products of length K
//    have error ~sqrt(K) u_A, chained over the same path: forward 64, backward 256.
// What tests/number_types_test.cpp measures (DecoderLayer, the worst module):
// float32 6.8 u / 23 u, float16 1.8 u / 8.5 u, bfloat16 1.5 u / 5.9 u
// (forward / backward), 2x to 10x below these bars; a wrong formula is off by
// O(1), far above all of them.
#pragma once

#include "difftx/core/scalar_traits.hpp"

namespace difftx::testing {

template <class T>
struct tolerance {
  static constexpr double storage = scalar_traits<T>::epsilon;
  static constexpr double accumulation = scalar_traits<accum_t<T>>::epsilon;
  static constexpr double forward = 8 * storage + 64 * accumulation;
  static constexpr double backward = 32 * storage + 256 * accumulation;
};

}  // namespace difftx::testing
