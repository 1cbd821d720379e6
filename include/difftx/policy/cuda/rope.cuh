// CUDA rotary position embedding (formulas in difftx/ops/rope.hpp): one thread
// per pair; the angle and its sine and cosine in double, as the reference (or
// read from a caller's rope_table), the rotation in the accumulation type
// (float, or double for float64).
#pragma once

#include "difftx/ops/rope.hpp"
#include "difftx/policy/cuda/device_types.cuh"
#include "difftx/policy/cuda/tag.cuh"

namespace difftx {

namespace cuda_detail {

// Pair i's angle at a position from theta: its sine and cosine in double.
struct rope_theta_angles {
  double theta;
  rope_scaling scaling;
  int d;
  template <class A>
  __device__ void operator()(long long position, int i, A& c, A& s) const {
    const double angle = static_cast<double>(position) * rope_inverse_frequency(theta, scaling, i, d);
    double sine, cosine;
    sincos(angle, &sine, &cosine);
    c = static_cast<A>(cosine);
    s = static_cast<A>(sine);
  }
};
// Pair i's cosine and sine at a position from a caller's tables [P, d/2] (ops/rope.hpp, rope_table).
template <class A>
struct rope_table_angles {
  const A* cos;
  const A* sin;
  int half;
  __device__ void operator()(long long position, int i, A& c, A& s) const {
    c = cos[position * half + i];
    s = sin[position * half + i];
  }
};

template <class DT, class Angles>
__global__ void rope_kernel(DT* x, long long pairs, long long N, long long V, int d, long long offset, Angles angles,
                            double sign) {
  const long long pair = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (pair >= pairs) return;
  const int i = static_cast<int>(pair % (d / 2));
  const long long n = pair / (d / 2) / V % N;
  using A = device_accum_t<DT>;
  A cf, sf;
  angles(offset + n, i, cf, sf);
  if (sign < 0) sf = -sf;
  DT* v = x + 2 * pair;
  const A x0 = to_accum(v[0]), x1 = to_accum(v[1]);
  v[0] = from_accum<DT>(x0 * cf - x1 * sf);
  v[1] = from_accum<DT>(x0 * sf + x1 * cf);
}

template <class T, class Angles>
void rope_rotate(const policy::cuda& p, TensorView<T, 4> x, index_t offset, Angles angles, double sign) {
  const long long pairs = x.size() / 2;
  constexpr unsigned threads = 256;
  rope_kernel<<<blocks_for(pairs, threads), threads, 0, p.stream()>>>(device_pointer(x.data()), pairs, x.extent(1),
                                                                      x.extent(2), static_cast<int>(x.extent(3)), offset,
                                                                      angles, sign);
  DIFFTX_CUDA_CHECK(cudaGetLastError());
}

template <class T>
rope_table_angles<accum_t<T>> table_angles(const rope_table<accum_t<T>>& table) {
  return {table.cos.data(), table.sin.data(), static_cast<int>(table.cos.extent(1))};
}

}  // namespace cuda_detail

// x[B, N, V, d] rotated in place by the angle of each position.
template <class T>
  requires supported_by<policy::cuda, T>
void rope_forward(const policy::cuda& p, TensorView<T, 4> x, index_t offset, double theta,
                  const rope_scaling& scaling = {}) {
  detail::check_rope("rope_forward", memory_space::device, x, "x", offset, theta, scaling);
  cuda_detail::rope_rotate(p, x, offset, cuda_detail::rope_theta_angles{theta, scaling, static_cast<int>(x.extent(3))},
                           +1.0);
}

// dx[B, N, V, d] (given as dy, in place) = rotation by the negated angle.
template <class T>
  requires supported_by<policy::cuda, T>
void rope_backward(const policy::cuda& p, TensorView<T, 4> dx, index_t offset, double theta,
                  const rope_scaling& scaling = {}) {
  detail::check_rope("rope_backward", memory_space::device, dx, "dx", offset, theta, scaling);
  cuda_detail::rope_rotate(p, dx, offset, cuda_detail::rope_theta_angles{theta, scaling, static_cast<int>(dx.extent(3))},
                           -1.0);
}

// The same with a caller's cos and sin tables (ops/rope.hpp, rope_table), in device memory.
template <class T>
  requires supported_by<policy::cuda, T>
void rope_forward(const policy::cuda& p, TensorView<T, 4> x, index_t offset, const rope_table<accum_t<T>>& table) {
  detail::check_rope("rope_forward", memory_space::device, x, "x", offset, table);
  cuda_detail::rope_rotate(p, x, offset, cuda_detail::table_angles<T>(table), +1.0);
}
template <class T>
  requires supported_by<policy::cuda, T>
void rope_backward(const policy::cuda& p, TensorView<T, 4> dx, index_t offset, const rope_table<accum_t<T>>& table) {
  detail::check_rope("rope_backward", memory_space::device, dx, "dx", offset, table);
  cuda_detail::rope_rotate(p, dx, offset, cuda_detail::table_angles<T>(table), -1.0);
}

}  // namespace difftx
