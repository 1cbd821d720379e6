// CUDA V2 head combination (formulas in difftx/ops/diff_heads.hpp), in the
// accumulation type. Forward: one thread per output value. Backward: one warp
// per (token, head) row, as dz reduces over the row's D values.
#pragma once

#include "difftx/ops/diff_heads.hpp"
#include "difftx/policy/cuda/device_types.cuh"
#include "difftx/policy/cuda/elementwise.cuh"
#include "difftx/policy/cuda/tag.cuh"

namespace difftx {

namespace cuda_detail {

constexpr unsigned diff_heads_warps = 8;  // rows per block of the backward

template <class DT, class A = device_accum_t<DT>>
__global__ void diff_heads_backward_kernel(const DT* a, const DT* z, const DT* d_o, DT* da, DT* dz, long long rows,
                                           int D) {
  const long long row = blockIdx.x * static_cast<long long>(diff_heads_warps) + threadIdx.x / 32;  // m·h + i
  if (row >= rows) return;
  const unsigned lane = threadIdx.x % 32;
  const A lambda = sigmoid(to_accum(z[row]));
  const DT* grad = d_o + row * D;
  const DT* a2 = a + (2 * row + 1) * D;  // a[m, 2i+1]: row 2(m·h + i) + 1 of a seen as [M·2h, D]
  DT* da1 = da + 2 * row * D;
  DT* da2 = da1 + D;
  A dot = 0;
  for (int c = lane; c < D; c += 32) {
    const A g = to_accum(grad[c]);
    dot += g * to_accum(a2[c]);
    da1[c] = grad[c];
    da2[c] = from_accum<DT>(-lambda * g);
  }
  dot = warp_sum(dot);
  if (lane == 0) dz[row] = from_accum<DT>(-lambda * (A(1) - lambda) * dot);
}

}  // namespace cuda_detail

// a[M, 2h, D], z[M, h] -> o[M, h, D]
template <class T>
  requires supported_by<policy::cuda, T>
void diff_heads_forward(const policy::cuda& p, cview<T, 3> a, cview<T, 2> z, TensorView<T, 3> o) {
  using namespace cuda_detail;
  detail::check_diff_heads("diff_heads_forward", memory_space::device, a, z, o, "o");
  using DT = device_t<T>;
  using A = device_accum_t<DT>;
  const DT *ap = device_pointer(a.data()), *zp = device_pointer(z.data());
  DT* op = device_pointer(o.data());
  const long long D = o.extent(2);
  launch_for_each(p, o.size(), [=] __device__(long long i) {
    const long long row = i / D, c = i % D;  // row = m·h + head
    const A lambda = sigmoid(to_accum(zp[row]));
    op[i] = from_accum<DT>(to_accum(ap[2 * row * D + c]) - lambda * to_accum(ap[(2 * row + 1) * D + c]));
  });
}

// do[M, h, D] -> da[M, 2h, D], dz[M, h] (assign)
template <class T>
  requires supported_by<policy::cuda, T>
void diff_heads_backward(const policy::cuda& p, cview<T, 3> a, cview<T, 2> z, cview<T, 3> d_o, TensorView<T, 3> da,
                         TensorView<T, 2> dz) {
  using namespace cuda_detail;
  detail::check_diff_heads_backward("diff_heads_backward", memory_space::device, a, z, d_o, da, dz);
  using DT = device_t<T>;
  const long long rows = z.size();
  diff_heads_backward_kernel<DT><<<blocks_for(rows, diff_heads_warps), diff_heads_warps * 32, 0, p.stream()>>>(
      device_pointer(a.data()), device_pointer(z.data()), device_pointer(d_o.data()), device_pointer(da.data()),
      device_pointer(dz.data()), rows, static_cast<int>(d_o.extent(2)));
  DIFFTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace difftx
