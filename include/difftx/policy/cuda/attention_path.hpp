// Which kernels run an attention call on policy::cuda: difftx's own (tensor
// cores or CUDA cores, attention.cuh) or cuDNN's fused attention
// (attention_cudnn.cuh), and the policy's choice between them. Host code only,
// no CUDA header: the choice is plain logic, tested without a GPU.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "difftx/core/checks.hpp"

namespace difftx {

namespace policy {

// policy::cuda's `attention`: cuDNN's fused attention where it applies
// (float16/bfloat16, sm_80 and newer, shapes cuDNN accepts) and difftx's
// elsewhere (the default in a build with cuDNN), or difftx's own kernels
// everywhere (the default without it).
enum class cuda_attention : std::uint8_t { difftx, cudnn };

}  // namespace policy

// What ran one attention call (policy::cuda counts them; `difftx bench` prints
// them): a packed batch in one call per map on cuDNN's ragged layout counts as
// cudnn_ragged, each sequence's own call as any other.
enum class attention_path : std::uint8_t { cuda_cores, tensor_cores, cudnn, cudnn_ragged };
inline constexpr int attention_path_count = 4;

constexpr std::string_view path_name(attention_path path) {
  switch (path) {
    case attention_path::cuda_cores: return "difftx cuda cores";
    case attention_path::tensor_cores: return "difftx tensor cores";
    case attention_path::cudnn_ragged: return "cudnn ragged";
    case attention_path::cudnn: break;
  }
  return "cudnn";
}

// Whether this difftx was built with cuDNN's attention (CMake found cuDNN and
// its frontend and linked difftx::cudnn, which defines DIFFTX_CUDNN).
#if defined(DIFFTX_CUDNN)
inline constexpr bool built_with_cudnn = true;
#else
inline constexpr bool built_with_cudnn = false;
#endif

// policy::cuda's default: cuDNN's attention in a build with it, difftx's otherwise.
inline constexpr policy::cuda_attention default_cuda_attention =
    built_with_cudnn ? policy::cuda_attention::cudnn : policy::cuda_attention::difftx;

// The choice by name, as `difftx bench --cuda-attention` and the benchmarks spell it.
constexpr std::string_view name_of(policy::cuda_attention attention) {
  return attention == policy::cuda_attention::cudnn ? "cudnn" : "difftx";
}

namespace cuda_detail {

// difftx's own choice: tensor cores (mma.sync) for float16/bfloat16 at d = 64 or 128, CUDA cores otherwise.
constexpr attention_path own_attention_path(bool half_precision, std::int64_t d) {
  return half_precision && (d == 64 || d == 128) ? attention_path::tensor_cores : attention_path::cuda_cores;
}

// Asking for cuDNN in a build without it is a mistake the caller can fix, not
// something to paper over with another kernel: input_error, before anything runs.
inline void require_attention_available(std::string_view where, policy::cuda_attention requested, bool cudnn_built) {
  require(requested != policy::cuda_attention::cudnn || cudnn_built, where, "policy.attention",
          "cuda_attention::difftx: this difftx was built without cuDNN's attention (CMake found no cuDNN or no "
          "cudnn_frontend.h; set CUDNN_ROOT or CUDNN_FRONTEND_ROOT and reconfigure)",
          "cuda_attention::cudnn");
}

// Whether a call may go to cuDNN (which may still refuse its shape when it
// builds the graph): asked for, float16 or bfloat16, a GPU of compute
// capability 8.0 or newer, query/key and value widths multiples of 8 (16-byte
// rows), and every tensor's start 16-byte aligned (cuDNN's kernels load 16
// bytes at a time and do not check; a packed batch's per-sequence views may
// start anywhere).
inline bool cudnn_applies(policy::cuda_attention requested, bool half_precision, int compute_major, std::int64_t d,
                          std::int64_t dv, std::initializer_list<const void*> tensors) {
  if (requested != policy::cuda_attention::cudnn || !half_precision || compute_major < 8 || d % 8 != 0 || dv % 8 != 0)
    return false;
  for (const void* t : tensors)
    if (reinterpret_cast<std::uintptr_t>(t) % 16 != 0) return false;
  return true;
}

// The widest values cuDNN's ragged backward takes here: on an H100 with cuDNN
// 9.19 (2026-11-26) values 256 wide (d = 128, two maps) gave infinite input
// gradients there, where per-sequence calls of the same shape pass; a wider
// packed backward goes one sequence at a time.
inline constexpr std::int64_t ragged_backward_max_dv = 128;

}  // namespace cuda_detail

}  // namespace difftx
