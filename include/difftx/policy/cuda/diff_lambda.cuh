// CUDA lambda re-parameterisation (formulas in difftx/ops/diff_lambda.hpp):
// lambda stays on the device, where the attention kernels read it. lambda and
// dlambda are in the accumulation type (float, or double for float64), as the
// dot products and exponentials.
#pragma once

#include "difftx/ops/diff_lambda.hpp"
#include "difftx/policy/cuda/device_types.cuh"
#include "difftx/policy/cuda/tag.cuh"

namespace difftx {

namespace cuda_detail {

// a = lq1 · lk1, b = lq2 · lk2, by one warp.
template <class DT, class A = device_accum_t<DT>>
__device__ void lambda_dots(const DT* lq1, const DT* lk1, const DT* lq2, const DT* lk2, int d, A& a, A& b) {
  A dot1 = 0, dot2 = 0;
  for (int c = threadIdx.x; c < d; c += 32) {
    dot1 += to_accum(lq1[c]) * to_accum(lk1[c]);
    dot2 += to_accum(lq2[c]) * to_accum(lk2[c]);
  }
  a = warp_sum(dot1);
  b = warp_sum(dot2);
}

template <class DT, class A = device_accum_t<DT>>
__global__ void diff_lambda_forward_kernel(const DT* lq1, const DT* lk1, const DT* lq2, const DT* lk2, int d,
                                           A lambda_init, A* lambda) {
  A a, b;
  lambda_dots(lq1, lk1, lq2, lk2, d, a, b);
  // exp(a) - exp(b) in the overflow-safe form of ops/diff_lambda.hpp
  const A gap = abs_of(a - b), difference = gap > 0 ? exp_of(max_of(a, b)) * -expm1_of(-gap) : A(0);
  if (threadIdx.x == 0) lambda[0] = (a > b ? difference : -difference) + lambda_init;
}

template <class DT, class A = device_accum_t<DT>>
__global__ void diff_lambda_backward_kernel(const DT* lq1, const DT* lk1, const DT* lq2, const DT* lk2, int d,
                                            const A* dlambda, DT* dlq1, DT* dlk1, DT* dlq2, DT* dlk2) {
  A a, b;
  lambda_dots(lq1, lk1, lq2, lk2, d, a, b);
  const A g1 = dlambda[0] * exp_of(a), g2 = dlambda[0] * exp_of(b);
  for (int c = threadIdx.x; c < d; c += 32) {
    dlq1[c] = from_accum<DT>(to_accum(dlq1[c]) + g1 * to_accum(lk1[c]));
    dlk1[c] = from_accum<DT>(to_accum(dlk1[c]) + g1 * to_accum(lq1[c]));
    dlq2[c] = from_accum<DT>(to_accum(dlq2[c]) - g2 * to_accum(lk2[c]));
    dlk2[c] = from_accum<DT>(to_accum(dlk2[c]) - g2 * to_accum(lq2[c]));
  }
}

}  // namespace cuda_detail

// lq1, lk1, lq2, lk2 [d] -> lambda [1]
template <class T>
  requires supported_by<policy::cuda, T>
void diff_lambda_forward(const policy::cuda& p, TensorView<const T, 1> lq1, cview<T, 1> lk1, cview<T, 1> lq2,
                         cview<T, 1> lk2, double lambda_init, TensorView<accum_t<T>, 1> lambda) {
  using namespace cuda_detail;
  constexpr std::string_view where = "diff_lambda_forward";
  detail::check_diff_lambda(where, memory_space::device, lq1, lk1, lq2, lk2, lambda, "lambda");
  diff_lambda_forward_kernel<<<1, 32, 0, p.stream()>>>(device_pointer(lq1.data()), device_pointer(lk1.data()),
                                                       device_pointer(lq2.data()), device_pointer(lk2.data()),
                                                       static_cast<int>(lq1.size()),
                                                       static_cast<accum_t<T>>(lambda_init), lambda.data());
  DIFFTX_CUDA_CHECK(cudaGetLastError());
}

// dlambda [1] -> dlq1, dlk1, dlq2, dlk2 [d] (+=)
template <class T>
  requires supported_by<policy::cuda, T>
void diff_lambda_backward(const policy::cuda& p, TensorView<const T, 1> lq1, cview<T, 1> lk1, cview<T, 1> lq2,
                          cview<T, 1> lk2, cview<accum_t<T>, 1> dlambda, TensorView<T, 1> dlq1, TensorView<T, 1> dlk1,
                          TensorView<T, 1> dlq2, TensorView<T, 1> dlk2) {
  using namespace cuda_detail;
  constexpr std::string_view where = "diff_lambda_backward";
  detail::check_diff_lambda_backward(where, memory_space::device, lq1, lk1, lq2, lk2, dlambda, dlq1, dlk1, dlq2, dlk2);
  diff_lambda_backward_kernel<<<1, 32, 0, p.stream()>>>(
      device_pointer(lq1.data()), device_pointer(lk1.data()), device_pointer(lq2.data()), device_pointer(lk2.data()),
      static_cast<int>(lq1.size()), dlambda.data(), device_pointer(dlq1.data()), device_pointer(dlk1.data()),
      device_pointer(dlq2.data()), device_pointer(dlk2.data()));
  DIFFTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace difftx
