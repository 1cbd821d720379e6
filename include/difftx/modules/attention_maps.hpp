// attention_maps: the attention weights of chosen query rows, read back from a
// forward's saved state, for inspection (which tokens a position attends to,
// the size of the attention logits). Nothing N x N is saved by the forward, so
// the rows asked for are recomputed from the saved (rotated) q, k and the
// per-row log-sum-exp, with the formulas of ops/attention.hpp:
//   S_m[i, t] = Q_m[i] · K_m[t] / sqrt(d)     the pre-softmax attention logits
//   A_m[i, t] = exp(S_m[i, t] - lse_m[i])     t <= i when causal, else every t
//   weights   = A_1                    (Attention: one map)
//             = A_1 - lambda A_2       (MultiHead: the weights O = weights · V uses)
// Host memory only. Cost: one score row per (query row, head, map).
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "difftx/modules/attention.hpp"
#include "difftx/modules/multihead.hpp"

namespace difftx {

// Maps of R query rows of one batch element, over all N key positions. Entries
// at masked keys (t > row when causal) are 0 in every tensor.
template <class A>
struct AttentionMaps {
  index_t maps = 1;       // 1: standard softmax, 2: differential
  bool causal = true;
  double lambda = 0;      // the layer's lambda (maps = 2)
  std::vector<index_t> rows;
  Tensor<A, 4> scores;   // [R, H, Maps, N] S_m, the attention logits
  Tensor<A, 4> probs;    // [R, H, Maps, N] A_m, each row sums to 1
  Tensor<A, 3> weights;  // [R, H, N] A_1 or A_1 - lambda A_2 (rows sum to 1 or 1 - lambda)

  // Keys a row sees: t < key_end(row).
  index_t key_end(index_t row) const noexcept { return causal ? row + 1 : scores.extent(3); }
};

namespace detail {
inline void require_dense_forward(const std::vector<index_t>& sequences) {
  require(sequences.empty(), "attention_maps", "saved", "the state of a forward on a dense batch [B, N, C]",
          "the state of a packed batch of " + std::to_string(sequences.size() - 1) + " sequences");
}
// saved_for: the input shape the saved state records ({} before any forward).
template <Scalar T>
AttentionMaps<accum_t<T>> attention_maps_from(const shape_t<3>& saved_for, cview<T, 5> q, cview<T, 5> k,
                                              cview<accum_t<T>, 4> lse, cview<accum_t<T>, 1> lambda_view, bool causal,
                                              index_t batch, std::span<const index_t> rows) {
  using A = accum_t<T>;
  constexpr std::string_view where = "attention_maps";
  require(saved_for != shape_t<3>{}, where, "saved", "the state of a forward", "a state no forward has filled");
  detail::require_all_in(where, memory_space::host,
                         {{"saved.q", q.space()}, {"saved.k", k.space()}, {"saved.lse", lse.space()},
                          {"saved.lambda", lambda_view.space()}});
  const double lambda = lambda_view.empty() ? 0.0 : static_cast<double>(lambda_view(0));
  const index_t B = q.extent(0), N = q.extent(1), H = q.extent(2), Maps = q.extent(3), d = q.extent(4);
  const index_t group_size = H / k.extent(2);
  require(batch >= 0 && batch < B, where, "batch", "an index in [0, " + std::to_string(B) + ")", std::to_string(batch));
  for (index_t r : rows)
    require(r >= 0 && r < N, where, "rows", "query positions in [0, " + std::to_string(N) + ")", std::to_string(r));
  const index_t R = static_cast<index_t>(rows.size());
  AttentionMaps<A> out{Maps, causal, lambda, std::vector<index_t>(rows.begin(), rows.end()),
                       Tensor<A, 4>({R, H, Maps, N}), Tensor<A, 4>({R, H, Maps, N}), Tensor<A, 3>({R, H, N})};
  const A scale = A(1.0) / scalar_traits<T>::sqrt(A(static_cast<double>(d)));
  for (index_t r = 0; r < R; ++r) {
    const index_t i = out.rows[static_cast<std::size_t>(r)];
    for (index_t h = 0; h < H; ++h) {
      const index_t j = h / group_size;
      for (index_t m = 0; m < Maps; ++m) {
        const A coeff = m == 0 ? A(1.0) : A(-lambda);
        for (index_t t = 0; t < out.key_end(i); ++t) {
          A s(0.0);
          for (index_t c = 0; c < d; ++c) s = s + load(q(batch, i, h, m, c)) * load(k(batch, t, j, m, c));
          s = s * scale;
          const A p = scalar_traits<T>::exp(s - lse(batch, h, m, i));
          out.scores(r, h, m, t) = s;
          out.probs(r, h, m, t) = p;
          out.weights(r, h, t) = out.weights(r, h, t) + coeff * p;
        }
      }
    }
  }
  return out;
}
}  // namespace detail

// MultiHead: maps = 2, weights = A_1 - lambda A_2 per head.
template <Scalar T, index_t D, class Policy>
AttentionMaps<accum_t<T>> attention_maps(const MultiHead<T, D, Policy>& module,
                                         const typename MultiHead<T, D, Policy>::saved_type& saved, index_t batch,
                                         std::span<const index_t> rows) {
  detail::require_dense_forward(saved.attn.sequences);
  return detail::attention_maps_from<T>(saved.input_shape, saved.q.view(), saved.k.view(), saved.attn.lse.view(),
                                        saved.attn.lambda.view(), module.config().causal, batch, rows);
}

// Attention (the baseline): maps = 1, weights = A per head.
template <Scalar T, index_t D, class Policy>
AttentionMaps<accum_t<T>> attention_maps(const Attention<T, D, Policy>& module,
                                         const typename Attention<T, D, Policy>::saved_type& saved, index_t batch,
                                         std::span<const index_t> rows) {
  detail::require_dense_forward(saved.sequences);
  return detail::attention_maps_from<T>(saved.input_shape, saved.q.view(), saved.k.view(), saved.lse.view(),
                                        cview<accum_t<T>, 1>{}, module.config().causal, batch, rows);
}

}  // namespace difftx
