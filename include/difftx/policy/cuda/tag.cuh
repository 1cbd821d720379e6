// The CUDA policy's tag; see difftx/policy/cuda.hpp.
#pragma once

#include <memory>
#include <type_traits>

#include <Eigen/Core>

#include "difftx/policy/cuda/attention_path.hpp"
#include "difftx/policy/cuda/context.cuh"

namespace difftx::policy {

struct cuda {
  static constexpr const char* name = "cuda";
  // float32 computes in float32 (no TF32); float16 and bfloat16 are stored as
  // they are and computed with float accumulation; float64 computes in double
  // throughout (CUDA-core kernels and cuBLASLt's CUBLAS_COMPUTE_64F, no float
  // rounding anywhere), for float64 gradient checks on the device.
  template <class T>
  static constexpr bool supports = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                   std::is_same_v<T, Eigen::half> || std::is_same_v<T, Eigen::bfloat16>;

  std::shared_ptr<cuda_context> context = cuda_context::for_current_device();
  // Whose kernels run attention (attention_path.hpp): cuDNN's fused attention
  // where it applies, in a build with cuDNN (difftx's own elsewhere), or
  // difftx's own everywhere.
  cuda_attention attention = default_cuda_attention;
  // A packed batch's attention in one cuDNN call per map (its ragged layout)
  // instead of a call per sequence, each its own shape and graph. Off: on an
  // H100 its backward failed cuda_test's "packed batches on cuDNN's ragged
  // layout" for values 256 wide (docs/design.md, cuDNN attention).
  bool cudnn_ragged = false;

  memory_resource& memory() const noexcept { return *context->memory; }
  cudaStream_t stream() const noexcept { return context->stream; }
};

}  // namespace difftx::policy
