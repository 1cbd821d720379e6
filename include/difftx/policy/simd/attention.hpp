// Fused softmax attention with one or two maps on the CPU (formulas in
// difftx/ops/attention.hpp), in the manner of FlashAttention-2: memory linear
// in N, no N x N matrix ever stored. This file is policy::simd's entry; the
// kernels are, one variant a file:
//   attention_tiles.hpp            what forward and backward share: 64 x 64
//                                  tiles, packed keys, softmax rows, the
//                                  online softmax
//   attention_forward.hpp          the forward's loop, with float scores
//   attention_low_bit_forward.hpp  the same loop with int8 Q·Kᵀ and/or
//                                  quantized logits (low-bit inference)
//   attention_int8.hpp             int8 Q·Kᵀ's keys, queries and score tile
//                                  (VNNI, AMX-INT8)
//   attention_bf16.hpp             the forward's loop with bfloat16 score
//                                  tiles (vdpbf16ps, AMX-BF16)
//   attention_backward.hpp         the backward, phase by phase
//   attention_bf16_backward.hpp    its S and dP on bfloat16 pairs (vdpbf16ps,
//                                  AMX-BF16)
#pragma once

#include "difftx/ops/attention.hpp"
#include "difftx/ops/logit_quantization.hpp"
#include "difftx/policy/simd/attention_backward.hpp"
#include "difftx/policy/simd/attention_bf16.hpp"
#include "difftx/policy/simd/attention_forward.hpp"
#include "difftx/policy/simd/attention_int8.hpp"
#include "difftx/policy/simd/attention_low_bit_forward.hpp"
#include "difftx/policy/simd/common.hpp"

namespace difftx {

namespace simd_detail {

// The score tile kernels of a forward: int8's (nullptr: the float product on
// the int8 values) and bfloat16's (nullptr: the float product on float copies).
struct score_kernels {
  score_tile_fn int8 = nullptr;
  bf16_score_tile_fn bf16 = nullptr;
};
// The ones policy p runs on this CPU for accumulation type A.
template <class A>
score_kernels score_kernels_for(const policy::simd& p) noexcept {
  return {int8_score_tile<A>(p.amx_tiles),
          bf16_score_tile(p.amx_tiles, p.bf16_product_used() == policy::bf16_product::dot_instructions)};
}

// The forward of attention_forward below, past its checks: the float kernel
// (on bfloat16 score tiles where T is bfloat16 and kernels.bf16 is set), or
// the low-bit one where logits are quantized or qk = int8, with score tiles
// from kernels.int8. The tests pass models of the instructions.
template <int Maps, class T>
void fused_attention_forward(const policy::simd& p, cview<T, 5> q, cview<T, 5> k, cview<T, 4> v,
                             cview<accum_t<T>, 1> lambda, bool causal, TensorView<T, 4> o, TensorView<T, 4> o2,
                             TensorView<accum_t<T>, 4> lse, int logit_bits, inference_dtype qk,
                             score_kernels kernels) {
  const detail::head_lambdas<accum_t<T>> lambdas(lambda);
  if (logit_bits != logits_unquantized || qk == inference_dtype::int8) {
    low_bit_attention_forward<Maps, T>(p, q, k, v, lambdas, causal, o, o2, lse, logit_bits, qk, kernels.int8);
    return;
  }
  if constexpr (std::is_same_v<T, Eigen::bfloat16>)
    if (kernels.bf16) {
      bf16_tile_attention_forward<Maps>(p, q, k, v, lambdas, causal, o, o2, lse, kernels.bf16);
      return;
    }
  float_attention_forward<Maps, T>(p, q, k, v, lambdas, causal, o, o2, lse);
}

}  // namespace simd_detail

// policy::simd::score_tile_kernel (tag.hpp): the kernel the forward below
// chooses, by the names of int8_score_tile_name and bf16_score_tile_name; the
// bfloat16 backward's S and dP take the same bfloat16 tile.
template <class T>
const char* policy::simd::score_tile_kernel(int logit_bits, inference_dtype qk) const noexcept {
  const auto kernels = simd_detail::score_kernels_for<accum_t<T>>(*this);
  if (qk == inference_dtype::int8) return simd_detail::int8_score_tile_name(kernels.int8);
  if constexpr (std::is_same_v<T, Eigen::bfloat16>)
    if (logit_bits == logits_unquantized) return simd_detail::bf16_score_tile_name(kernels.bf16);
  return "float";
}

// q [B,N,H,Maps,d], k [B,M,G,Maps,d], v [B,M,G,dv], lambda [1] or [H] (Maps = 2)
//   -> o [B,N,H,dv]; saved o2 [B,N,H,dv] (Maps = 2), lse [B,H,Maps,N]
// logit_bits: 16, or the logits quantized to 4..8 bits (ops/logit_quantization.hpp):
// each item then sweeps its keys twice, first for every row's largest |logit|.
// qk = int8: Q·Kᵀ on int8 queries and keys (ops/attention.hpp, attention_int8.hpp).
template <int Maps, class T>
  requires supported_by<policy::simd, T>
void attention_forward(const policy::simd& p, cview<T, 5> q, cview<T, 5> k, cview<T, 4> v,
                       cview<accum_t<T>, 1> lambda, bool causal, TensorView<T, 4> o, TensorView<T, 4> o2,
                       TensorView<accum_t<T>, 4> lse, int logit_bits = logits_unquantized,
                       inference_dtype qk = inference_dtype::same) {
  using A = accum_t<T>;
  constexpr std::string_view where = "attention_forward";
  detail::check_attention<Maps>(where, memory_space::host, q, k, v, lambda, causal, o, o2, lse, "o");
  detail::check_logit_bits<A>(where, logit_bits);
  detail::check_qk_dtype<A>(where, qk, q.extent(4));
  simd_detail::fused_attention_forward<Maps, T>(p, q, k, v, lambda, causal, o, o2, lse, logit_bits, qk,
                                                simd_detail::score_kernels_for<A>(p));
}

// do [B,N,H,dv] -> dq [B,N,H,Maps,d], dk [B,M,G,Maps,d], dv [B,M,G,dv], dlambda like lambda (all assigned)
template <int Maps, class T>
  requires supported_by<policy::simd, T>
void attention_backward(const policy::simd& p, cview<T, 5> q, cview<T, 5> k, cview<T, 4> v,
                        cview<accum_t<T>, 1> lambda, bool causal, cview<T, 4> o, cview<T, 4> o2,
                        cview<accum_t<T>, 4> lse, cview<T, 4> d_o, TensorView<T, 5> dq, TensorView<T, 5> dk,
                        TensorView<T, 4> dv, TensorView<accum_t<T>, 1> dlambda) {
  using A = accum_t<T>;
  constexpr std::string_view where = "attention_backward";
  detail::check_attention_backward<Maps>(where, memory_space::host, q, k, v, lambda, causal, o, o2, lse, d_o, dq, dk,
                                         dv, dlambda);
  simd_detail::fused_attention_backward<Maps, T>(p, q, k, v, lambda, causal, o, o2, lse, d_o, dq, dk, dv, dlambda,
                                                 simd_detail::score_kernels_for<A>(p).bf16);
}

}  // namespace difftx
