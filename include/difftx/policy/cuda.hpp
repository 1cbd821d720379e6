// policy::cuda: modules end to end on an NVIDIA GPU. Tensors live in device
// memory (stream-ordered allocations); projections run through cuBLASLt;
// attention through a fused kernel with both maps per key tile (tensor cores,
// mma.sync, for float16/bfloat16 at head sizes 64 and 128; CUDA cores
// otherwise); decoding over a key/value cache (attention_decode.cuh) through
// a split-K kernel that spreads each cache over many blocks and a kernel that
// combines the splits; norms, RoPE, SwiGLU and lambda through small kernels;
// the token embedding and the cross-entropy (so LanguageModel and
// CrossEntropyLoss run on the device, with token ids in device memory) through
// their own kernels.
// Computes float32 (float32 arithmetic, no TF32), float16 and bfloat16 (float
// accumulation) and float64 (double throughout: the CUDA-core attention,
// cuBLASLt in CUBLAS_COMPUTE_64F, every small kernel in double).
//
// Everything runs on the policy's stream with no host round trip inside a
// forward or backward, except where token ids are read: the embedding and the
// cross-entropy check their ids on the device (the reference's input_error for
// an id out of range, before anything is written) and bring the verdict back
// with one small download per call; CrossEntropyLoss::forward also downloads
// the loss it returns.
//
// Include it from a CUDA translation unit (.cu, nvcc with -std=c++20 and
// --extended-lambda; the difftx::cuda CMake target sets both).
#pragma once

#if !defined(__CUDACC__)
#error "difftx/policy/cuda.hpp holds CUDA kernels: include it from a .cu file compiled by nvcc (link difftx::cuda)"
#endif

#include "difftx/policy/cuda/tag.cuh"

#include "difftx/policy/cuda/attention.cuh"
#include "difftx/policy/cuda/attention_decode.cuh"
#include "difftx/policy/cuda/cross_entropy.cuh"
#include "difftx/policy/cuda/diff_heads.cuh"
#include "difftx/policy/cuda/diff_lambda.cuh"
#include "difftx/policy/cuda/elementwise.cuh"
#include "difftx/policy/cuda/embedding.cuh"
#include "difftx/policy/cuda/linear.cuh"
#include "difftx/policy/cuda/rmsnorm.cuh"
#include "difftx/policy/cuda/rope.cuh"
