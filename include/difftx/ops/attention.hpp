// Softmax attention with Maps softmax maps per head and grouped key/value heads:
// Maps = 1 is standard attention, Maps = 2 is differential attention. One op
// serves both, so the baseline and the differential layer share every kernel.
//
//   q [B, N, H, Maps, d], k [B, M, G, Maps, d], v [B, M, G, dv]; head h reads
//   group j = h / (H / G). N queries, M keys (M = N in every module; M != N
//   for a caller's own layout, e.g. the PyTorch extension's).
//   S_m = Q_m K_m^T / sqrt(d), keys after the query masked when causal: the
//   queries are the last N of the M positions (FlashAttention's bottom-right
//   alignment), so query i sees the keys t <= i + M - N; causal needs M >= N.
//   A_m = softmax(S_m) row-wise, O_m = A_m V.
//   forward : o [B, N, H, dv] = O_1                     (Maps = 1)
//                             = O_1 - lambda_h O_2      (Maps = 2, lambda [1]: one
//                               for every head, or [H]: head h's own)
//             saved: lse [B, H, Maps, N] (log-sum-exp of each row of S_m) and,
//             for Maps = 2, o2 [B, N, H, dv] = O_2, so the backward gets
//             rowsum(dO ⊙ O_1) and rowsum(dO ⊙ O_2) without N x M memory.
//   backward: with c_1 = 1, c_2 = -lambda_h and D_m = rowsum(dO ⊙ O_m):
//             dV   = sum_m c_m A_m^T dO
//             dS_m = c_m A_m ⊙ (dO V^T - D_m)
//             dQ_m = dS_m K_m / sqrt(d),  dK_m = dS_m^T Q_m / sqrt(d)
//             dlambda_h = -sum over head h's rows (dO ⊙ O_2); dlambda has
//             lambda's shape ([1]: the sum over every head)
//             dq, dk, dv and dlambda are assigned (grouped heads sum into dk, dv).
//   inference options of the forward (CPU policies; docs/semantics.md):
//     logit_bits  S_m quantized per row (ops/logit_quantization.hpp)
//     qk = int8   every query Q_m[i] / sqrt(d) and key K_m[t] stored as int8
//                 (ops/int8.hpp: steps s_q[i], s_k[t]) and
//                 S_m[i, t] = A(Σ_c q8[c] · k8[c]) · s_q[i] · s_k[t]
//                 (the integer sum exact; the two products left to right).
#pragma once

#include <vector>

#include "difftx/ops/common.hpp"
#include "difftx/ops/int8.hpp"

namespace difftx::detail {

// Shapes, and that every tensor the op reads or writes lies in `space` (lambda
// and o2 only for Maps = 2: standard attention takes empty views there).
template <int Maps, class Q, class K, class V, class L, class O, class O2, class S>
void check_attention(std::string_view where, memory_space space, const Q& q, const K& k, const V& v, const L& lambda,
                     bool causal, const O& o, const O2& o2, const S& lse, const char* o_name) {
  static_assert(Maps == 1 || Maps == 2, "difftx: attention has one (standard) or two (differential) maps");
  require_nonempty(where, "q", q);
  const index_t B = q.extent(0), N = q.extent(1), H = q.extent(2), d = q.extent(4);
  require(q.extent(3) == Maps, where, "q", "shape [B, N, H, " + std::to_string(Maps) + ", d]",
          shape_string(q.shape()));
  require_nonempty(where, "k", k);
  const index_t M = k.extent(1), G = k.extent(2);
  require_shape(where, "k", k, {B, M, G, Maps, d});
  require(!causal || M >= N, where, "k",
          [&] { return "at least N = " + std::to_string(N) + " keys for causal attention (the queries are the last N positions)"; },
          [&] { return "M = " + std::to_string(M); });
  require(H % G == 0, where, "k", "a group count G dividing the head count H = " + std::to_string(H),
          "G = " + std::to_string(G));
  require_nonempty(where, "v", v);
  require(v.extent(0) == B && v.extent(1) == M && v.extent(2) == G, where, "v",
          "shape [" + std::to_string(B) + ", " + std::to_string(M) + ", " + std::to_string(G) + ", dv]",
          shape_string(v.shape()));
  const index_t dv = v.extent(3);
  require_shape(where, o_name, o, {B, N, H, dv});
  if constexpr (Maps == 2) {
    require_shape(where, "o2", o2, {B, N, H, dv});
    require(lambda.shape() == shape_t<1>{1} || lambda.shape() == shape_t<1>{H}, where, "lambda",
            [&] { return "shape [1] or [H] = [" + std::to_string(H) + "]"; }, [&] { return shape_string(lambda.shape()); });
  } else {
    require(o2.empty(), where, "o2", "an empty tensor for standard attention", shape_string(o2.shape()));
  }
  require_shape(where, "lse", lse, {B, H, Maps, N});
  require_all_in(where, space, {{"q", q.space()}, {"k", k.space()}, {"v", v.space()}, {o_name, o.space()}, {"lse", lse.space()}});
  if constexpr (Maps == 2) require_all_in(where, space, {{"lambda", lambda.space()}, {"o2", o2.space()}});
}

template <int Maps, class Q, class K, class V, class L, class O, class O2, class S, class DO, class DQ, class DK,
          class DV, class DL>
void check_attention_backward(std::string_view where, memory_space space, const Q& q, const K& k, const V& v,
                              const L& lambda, bool causal, const O& o, const O2& o2, const S& lse, const DO& d_o,
                              const DQ& dq, const DK& dk, const DV& dv, const DL& dlambda) {
  check_attention<Maps>(where, space, q, k, v, lambda, causal, o, o2, lse, "o");
  require_shape(where, "do", d_o, o.shape());
  require_shape(where, "dq", dq, q.shape());
  require_shape(where, "dk", dk, k.shape());
  require_shape(where, "dv", dv, v.shape());
  require_all_in(where, space, {{"do", d_o.space()}, {"dq", dq.space()}, {"dk", dk.space()}, {"dv", dv.space()}});
  if constexpr (Maps == 2) {
    require_shape(where, "dlambda", dlambda, lambda.shape());
    require_all_in(where, space, {{"dlambda", dlambda.space()}});
  }
}

// lambda [1] or [H] of a host call (empty for Maps = 1, then 0), read per head.
template <class A>
class head_lambdas {
 public:
  explicit head_lambdas(TensorView<const A, 1> lambda) : values_(lambda.data()), per_head_(lambda.extent(0) > 1) {}
  A operator()(index_t h) const { return values_ ? values_[per_head_ ? h : 0] : A(0); }

 private:
  const A* values_;
  bool per_head_;
};

// dlambda from each head's sum of -rowsum(dO ⊙ O_2): [1] gets their total, [H] each its own.
template <class A>
void store_head_sums(const std::vector<A>& per_head, TensorView<A, 1> dlambda) {
  if (dlambda.extent(0) == 1) {
    A total(0.0);
    for (const A& x : per_head) total = total + x;
    dlambda(0) = total;
    return;
  }
  for (std::size_t h = 0; h < per_head.size(); ++h) dlambda(static_cast<index_t>(h)) = per_head[h];
}

// int8 Q·Kᵀ needs a floating accumulation type to round in, and d <= 1040:
// kernels without integer dot products sum the int8 values as floats, exact
// while 127² · d < 2^24.
template <class A>
void check_qk_dtype(std::string_view where, inference_dtype qk, index_t d) {
  if (qk != inference_dtype::int8) return;
  require_int8_arithmetic<A>(where, "qk");
  require(d <= 1040, where, "q", "a head size d <= 1040 for int8 Q·Kᵀ (exact float sums)", std::to_string(d));
}

}  // namespace difftx::detail

namespace difftx {

// A packed batch (q [1, total, H, Maps, d], sequences = its cu_seqlens) in one
// call, where a policy has such a path (policy::cuda: cuDNN's ragged layout,
// where asked for). false: nothing was written, and the caller runs the op on
// each sequence's rows. Same layouts, results and saved state as those
// per-sequence calls (lse in per-sequence blocks, modules/sequences.hpp).
template <int Maps, class Policy, class T>
bool attention_forward_packed(const Policy&, cview<T, 5>, cview<T, 5>, cview<T, 4>, cview<accum_t<T>, 1>, bool,
                              TensorView<T, 4>, TensorView<T, 4>, TensorView<accum_t<T>, 4>, sequence_offsets) {
  return false;
}
template <int Maps, class Policy, class T>
bool attention_backward_packed(const Policy&, cview<T, 5>, cview<T, 5>, cview<T, 4>, cview<accum_t<T>, 1>, bool,
                               cview<T, 4>, cview<T, 4>, cview<accum_t<T>, 4>, cview<T, 4>, TensorView<T, 5>,
                               TensorView<T, 5>, TensorView<T, 4>, TensorView<accum_t<T>, 1>, sequence_offsets) {
  return false;
}

}  // namespace difftx
