// CUDA elementwise kernels: the SwiGLU gate (formulas in difftx/ops/swiglu.hpp),
// residual adds and copies (difftx/ops/elementwise.hpp), in the accumulation
// type (float, or double for float64).
#pragma once

#include "difftx/ops/elementwise.hpp"
#include "difftx/ops/swiglu.hpp"
#include "difftx/policy/cuda/device_types.cuh"
#include "difftx/policy/cuda/tag.cuh"

namespace difftx {

namespace cuda_detail {

constexpr unsigned elementwise_threads = 256;

// f(i) for every i in [0, n), grid-stride.
template <class F>
__global__ void for_each_index(long long n, F f) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    f(i);
}

template <class F>
void launch_for_each(const policy::cuda& p, long long n, F f) {
  if (n == 0) return;
  const unsigned blocks = std::min<unsigned>(blocks_for(n, elementwise_threads), 65535u * 8);
  for_each_index<<<blocks, elementwise_threads, 0, p.stream()>>>(n, f);
  DIFFTX_CUDA_CHECK(cudaGetLastError());
}

__device__ __forceinline__ float sigmoid(float z) { return 1.0f / (1.0f + __expf(-z)); }
__device__ __forceinline__ double sigmoid(double z) { return 1.0 / (1.0 + exp(-z)); }

}  // namespace cuda_detail

// h[M, F] = swish(g) ⊙ u
template <class T>
  requires supported_by<policy::cuda, T>
void swiglu_gate_forward(const policy::cuda& p, cview<T, 2> g, cview<T, 2> u, TensorView<T, 2> h) {
  using namespace cuda_detail;
  constexpr std::string_view where = "swiglu_gate_forward";
  detail::check_swiglu_gate(where, memory_space::device, g, u, h, "h");
  using DT = device_t<T>;
  using A = device_accum_t<DT>;
  const DT *gp = device_pointer(g.data()), *up = device_pointer(u.data());
  DT* hp = device_pointer(h.data());
  launch_for_each(p, g.size(), [=] __device__(long long i) {
    const A z = to_accum(gp[i]);
    hp[i] = from_accum<DT>(z * sigmoid(z) * to_accum(up[i]));
  });
}

// dh[M, F] -> dg, du (assign)
template <class T>
  requires supported_by<policy::cuda, T>
void swiglu_gate_backward(const policy::cuda& p, cview<T, 2> g, cview<T, 2> u, cview<T, 2> dh, TensorView<T, 2> dg,
                          TensorView<T, 2> du) {
  using namespace cuda_detail;
  constexpr std::string_view where = "swiglu_gate_backward";
  detail::check_swiglu_gate_backward(where, memory_space::device, g, u, dh, dg, du);
  using DT = device_t<T>;
  using A = device_accum_t<DT>;
  const DT *gp = device_pointer(g.data()), *up = device_pointer(u.data()), *dhp = device_pointer(dh.data());
  DT *dgp = device_pointer(dg.data()), *dup = device_pointer(du.data());
  launch_for_each(p, g.size(), [=] __device__(long long i) {
    const A z = to_accum(gp[i]), sig = sigmoid(z), grad = to_accum(dhp[i]);
    dgp[i] = from_accum<DT>(grad * to_accum(up[i]) * sig * (A(1) + z * (A(1) - sig)));
    dup[i] = from_accum<DT>(grad * z * sig);
  });
}

// y += x, any rank
template <class T, std::size_t R>
  requires supported_by<policy::cuda, T>
void add_into(const policy::cuda& p, cview<T, R> x, TensorView<T, R> y) {
  using namespace cuda_detail;
  detail::check_same_shape("add_into", memory_space::device, x, y);
  using DT = device_t<T>;
  const DT* xp = device_pointer(x.data());
  DT* yp = device_pointer(y.data());
  launch_for_each(p, x.size(), [=] __device__(long long i) { yp[i] = from_accum<DT>(to_accum(yp[i]) + to_accum(xp[i])); });
}

// y = x, any rank
template <class T, std::size_t R>
  requires supported_by<policy::cuda, T>
void copy_into(const policy::cuda& p, cview<T, R> x, TensorView<T, R> y) {
  detail::check_same_shape("copy_into", memory_space::device, x, y);
  p.memory().copy(y.data(), x.data(), static_cast<std::size_t>(x.size()) * sizeof(T));
}

}  // namespace difftx
