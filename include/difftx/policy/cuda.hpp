// policy::cuda: modules end to end on an NVIDIA GPU. Tensors live in device
// memory (stream-ordered allocations); projections run through cuBLASLt;
// attention through a fused kernel with both maps per key tile (tensor cores,
// mma.sync, for float16/bfloat16 at head sizes 64 and 128; CUDA cores
// otherwise); norms, RoPE, SwiGLU and lambda through small kernels. Everything
// runs on the policy's stream with no host round trip inside a forward or
// backward. Computes float32, float16 and bfloat16 (float accumulation).
//
// Include it from a CUDA translation unit (.cu, nvcc with -std=c++20 and
// --extended-lambda; the difftx::cuda CMake target sets both).
#pragma once

#if !defined(__CUDACC__)
#error "difftx/policy/cuda.hpp holds CUDA kernels: include it from a .cu file compiled by nvcc (link difftx::cuda)"
#endif

#include "difftx/policy/cuda/tag.cuh"

#include "difftx/policy/cuda/attention.cuh"
#include "difftx/policy/cuda/diff_lambda.cuh"
#include "difftx/policy/cuda/elementwise.cuh"
#include "difftx/policy/cuda/linear.cuh"
#include "difftx/policy/cuda/rmsnorm.cuh"
#include "difftx/policy/cuda/rope.cuh"
