// Reference attention with one or two softmax maps (formulas in
// difftx/ops/attention.hpp). One query row at a time: scores, softmax and the
// weighted sum of V, exactly as written; nothing N x N is kept between rows.
#pragma once

#include <algorithm>
#include <vector>

#include "difftx/ops/attention.hpp"
#include "difftx/ops/int8.hpp"
#include "difftx/ops/logit_quantization.hpp"
#include "difftx/policy/reference/tag.hpp"

namespace difftx {

namespace detail {
// Probabilities of row i of map m, p[t] = exp(s_t - lse), for keys t < kv_end.
template <Scalar T>
void attention_row_probabilities(cview<T, 5> q, cview<T, 5> k, index_t b, index_t i, index_t h, index_t j, index_t m,
                                 index_t kv_end, const accum_t<T>& scale, const accum_t<T>& lse,
                                 std::vector<accum_t<T>>& p) {
  using A = accum_t<T>;
  const index_t d = q.extent(4);
  for (index_t t = 0; t < kv_end; ++t) {
    A s(0.0);
    for (index_t c = 0; c < d; ++c) s = s + load(q(b, i, h, m, c)) * load(k(b, t, j, m, c));
    p[static_cast<std::size_t>(t)] = scalar_traits<T>::exp(s * scale - lse);
  }
}

// The scaled logits of row i of map m of head h (group j) over the keys
// t < kv_end of k[b]: s[t] = Q_m[i] · K_m[t] · scale.
template <Scalar T>
void attention_row_scores(cview<T, 5> q, cview<T, 5> k, index_t b, index_t i, index_t h, index_t j, index_t m,
                          index_t kv_end, const accum_t<T>& scale, std::vector<accum_t<T>>& s) {
  using A = accum_t<T>;
  const index_t d = q.extent(4);
  s.resize(static_cast<std::size_t>(kv_end));
  for (index_t t = 0; t < kv_end; ++t) {
    A dot(0.0);
    for (index_t c = 0; c < d; ++c) dot = dot + load(q(b, i, h, m, c)) * load(k(b, t, j, m, c));
    s[static_cast<std::size_t>(t)] = dot * scale;
  }
}

// From a row's scaled logits s[0, kv_end) over the values of v[b] (group j):
// o_row[0, dv) = softmax(s) V, the logits first quantized to logit_bits
// (ops/logit_quantization.hpp); returns the row's log-sum-exp.
template <Scalar T>
accum_t<T> attention_row_from_scores(cview<T, 4> v, index_t b, index_t j, index_t kv_end, int logit_bits,
                                     std::vector<accum_t<T>>& s, accum_t<T>* o_row) {
  using A = accum_t<T>;
  const index_t dv = v.extent(3);
  quantize_logits(s.data(), kv_end, logit_bits);
  A row_max = s[0];
  for (index_t t = 1; t < kv_end; ++t)
    if (row_max < s[static_cast<std::size_t>(t)]) row_max = s[static_cast<std::size_t>(t)];
  A sum(0.0);
  for (index_t t = 0; t < kv_end; ++t) sum = sum + scalar_traits<T>::exp(s[static_cast<std::size_t>(t)] - row_max);
  const A row_lse = row_max + scalar_traits<T>::log(sum);
  // O_m = A_m V for this row.
  for (index_t c = 0; c < dv; ++c) {
    A acc(0.0);
    for (index_t t = 0; t < kv_end; ++t)
      acc = acc + scalar_traits<T>::exp(s[static_cast<std::size_t>(t)] - row_lse) * load(v(b, t, j, c));
    o_row[c] = acc;
  }
  return row_lse;
}

// Both: row i of map m over the keys and values t < kv_end. s: scratch.
template <Scalar T>
accum_t<T> attention_row_output(cview<T, 5> q, cview<T, 5> k, cview<T, 4> v, index_t b, index_t i, index_t h,
                                index_t j, index_t m, index_t kv_end, const accum_t<T>& scale, int logit_bits,
                                std::vector<accum_t<T>>& s, accum_t<T>* o_row) {
  attention_row_scores<T>(q, k, b, i, h, j, m, kv_end, scale, s);
  return attention_row_from_scores<T>(v, b, j, kv_end, logit_bits, s, o_row);
}

// int8 Q·Kᵀ (ops/attention.hpp): every query vector (scaled by 1/sqrt(d)) and
// key vector of x [B, N, heads, Maps, d] as int8 rows, in that order.
template <Scalar T>
int8_rows<accum_t<T>> int8_vectors(cview<T, 5> x, const accum_t<T>& factor) {
  using A = accum_t<T>;
  const index_t d = x.extent(4), vectors = x.size() / d;
  int8_rows<A> out(vectors, d);
  std::vector<A> row(static_cast<std::size_t>(d));
  for (index_t r = 0; r < vectors; ++r) {
    for (index_t c = 0; c < d; ++c) row[static_cast<std::size_t>(c)] = load(x.data()[r * d + c]) * factor;
    out.set_row(r, row.data());
  }
  return out;
}

}  // namespace detail

// q [B,N,H,Maps,d], k [B,M,G,Maps,d], v [B,M,G,dv], lambda [1] or [H] (Maps = 2)
//   -> o [B,N,H,dv]; saved o2 [B,N,H,dv] (Maps = 2), lse [B,H,Maps,N]
// logit_bits: 16, or the logits quantized to 4..8 bits (ops/logit_quantization.hpp).
template <int Maps, Scalar T>
void attention_forward(const policy::reference&, cview<T, 5> q, cview<T, 5> k, cview<T, 4> v,
                       cview<accum_t<T>, 1> lambda, bool causal, TensorView<T, 4> o, TensorView<T, 4> o2,
                       TensorView<accum_t<T>, 4> lse, int logit_bits = logits_unquantized,
                       inference_dtype qk = inference_dtype::same) {
  constexpr std::string_view where = "attention_forward";
  detail::check_attention<Maps>(where, memory_space::host, q, k, v, lambda, causal, o, o2, lse, "o");
  detail::check_logit_bits<accum_t<T>>(where, logit_bits);
  detail::check_qk_dtype<accum_t<T>>(where, qk, q.extent(4));
  using A = accum_t<T>;
  const index_t B = q.extent(0), N = q.extent(1), M = k.extent(1), H = q.extent(2), d = q.extent(4);
  const detail::head_lambdas<A> lambdas(lambda);
  const index_t group_size = H / k.extent(2), dv = v.extent(3);
  const A scale = A(1.0) / scalar_traits<T>::sqrt(A(static_cast<double>(d)));
  std::vector<A> s;
  std::vector<A> o_maps(static_cast<std::size_t>(Maps * dv), A(0.0));
  const bool int8_qk = qk == inference_dtype::int8;
  int8_rows<A> q8, k8;  // int8 Q·Kᵀ: row ((b·N + i)·H + h)·Maps + m of q, likewise of k
  if constexpr (std::is_floating_point_v<A>)
    if (int8_qk) {
      q8 = detail::int8_vectors<T>(q, scale);
      k8 = detail::int8_vectors<T>(k, A(1.0));
    }
  const index_t G = k.extent(2);
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h) {
      const index_t j = h / group_size;
      for (index_t i = 0; i < N; ++i) {
        const index_t kv_end = causal ? i + 1 + M - N : M;
        for (index_t m = 0; m < Maps; ++m) {
          if (int8_qk) {  // s_t = A(Σ q8·k8) · step_q · step_k
            s.resize(static_cast<std::size_t>(kv_end));
            const index_t qr = ((b * N + i) * H + h) * Maps + m;
            for (index_t t = 0; t < kv_end; ++t) {
              const index_t kr = ((b * M + t) * G + j) * Maps + m;
              std::int32_t dot = 0;
              for (index_t c = 0; c < d; ++c) dot += std::int32_t{q8.row(qr)[c]} * std::int32_t{k8.row(kr)[c]};
              s[static_cast<std::size_t>(t)] = A(static_cast<double>(dot)) * q8.steps[static_cast<std::size_t>(qr)] *
                                               k8.steps[static_cast<std::size_t>(kr)];
            }
          } else {
            detail::attention_row_scores<T>(q, k, b, i, h, j, m, kv_end, scale, s);
          }
          lse(b, h, m, i) = detail::attention_row_from_scores<T>(v, b, j, kv_end, logit_bits, s, o_maps.data() + m * dv);
        }
        for (index_t c = 0; c < dv; ++c) {
          if constexpr (Maps == 2) {
            const A o_second = o_maps[static_cast<std::size_t>(dv + c)];
            o(b, i, h, c) = store<T>(o_maps[static_cast<std::size_t>(c)] - lambdas(h) * o_second);
            o2(b, i, h, c) = store<T>(o_second);
          } else {
            o(b, i, h, c) = store<T>(o_maps[static_cast<std::size_t>(c)]);
          }
        }
      }
    }
}

// do [B,N,H,dv] -> dq [B,N,H,Maps,d], dk [B,M,G,Maps,d], dv [B,M,G,dv], dlambda like lambda (all assigned)
template <int Maps, Scalar T>
void attention_backward(const policy::reference&, cview<T, 5> q, cview<T, 5> k, cview<T, 4> v,
                        cview<accum_t<T>, 1> lambda, bool causal, cview<T, 4> o, cview<T, 4> o2,
                        cview<accum_t<T>, 4> lse, cview<T, 4> d_o, TensorView<T, 5> dq, TensorView<T, 5> dk,
                        TensorView<T, 4> dv, TensorView<accum_t<T>, 1> dlambda) {
  constexpr std::string_view where = "attention_backward";
  detail::check_attention_backward<Maps>(where, memory_space::host, q, k, v, lambda, causal, o, o2, lse, d_o, dq, dk,
                                         dv, dlambda);
  using A = accum_t<T>;
  const index_t B = q.extent(0), N = q.extent(1), M = k.extent(1), H = q.extent(2), G = k.extent(2), d = q.extent(4);
  const index_t group_size = H / G, dv_size = v.extent(3);
  const A scale = A(1.0) / scalar_traits<T>::sqrt(A(static_cast<double>(d)));
  const detail::head_lambdas<A> lambdas(lambda);

  // dK and dV sum over the heads of a group and over queries: accumulate in A.
  std::vector<A> dk_acc(static_cast<std::size_t>(dk.size()), A(0.0));
  std::vector<A> dv_acc(static_cast<std::size_t>(dv.size()), A(0.0));
  auto dk_at = [&](index_t b, index_t t, index_t j, index_t m, index_t c) -> A& {
    return dk_acc[static_cast<std::size_t>((((b * M + t) * G + j) * Maps + m) * d + c)];
  };
  auto dv_at = [&](index_t b, index_t t, index_t j, index_t c) -> A& {
    return dv_acc[static_cast<std::size_t>(((b * M + t) * G + j) * dv_size + c)];
  };
  std::vector<std::vector<A>> p(Maps, std::vector<A>(static_cast<std::size_t>(M), A(0.0)));
  std::vector<A> dp(static_cast<std::size_t>(M), A(0.0));
  std::vector<A> dq_row(static_cast<std::size_t>(d), A(0.0));
  std::vector<A> dlambda_heads(static_cast<std::size_t>(H), A(0.0));

  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h) {
      const index_t j = h / group_size;
      // c_1 = 1, c_2 = -lambda_h: the weight of each map in O.
      A coeff[2] = {A(1.0), A(0.0)};
      if constexpr (Maps == 2) coeff[1] = -lambdas(h);
      A& dlambda_acc = dlambda_heads[static_cast<std::size_t>(h)];
      for (index_t i = 0; i < N; ++i) {
        const index_t kv_end = causal ? i + 1 + M - N : M;
        for (index_t m = 0; m < Maps; ++m)
          detail::attention_row_probabilities<T>(q, k, b, i, h, j, m, kv_end, scale, lse(b, h, m, i),
                                                 p[static_cast<std::size_t>(m)]);
        // dP = dO V^T for this row; D_m = rowsum(dO ⊙ O_m) with O_1 = o + lambda o2.
        for (index_t t = 0; t < kv_end; ++t) {
          A acc(0.0);
          for (index_t c = 0; c < dv_size; ++c) acc = acc + load(d_o(b, i, h, c)) * load(v(b, t, j, c));
          dp[static_cast<std::size_t>(t)] = acc;
        }
        A rowsum_do_o[2] = {A(0.0), A(0.0)};
        for (index_t c = 0; c < dv_size; ++c) {
          const A grad = load(d_o(b, i, h, c));
          if constexpr (Maps == 2) {
            const A o_second = load(o2(b, i, h, c));
            rowsum_do_o[0] = rowsum_do_o[0] + grad * (load(o(b, i, h, c)) + lambdas(h) * o_second);
            rowsum_do_o[1] = rowsum_do_o[1] + grad * o_second;
          } else {
            rowsum_do_o[0] = rowsum_do_o[0] + grad * load(o(b, i, h, c));
          }
        }
        if constexpr (Maps == 2) dlambda_acc = dlambda_acc - rowsum_do_o[1];

        for (index_t m = 0; m < Maps; ++m) {
          const auto& pm = p[static_cast<std::size_t>(m)];
          std::fill(dq_row.begin(), dq_row.end(), A(0.0));
          for (index_t t = 0; t < kv_end; ++t) {
            const auto ts = static_cast<std::size_t>(t);
            const A ds = coeff[m] * pm[ts] * (dp[ts] - rowsum_do_o[m]) * scale;
            for (index_t c = 0; c < d; ++c) {
              dq_row[static_cast<std::size_t>(c)] = dq_row[static_cast<std::size_t>(c)] + ds * load(k(b, t, j, m, c));
              dk_at(b, t, j, m, c) = dk_at(b, t, j, m, c) + ds * load(q(b, i, h, m, c));
            }
          }
          for (index_t c = 0; c < d; ++c) dq(b, i, h, m, c) = store<T>(dq_row[static_cast<std::size_t>(c)]);
        }
        // dV += (sum_m c_m A_m)^T dO
        for (index_t t = 0; t < kv_end; ++t) {
          A weight(0.0);
          for (index_t m = 0; m < Maps; ++m) weight = weight + coeff[m] * p[static_cast<std::size_t>(m)][static_cast<std::size_t>(t)];
          for (index_t c = 0; c < dv_size; ++c) dv_at(b, t, j, c) = dv_at(b, t, j, c) + weight * load(d_o(b, i, h, c));
        }
      }
    }
  for (index_t e = 0; e < dk.size(); ++e) dk.data()[e] = store<T>(dk_acc[static_cast<std::size_t>(e)]);
  for (index_t e = 0; e < dv.size(); ++e) dv.data()[e] = store<T>(dv_acc[static_cast<std::size_t>(e)]);
  if constexpr (Maps == 2) detail::store_head_sums(dlambda_heads, dlambda);
}

}  // namespace difftx
