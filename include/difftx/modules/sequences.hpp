// Packed variable-length batches: sequences of different lengths laid end to
// end in x [1, total, C], with cumulative offsets cu_seqlens [S + 1]
// (FlashAttention's varlen convention): sequence s holds rows
// [cu_seqlens[s], cu_seqlens[s + 1]). Its tokens sit at positions 0, 1, ...
// from its first row, and attend only within it; no padding is computed.
// An empty span means a dense batch x [B, N, C] of B sequences of N tokens.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "difftx/core/checks.hpp"
#include "difftx/ops/common.hpp"

namespace difftx {

namespace detail {

// A token module's call x [B, N, C] -> y like x: x is C wide in `space`, y has
// x's shape, and a packed batch's offsets fit x.
template <class X, class Y>
void check_token_call(std::string_view where, const X& x, const Y& y, sequence_offsets sequences, index_t width,
                      memory_space space) {
  require_tokens(where, "x", x, width, space);
  require_shape(where, "y", y, x.shape());
  if (!sequences.empty()) check_sequence_offsets(where, "x", x, sequences);
}
// A token module's backward: x as its forward saw it (saved_for), dy and dx of x's shape.
template <class X, class DY, class DX>
void check_token_backward(std::string_view where, const X& x, const DY& dy, const DX& dx, const shape_t<3>& saved_for,
                          index_t width, memory_space space, std::string_view dy_name = "dy") {
  require_tokens(where, "x", x, width, space);
  require_saved(where, saved_for, x.shape());
  require_shape(where, dy_name, dy, x.shape());
  require_shape(where, "dx", dx, x.shape());
}

// The sequences of a batch: their count, and views of one sequence's rows.
// Dense: one call over the whole batch; packed: a call per sequence on
// [1, length, ...] views (rows of the token axis, axis 1) and, for the
// log-sum-exp [1, H, Maps, total], the same memory read as per-sequence blocks
// [1, H, Maps, length] (the layout a packed forward writes and its backward reads).
struct whole_batch {
  template <class V>
  V rows(V x) const { return x; }
  template <class V>
  V lse(V x) const { return x; }
};
struct packed_sequence {
  index_t begin, end;
  template <class V>
  V rows(V x) const {
    auto shape = x.shape();
    const index_t row = element_count(shape) / (shape[0] * shape[1]);
    shape[1] = end - begin;
    return {x.data() + begin * row, shape, x.space()};
  }
  template <class V>
  V lse(V x) const {
    return {x.data() + x.extent(1) * x.extent(2) * begin, {1, x.extent(1), x.extent(2), end - begin}, x.space()};
  }
};

// f(whole_batch{}) for a dense batch, else f(packed_sequence{...}) for each sequence.
template <class F>
void for_each_sequence(sequence_offsets offsets, F&& f) {
  if (offsets.empty()) {
    f(whole_batch{});
    return;
  }
  for (std::size_t s = 0; s + 1 < offsets.size(); ++s) f(packed_sequence{offsets[s], offsets[s + 1]});
}

// q or k [B, N, heads, Maps, d] seen as [B, N, heads·Maps, d]: RoPE rotates every vector of size d.
template <class T>
TensorView<T, 4> rope_vectors(Tensor<T, 5>& t) {
  return t.view().template reshape<4>({t.extent(0), t.extent(1), t.extent(2) * t.extent(3), t.extent(4)});
}

// RoPE of the new tokens of a decode step, x [B, T, V, d]: sequence b's tokens
// start at position starts[b] (its cache length before them).
template <class Policy, class T>
void rope_from_positions(const Policy& policy, TensorView<T, 4> x, std::span<const index_t> starts, double theta,
                         const rope_scaling& scaling) {
  for (index_t b = 0; b < x.extent(0); ++b)
    rope_forward(policy, x[b].template reshape<4>({1, x.extent(1), x.extent(2), x.extent(3)}),
                 starts[static_cast<std::size_t>(b)], theta, scaling);
}

}  // namespace detail
}  // namespace difftx
