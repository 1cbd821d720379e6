// The simd policy's decode step: its kernels' parallel parts on one
// step_team (step_team.hpp) where the step's products are decoding's, of
// at most gemv_max_rows rows. Products of more rows take the blocked paths
// and oneDNN, which open OpenMP regions of their own; inside the team's
// region those would run on one thread.
#pragma once

#include "difftx/ops/decode_step.hpp"
#include "difftx/policy/simd/common.hpp"
#include "difftx/policy/simd/gemm_blocks.hpp"
#include "difftx/policy/simd/step_team.hpp"

namespace difftx {

template <class Step>
void run_decode_step(const policy::simd& p, index_t rows, Step&& step) {
  const int threads = simd_detail::thread_count(p);
#if defined(_OPENMP)
  if (omp_in_parallel()) return step();  // a step inside a region (a team's included) keeps its threads
#endif
  if (threads <= 1 || rows > simd_detail::gemv_max_rows) return step();
  simd_detail::step_team::hold(threads, step);
}

}  // namespace difftx
