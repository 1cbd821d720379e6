// Storage types on the device: Eigen::half and Eigen::bfloat16 have the bit
// layout of CUDA's __half and __nv_bfloat16, so a module's tensors are handed
// to kernels as the CUDA types, which have the device intrinsics.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

// Sum over the 32 lanes of a warp, every lane gets the total.
__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

inline unsigned blocks_for(long long n, unsigned threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace difftx::cuda_detail
