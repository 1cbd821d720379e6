// CUDA RMSNorm forward/backward (formulas in difftx/ops/rmsnorm.hpp): one
// block of 128 threads per row; dw by a second kernel that reduces each column
// over all rows (coalesced, deterministic, no atomics). Arithmetic and rstd in
// the accumulation type (float, or double for float64).
#pragma once

#include "difftx/ops/rmsnorm.hpp"
#include "difftx/policy/cuda/device_types.cuh"
#include "difftx/policy/cuda/tag.cuh"

namespace difftx {

namespace cuda_detail {

constexpr unsigned row_threads = 128;

// Sum over a block of row_threads threads; every thread gets the total.
template <class A>
__device__ __forceinline__ A block_sum(A x) {
  __shared__ A partial[row_threads / 32];
  x = warp_sum(x);
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = x;
  __syncthreads();
  A total = 0;
  for (unsigned w = 0; w < row_threads / 32; ++w) total += partial[w];
  return total;
}

template <class DT, class A = device_accum_t<DT>>
__global__ void rmsnorm_forward_kernel(const DT* x, const DT* w, A eps, A scale, DT* y, A* rstd, int C) {
  const long long row = blockIdx.x;
  const DT* xr = x + row * C;
  A sum_sq = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) sum_sq += to_accum(xr[c]) * to_accum(xr[c]);
  const A r = rsqrt_of(block_sum(sum_sq) / C + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    y[row * C + c] = from_accum<DT>(scale * to_accum(xr[c]) * r * to_accum(w[c]));
}

// dx = r (g - x̂ mean(g ⊙ x̂)),  g = s w ⊙ dy
template <class DT, class A = device_accum_t<DT>>
__global__ void rmsnorm_backward_dx_kernel(const DT* x, const DT* w, const A* rstd, A scale, const DT* dy, DT* dx,
                                           int C) {
  const long long row = blockIdx.x;
  const A r = rstd[row];
  A g_dot_x = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    g_dot_x += scale * to_accum(w[c]) * to_accum(dy[row * C + c]) * to_accum(x[row * C + c]);
  const A mean = r * block_sum(g_dot_x) / C;  // mean(g ⊙ x̂)
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const A g = scale * to_accum(w[c]) * to_accum(dy[row * C + c]);
    dx[row * C + c] = from_accum<DT>(r * (g - to_accum(x[row * C + c]) * r * mean));
  }
}

// dw[c] += s Σ_rows dy x̂: block (32 columns) x (8 row lanes)
template <class DT, class A = device_accum_t<DT>>
__global__ void rmsnorm_backward_dw_kernel(const DT* x, const A* rstd, A scale, const DT* dy, DT* dw, long long M,
                                           int C) {
  __shared__ A partial[8][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  A acc = 0;
  if (c < C)
    for (long long m = threadIdx.y; m < M; m += 8) acc += to_accum(dy[m * C + c]) * to_accum(x[m * C + c]) * rstd[m];
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    A total = 0;
    for (int l = 0; l < 8; ++l) total += partial[l][threadIdx.x];
    dw[c] = from_accum<DT>(to_accum(dw[c]) + scale * total);
  }
}

}  // namespace cuda_detail

// x[M, C], w[C] -> y[M, C] = scale · x · rstd · w,  rstd[M]
template <class T>
  requires supported_by<policy::cuda, T>
void rmsnorm_forward(const policy::cuda& p, cview<T, 2> x, cview<T, 1> w, double eps, double scale, TensorView<T, 2> y,
                     TensorView<accum_t<T>, 1> rstd) {
  using namespace cuda_detail;
  constexpr std::string_view where = "rmsnorm_forward";
  detail::check_rmsnorm(where, memory_space::device, x, w, y, rstd, "y");
  using A = accum_t<T>;
  rmsnorm_forward_kernel<<<static_cast<unsigned>(x.extent(0)), row_threads, 0, p.stream()>>>(
      device_pointer(x.data()), device_pointer(w.data()), static_cast<A>(eps), static_cast<A>(scale),
      device_pointer(y.data()), rstd.data(), static_cast<int>(x.extent(1)));
  DIFFTX_CUDA_CHECK(cudaGetLastError());
}

// dy[M, C] -> dx[M, C] (assign), dw[C] (+=)
template <class T>
  requires supported_by<policy::cuda, T>
void rmsnorm_backward(const policy::cuda& p, cview<T, 2> x, cview<T, 1> w, cview<accum_t<T>, 1> rstd, double scale,
                      cview<T, 2> dy, TensorView<T, 2> dx, TensorView<T, 1> dw) {
  using namespace cuda_detail;
  constexpr std::string_view where = "rmsnorm_backward";
  detail::check_rmsnorm_backward(where, memory_space::device, x, w, rstd, dy, dx, dw);
  using A = accum_t<T>;
  const auto M = x.extent(0);
  const int C = static_cast<int>(x.extent(1));
  rmsnorm_backward_dx_kernel<<<static_cast<unsigned>(M), row_threads, 0, p.stream()>>>(
      device_pointer(x.data()), device_pointer(w.data()), rstd.data(), static_cast<A>(scale),
      device_pointer(dy.data()), device_pointer(dx.data()), C);
  DIFFTX_CUDA_CHECK(cudaGetLastError());
  rmsnorm_backward_dw_kernel<<<blocks_for(C, 32), dim3(32, 8), 0, p.stream()>>>(
      device_pointer(x.data()), rstd.data(), static_cast<A>(scale), device_pointer(dy.data()),
      device_pointer(dw.data()), M, C);
  DIFFTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace difftx
