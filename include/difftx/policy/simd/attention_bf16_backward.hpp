// bfloat16 attention's backward on the CPU's bfloat16 products, beside the
// forward's score tiles (attention_bf16.hpp): of the backward's five tile
// products (attention_backward.hpp), the two whose operands are all inputs,
// S_m = Q_m·K_mᵀ/sqrt(d) recomputed and dP = dO·Vᵀ, run on a
// bf16_score_tile_fn (vdpbf16ps or AMX) on the inputs' own bfloat16 values.
// A product of two bfloat16 values is exact in float, so they differ from the
// float products only in the order of their float sums. dV, dQ and dK stay
// float products: their left operands P and dS are float (P rounded to
// bfloat16 failed accuracy_test in the forward's P·V; dS is a difference).
//
// One (batch row, group) pair's operands, in pairs of depth (zero past the
// width; d2 = ceil(d/2), dv2 = ceil(dv/2)), packed once a query block
// (n_pad: N rounded up to blocks) and once a key block:
//   q2  [r][Maps][n_pad][2·d2]        the queries unscaled, from the input
//   do2 [r][n_pad][2·dv2]             the output gradients, from the input
//   k2  [key blocks][Maps][d2][Bs][2] from the packed float tiles kt
//   v2  [key blocks][dv2][Bs][2]      from the packed float tiles vt
// The same kernel serves both products: dP is a "score tile" of dO against V
// with scale 1 and dv2 pairs.
#pragma once

#include <algorithm>

#include "difftx/policy/simd/attention_bf16.hpp"
#include "difftx/policy/simd/attention_tiles.hpp"

namespace difftx::simd_detail {

// One pair's bfloat16 operands of S_m and dP, and those two products on them.
struct bf16_backward_pairs {
  static constexpr index_t Bs = attention_block;
  index_t maps = 1, heads = 1, d = 0, dv = 0, d2 = 0, dv2 = 0, n_pad = 0;
  aligned_vector<Eigen::bfloat16> q2, do2, k2, v2;

  // Sized for one pair of N queries, M keys and r heads (the pack functions write every element).
  void reset(index_t N, index_t M, index_t Maps, index_t r, index_t depth, index_t value_width) {
    maps = Maps;
    heads = r;
    d = depth;
    dv = value_width;
    d2 = (d + 1) / 2;
    dv2 = (dv + 1) / 2;
    n_pad = round_up(N, Bs);
    auto sized = [](aligned_vector<Eigen::bfloat16>& buffer, index_t size) {
      buffer.resize(static_cast<std::size_t>(size));
    };
    sized(q2, r * Maps * n_pad * 2 * d2);
    sized(do2, r * n_pad * 2 * dv2);
    const index_t m_pad = round_up(M, Bs);
    sized(k2, Maps * d2 * m_pad * 2);
    sized(v2, dv2 * m_pad * 2);
  }

  // Key block kb of the pair: its keys and values from the float tiles already in keys.
  void pack_key_block(const packed_keys<float>& keys, index_t kb) {
    for (index_t m = 0; m < maps; ++m) pack_pair_columns(keys.kt_tile(kb, m, d), d, k2.data() + key_at(kb, m));
    pack_pair_columns(keys.vt_tile(kb, dv), dv, v2.data() + value_at(kb));
  }

  // Query block qb of pair (b, j): its queries and output gradients from q and d_o.
  void pack_query_block(cview<Eigen::bfloat16, 5> q, cview<Eigen::bfloat16, 4> d_o, index_t b, index_t j, index_t qb) {
    const index_t N = q.extent(1), H = q.extent(2), t0 = qb * Bs, rows = std::min(Bs, N - t0);
    for (index_t hl = 0; hl < heads; ++hl) {
      const index_t h = j * heads + hl;
      for (index_t m = 0; m < maps; ++m)
        pack_pair_rows(q.data() + (((b * N + t0) * H + h) * maps + m) * d, H * maps * d, rows, d,
                       q2.data() + query_at(hl, m, t0));
      pack_pair_rows(d_o.data() + ((b * N + t0) * H + h) * dv, H * dv, rows, dv, do2.data() + gradient_at(hl, t0));
    }
  }

  // S_m of query block i0 of head hl against key block kb, times scale, into s [Bs][Bs].
  void scores(bf16_score_tile_fn kernel, index_t hl, index_t m, index_t i0, index_t kb, float scale, float* s) const {
    kernel(d2, q2.data() + query_at(hl, m, i0), k2.data() + key_at(kb, m), scale, s);
  }
  // dP = dO·Vᵀ of the same tiles into dp [Bs][Bs].
  void output_gradient_products(bf16_score_tile_fn kernel, index_t hl, index_t i0, index_t kb, float* dp) const {
    kernel(dv2, do2.data() + gradient_at(hl, i0), v2.data() + value_at(kb), 1.0f, dp);
  }

 private:
  index_t query_at(index_t hl, index_t m, index_t i0) const { return ((hl * maps + m) * n_pad + i0) * 2 * d2; }
  index_t gradient_at(index_t hl, index_t i0) const { return (hl * n_pad + i0) * 2 * dv2; }
  index_t key_at(index_t kb, index_t m) const { return (kb * maps + m) * d2 * Bs * 2; }
  index_t value_at(index_t kb) const { return kb * dv2 * Bs * 2; }
};

}  // namespace difftx::simd_detail
