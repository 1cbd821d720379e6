// attention_maps: the attention weights of chosen query rows, read back from a
// forward's saved state, for inspection (which tokens a position attends to,
// the size of the attention logits). Nothing N x N is saved by the forward, so
// the rows asked for are recomputed from the saved (rotated) q, k and the
// per-row log-sum-exp, with the formulas of ops/attention.hpp:
//   S_m[i, t] = Q_m[i] · K_m[t] / sqrt(d)     the pre-softmax attention logits
//                                             (quantized as the module's config.logit_bits says)
//   A_m[i, t] = exp(S_m[i, t] - lse_m[i])     t <= i when causal, else every t
//   weights   = A_1                    (Attention: one map)
//             = A_1 - lambda A_2       (MultiHead: the weights O = weights · V uses)
//             = A_2i - lambda A_2i+1   (MultiHeadV2: lambda per query row and output head)
// Host memory only. Cost: one score row per (query row, head, map).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "difftx/modules/attention.hpp"
#include "difftx/modules/multihead.hpp"
#include "difftx/modules/multihead_v2.hpp"
#include "difftx/ops/logit_quantization.hpp"

namespace difftx {

// Maps of R query rows of one batch element, over all N key positions. Entries
// at masked keys (t > row when causal) are 0 in every tensor.
template <class A>
struct AttentionMaps {
  index_t maps = 1;       // 1: standard softmax, 2: differential
  bool causal = true;
  double lambda = 0;      // maps = 2: the layer's lambda (V2: the mean of `lambdas`)
  std::vector<index_t> rows;
  Tensor<A, 4> scores;   // [R, H, Maps, N] S_m, the attention logits
  Tensor<A, 4> probs;    // [R, H, Maps, N] A_m, each row sums to 1
  Tensor<A, 3> weights;  // [R, H, N] A_1 or A_1 - lambda A_2 (rows sum to 1 or 1 - lambda)
  Tensor<A, 2> lambdas;  // [R, H] the lambda of each row's weights: all `lambda`, V2's per token and head; 0 (maps = 1)

  // Keys a row sees: t < key_end(row).
  index_t key_end(index_t row) const noexcept { return causal ? row + 1 : scores.extent(3); }
};

namespace detail {
inline void require_dense_forward(const std::vector<index_t>& sequences) {
  require(sequences.empty(), "attention_maps", "saved", "the state of a forward on a dense batch [B, N, C]",
          "the state of a packed batch of " + std::to_string(sequences.size() - 1) + " sequences");
}
// saved_for: the input shape the saved state records ({} before any forward).
// q [B, N, H, Maps, d] and lse [B, H, Maps, N]: map m of head h. k [B, N, G,
// Maps, d] (V1, the baseline: map m reads the group's key half m), or k [B, N,
// G, 1, d] with Maps = 2 (V2: map m is query head 2h + m of the 2H, reading its
// own group). lambda_of(row, head) is the coefficient of map 2.
template <Scalar T, class LambdaOf>
AttentionMaps<accum_t<T>> attention_maps_from(const shape_t<3>& saved_for, cview<T, 5> q, cview<T, 5> k,
                                              cview<accum_t<T>, 4> lse, LambdaOf&& lambda_of, bool causal,
                                              int logit_bits, index_t batch, std::span<const index_t> rows) {
  using A = accum_t<T>;
  constexpr std::string_view where = "attention_maps";
  require(saved_for != shape_t<3>{}, where, "saved", "the state of a forward", "a state no forward has filled");
  detail::require_all_in(where, memory_space::host,
                         {{"saved.q", q.space()}, {"saved.k", k.space()}, {"saved.lse", lse.space()}});
  const index_t B = q.extent(0), N = q.extent(1), H = q.extent(2), Maps = q.extent(3), d = q.extent(4);
  const index_t G = k.extent(2);
  const bool key_per_map = k.extent(3) == Maps;
  // (group, key half) that map m of head h reads
  auto key_of = [&](index_t h, index_t m) -> std::pair<index_t, index_t> {
    if (key_per_map) return {h / (H / G), m};
    return {(h * Maps + m) / (H * Maps / G), 0};
  };
  require(batch >= 0 && batch < B, where, "batch", "an index in [0, " + std::to_string(B) + ")", std::to_string(batch));
  for (index_t r : rows)
    require(r >= 0 && r < N, where, "rows", "query positions in [0, " + std::to_string(N) + ")", std::to_string(r));
  const index_t R = static_cast<index_t>(rows.size());
  AttentionMaps<A> out{Maps,
                       causal,
                       0.0,
                       std::vector<index_t>(rows.begin(), rows.end()),
                       Tensor<A, 4>({R, H, Maps, N}),
                       Tensor<A, 4>({R, H, Maps, N}),
                       Tensor<A, 3>({R, H, N}),
                       Tensor<A, 2>({R, H})};
  const A scale = A(1.0) / scalar_traits<T>::sqrt(A(static_cast<double>(d)));
  double lambda_sum = 0;
  for (index_t r = 0; r < R; ++r) {
    const index_t i = out.rows[static_cast<std::size_t>(r)];
    for (index_t h = 0; h < H; ++h) {
      if (Maps == 2) out.lambdas(r, h) = lambda_of(i, h);
      lambda_sum += static_cast<double>(out.lambdas(r, h));
      for (index_t m = 0; m < Maps; ++m) {
        const auto [j, km] = key_of(h, m);
        const A coeff = m == 0 ? A(1.0) : -out.lambdas(r, h);
        for (index_t t = 0; t < out.key_end(i); ++t) {
          A s(0.0);
          for (index_t c = 0; c < d; ++c) s = s + load(q(batch, i, h, m, c)) * load(k(batch, t, j, km, c));
          out.scores(r, h, m, t) = s * scale;
        }
        quantize_logits(&out.scores(r, h, m, 0), out.key_end(i), logit_bits);
        for (index_t t = 0; t < out.key_end(i); ++t) {
          const A p = scalar_traits<T>::exp(out.scores(r, h, m, t) - lse(batch, h, m, i));
          out.probs(r, h, m, t) = p;
          out.weights(r, h, t) = out.weights(r, h, t) + coeff * p;
        }
      }
    }
  }
  if (R * H > 0) out.lambda = lambda_sum / static_cast<double>(R * H);
  return out;
}
}  // namespace detail

// MultiHead: maps = 2, weights = A_1 - lambda A_2 per head.
template <Scalar T, index_t D, class Policy>
AttentionMaps<accum_t<T>> attention_maps(const MultiHead<T, D, Policy>& attention,
                                         const typename MultiHead<T, D, Policy>::saved_type& saved, index_t batch,
                                         std::span<const index_t> rows) {
  detail::require_dense_forward(saved.attn.sequences);
  detail::require_all_in("attention_maps", memory_space::host, {{"saved.lambda", saved.attn.lambda.space()}});
  // Read only once the saved state is known to be a forward's.
  const auto lambda = [&](index_t, index_t) { return static_cast<accum_t<T>>(saved.attn.lambda(0)); };
  return detail::attention_maps_from<T>(saved.input_shape, saved.q.view(), saved.k.view(), saved.attn.lse.view(),
                                        lambda, attention.config().causal, attention.config().logit_bits, batch, rows);
}

// Attention (the baseline): maps = 1, weights = A per head.
template <Scalar T, index_t D, class Policy>
AttentionMaps<accum_t<T>> attention_maps(const Attention<T, D, Policy>& attention,
                                         const typename Attention<T, D, Policy>::saved_type& saved, index_t batch,
                                         std::span<const index_t> rows) {
  detail::require_dense_forward(saved.sequences);
  return detail::attention_maps_from<T>(saved.input_shape, saved.q.view(), saved.k.view(), saved.lse.view(),
                                        [](index_t, index_t) { return accum_t<T>(0.0); }, attention.config().causal,
                                        attention.config().logit_bits, batch, rows);
}

// MultiHeadV2: maps = 2 per output head i (query heads 2i and 2i+1), weights =
// A_2i - lambda A_2i+1 with each row's own lambda = sigmoid(x W_lambda^T); the
// switched-off baseline: maps = 1.
template <Scalar T, index_t D, class Policy>
AttentionMaps<accum_t<T>> attention_maps(const MultiHeadV2<T, D, Policy>& attention,
                                         const typename MultiHeadV2<T, D, Policy>::saved_type& saved, index_t batch,
                                         std::span<const index_t> rows) {
  detail::require_dense_forward(saved.sequences);
  const index_t maps = attention.config().differential ? 2 : 1;
  const bool causal = attention.config().causal;
  const auto& q = saved.q;  // [B, N, maps·h, 1, D], seen as [B, N, h, maps, D]
  const auto& lse = saved.lse;
  const auto logits = saved.lambda_logits.const_view();
  detail::require_all_in("attention_maps", memory_space::host, {{"saved.lambda_logits", logits.space()}});
  return detail::attention_maps_from<T>(
      saved.input_shape, q.const_view().template reshape<5>({q.extent(0), q.extent(1), q.extent(2) / maps, maps, q.extent(4)}),
      saved.k.const_view(), lse.const_view().template reshape<4>({lse.extent(0), lse.extent(1) / maps, maps, lse.extent(3)}),
      [&](index_t row, index_t head) { return detail::sigmoid<T>(load(logits(batch, row, head))); },
      causal, attention.config().logit_bits, batch, rows);
}

}  // namespace difftx
