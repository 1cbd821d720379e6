// run_decode_step(policy, rows, step): the kernels of one decode step (rows:
// its new tokens, B·T) as one unit of the policy's work. The simd policy holds its
// threads for the whole step (policy/simd/decode_step.hpp); a policy without
// an overload of its own runs step() as it is.
#pragma once

#include "difftx/ops/common.hpp"

namespace difftx {

template <class Policy, class Step>
void run_decode_step(const Policy&, index_t, Step&& step) {
  step();
}

}  // namespace difftx
