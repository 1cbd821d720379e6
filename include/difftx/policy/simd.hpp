// policy::simd: the fast CPU policy. The projections' products on difftx's own
// blocked GEMM (policy/simd/gemm.hpp) and decoding GEMV, or on oneDNN's matmul
// where the build links it (linear_onednn.hpp, chosen per type by
// policy::simd::matmuls), int8 products on VNNI/AVX2 kernels; xsimd kernels for
// the norms, RoPE and SwiGLU; a fused flash-style kernel for both attention
// maps (policy/simd/attention.hpp), with score tiles on AMX or vdpbf16ps where
// asked and present; OpenMP threads over rows, heads and blocks. Computes in
// float and double; float16 and bfloat16 are stored as they are and computed
// in float, their products converting while they pack or on vdpbf16ps
// (bf16_product.hpp).
//
// Compile with the target's vector extensions (-march=native, or at least
// -mavx2 -mfma -mf16c): xsimd and Eigen pick their instruction set at compile
// time, and without flags they fall back to SSE2. Link OpenMP for threads
// (the difftx::difftx target does where CMake finds it).
#pragma once

#include "difftx/policy/simd/tag.hpp"

#include "difftx/policy/simd/attention.hpp"
#include "difftx/policy/simd/attention_decode.hpp"
#include "difftx/policy/simd/cross_entropy.hpp"
#include "difftx/policy/simd/decode_step.hpp"
#include "difftx/policy/simd/diff_heads.hpp"
#include "difftx/policy/simd/diff_lambda.hpp"
#include "difftx/policy/simd/elementwise.hpp"
#include "difftx/policy/simd/embedding.hpp"
#include "difftx/policy/simd/linear.hpp"
#include "difftx/policy/simd/linear_int8.hpp"
#include "difftx/policy/simd/linear_parts.hpp"
#include "difftx/policy/simd/rmsnorm.hpp"
#include "difftx/policy/simd/rope.hpp"
#include "difftx/policy/simd/swiglu.hpp"
