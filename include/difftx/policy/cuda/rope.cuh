// CUDA rotary position embedding (formulas in difftx/ops/rope.hpp): one thread
// per pair; the angle and its sine and cosine in double, as the reference, the
// rotation in the accumulation type (float, or double for float64).
#pragma once

#include "difftx/ops/rope.hpp"
#include "difftx/policy/cuda/device_types.cuh"
#include "difftx/policy/cuda/tag.cuh"

namespace difftx {

namespace cuda_detail {

template <class DT>
__global__ void rope_kernel(DT* x, long long pairs, long long N, long long V, int d, long long offset, double theta,
                            rope_scaling scaling, double sign) {
  const long long pair = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (pair >= pairs) return;
  const int i = static_cast<int>(pair % (d / 2));
  const long long n = pair / (d / 2) / V % N;
  const double angle = static_cast<double>(offset + n) * rope_inverse_frequency(theta, scaling, i, d);
  double s, c;
  sincos(angle, &s, &c);
  using A = device_accum_t<DT>;
  const A cf = static_cast<A>(c), sf = static_cast<A>(sign * s);
  DT* v = x + 2 * pair;
  const A x0 = to_accum(v[0]), x1 = to_accum(v[1]);
  v[0] = from_accum<DT>(x0 * cf - x1 * sf);
  v[1] = from_accum<DT>(x0 * sf + x1 * cf);
}

template <class T>
void rope_rotate(const policy::cuda& p, TensorView<T, 4> x, index_t offset, double theta, const rope_scaling& scaling,
                 double sign) {
  const long long pairs = x.size() / 2;
  constexpr unsigned threads = 256;
  rope_kernel<<<blocks_for(pairs, threads), threads, 0, p.stream()>>>(device_pointer(x.data()), pairs, x.extent(1),
                                                                      x.extent(2), static_cast<int>(x.extent(3)), offset,
                                                                      theta, scaling, sign);
  DIFFTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cuda_detail

// x[B, N, V, d] rotated in place by the angle of each position.
template <class T>
  requires supported_by<policy::cuda, T>
void rope_forward(const policy::cuda& p, TensorView<T, 4> x, index_t offset, double theta,
                  const rope_scaling& scaling = {}) {
  detail::check_rope("rope_forward", memory_space::device, x, "x", offset, theta, scaling);
  cuda_detail::rope_rotate(p, x, offset, theta, scaling, +1.0);
}

// dx[B, N, V, d] (given as dy, in place) = rotation by the negated angle.
template <class T>
  requires supported_by<policy::cuda, T>
void rope_backward(const policy::cuda& p, TensorView<T, 4> dx, index_t offset, double theta,
                  const rope_scaling& scaling = {}) {
  detail::check_rope("rope_backward", memory_space::device, dx, "dx", offset, theta, scaling);
  cuda_detail::rope_rotate(p, dx, offset, theta, scaling, -1.0);
}

}  // namespace difftx
