// Storage types on the device: Eigen::half and Eigen::bfloat16 have the bit
// layout of CUDA's __half and __nv_bfloat16, so a module's tensors are handed
// to kernels as the CUDA types, which have the device intrinsics.
//
// Accumulation on the device: device_accum_t<DT> is float for float, __half
// and __nv_bfloat16 and double for double (scalar_traits' accum_type, seen
// from the device types). The CUDA-core kernels load with to_accum, compute in
// that type with the overloads below (exp_of, log_of, ...), and store with
// from_accum<DT>, so float64 runs in double throughout with no float rounding.
// to_float/from_float stay for the tensor-core kernels (float16/bfloat16 only).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <type_traits>

#include <Eigen/Core>

namespace difftx::cuda_detail {

template <class T>
struct device_type {
  using type = T;
};
template <>
struct device_type<Eigen::half> {
  using type = __half;
};
template <>
struct device_type<Eigen::bfloat16> {
  using type = __nv_bfloat16;
};
static_assert(sizeof(Eigen::half) == sizeof(__half) && sizeof(Eigen::bfloat16) == sizeof(__nv_bfloat16));

template <class T>
using device_t = typename device_type<std::remove_const_t<T>>::type;

template <class T>
auto* device_pointer(T* p) {
  if constexpr (std::is_const_v<T>)
    return reinterpret_cast<const device_t<T>*>(p);
  else
    return reinterpret_cast<device_t<T>*>(p);
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class DT>
__device__ __forceinline__ DT from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

template <class DT>
struct device_accum {
  using type = float;
};
template <>
struct device_accum<double> {
  using type = double;
};
// The type a kernel accumulates storage type DT in (float, or double for double).
template <class DT>
using device_accum_t = typename device_accum<std::remove_const_t<DT>>::type;

__device__ __forceinline__ float to_accum(float x) { return x; }
__device__ __forceinline__ double to_accum(double x) { return x; }
__device__ __forceinline__ float to_accum(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_accum(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class DT>
__device__ __forceinline__ DT from_accum(device_accum_t<DT> x) {
  if constexpr (std::is_same_v<DT, __half>)
    return __float2half_rn(x);
  else if constexpr (std::is_same_v<DT, __nv_bfloat16>)
    return __float2bfloat16_rn(x);
  else
    return x;
}

// The math of the accumulation types, one overload per precision, so a kernel
// templated on its accumulation type A calls the float or the double function.
__device__ __forceinline__ float exp_of(float x) { return expf(x); }
__device__ __forceinline__ double exp_of(double x) { return exp(x); }
__device__ __forceinline__ float expm1_of(float x) { return expm1f(x); }
__device__ __forceinline__ double expm1_of(double x) { return expm1(x); }
__device__ __forceinline__ float log_of(float x) { return logf(x); }
__device__ __forceinline__ double log_of(double x) { return log(x); }
__device__ __forceinline__ float rsqrt_of(float x) { return rsqrtf(x); }
// In double, 1 / sqrt(x) (two correctly rounded steps, as the reference) rather than rsqrt's 1 ulp.
__device__ __forceinline__ double rsqrt_of(double x) { return 1.0 / sqrt(x); }
__device__ __forceinline__ float max_of(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double max_of(double a, double b) { return fmax(a, b); }
__device__ __forceinline__ float abs_of(float x) { return fabsf(x); }
__device__ __forceinline__ double abs_of(double x) { return fabs(x); }
// The most negative finite value: the start of a running maximum.
template <class A>
__device__ __forceinline__ constexpr A lowest_of() {
  if constexpr (std::is_same_v<A, double>)
    return -DBL_MAX;
  else
    return -FLT_MAX;
}

// Sum over the 32 lanes of a warp, every lane gets the total.
template <class A>
__device__ __forceinline__ A warp_sum(A x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Adds `value` (one per warp: lane 0's counts) into *total with one global
// atomic per block, so that a sum of many rows into one address is not
// serialised on it row by row. Every thread of the block calls it (it waits at
// the block's barriers); `counts` says whether this warp has a value.
template <class A>
__device__ void block_atomic_add(A* total, A value, bool counts) {
  __shared__ A block_total;
  if (threadIdx.x == 0) block_total = A(0);
  __syncthreads();
  if (counts && threadIdx.x % 32 == 0) atomicAdd(&block_total, value);
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(total, block_total);
}

inline unsigned blocks_for(long long n, unsigned threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace difftx::cuda_detail
