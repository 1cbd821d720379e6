// The decode kernel's loops for a few query rows (attention_decode.hpp: up to
// gemv_rows per group), which read a block of the cache in place, in its
// storage type, converting float16, bfloat16 and int8 in registers:
// dots_per_position for the scores, weighted_sums_of_rows for P·V. A matrix
// product would pack the whole key (value) block for each call, which costs
// more than that reading (and for float16/bfloat16 a converted copy of the
// block costs more than the reading).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "difftx/core/x86_intrinsics.hpp"  // before Eigen
#include <Eigen/Core>

#include "difftx/policy/simd/common.hpp"
#include "difftx/policy/simd/stream_prefetch.hpp"

namespace difftx::simd_detail {

// Up to this many query rows per group, the block is read in place by
// dots_per_position (scores: each key's row once for all query rows) and
// weighted_sums_of_rows (P·V: the values once per row, from L2 after the
// first); past it, Eigen's products on a converted block.
constexpr index_t gemv_rows = 4;

// Whether the few-rows kernels read T's rows two values a lane (load_bf16_pairs):
// bfloat16 into float. Then a query row's values are stored in pair order:
// each whole run of 2W values as its even columns, then its odd ones.
template <class A, class T>
constexpr bool reads_pairs = std::is_same_v<T, Eigen::bfloat16> && std::is_same_v<A, float>;
// The values of a row one step of those kernels reads.
template <class A, class T>
constexpr index_t row_step = reads_pairs<A, T> ? 2 * vec<A>::size : vec<A>::size;

// x's d values into pair order, in place (a tail shorter than a run stays).
template <class A, class T>
void to_pair_order(A* x, index_t d) {
  constexpr index_t step = row_step<A, T>, W = vec<A>::size;
  alignas(64) A run[step];
  for (index_t c = 0; c + step <= d; c += step) {
    for (index_t i = 0; i < W; ++i) {
      run[i] = x[c + 2 * i];
      run[W + i] = x[c + 2 * i + 1];
    }
    std::copy_n(run, step, x + c);
  }
}

// s[i·s_stride + t] = x_i · K(t, i / per_piece) for query rows i < n and keys
// t < keys. Key t's row, at first + t·stride, holds pieces of d values side
// by side (every group and map of a position); query row i (d values at
// x + i·d, in pair order for reads_pairs) meets piece i / per_piece. A key's
// row is read once for all query rows, W of them at a time with their sums
// reduced across lanes together.
//
// The block's values (values_first, a row of values_row_bytes per key) are
// asked for into L2 beside each key: P·V reads them next, and the arithmetic
// here (a lane reduction per key) leaves memory idle enough to fetch them,
// which a read of its own in P·V did not overlap (a 375M model's attention
// on an Intel Xeon: 40 -> 36 µs a float32 layer, 28 -> 26 bfloat16).
template <class A, class T>
void dots_per_position(const A* x, index_t n, index_t per_piece, index_t d, const T* first, index_t stride,
                       index_t keys, A* s, index_t s_stride, const std::byte* values_first, index_t values_row_bytes) {
  using V = vec<A>;
  constexpr index_t W = V::size, step = row_step<A, T>;
  const index_t d_vec = d / step * step;
  auto add_step = [](const A* xc, const T* kc, V acc) {
    if constexpr (reads_pairs<A, T>) {
      const bf16_pair_halves k2 = load_bf16_pairs(kc);
      return simd_detail::multiply_add(V::load_unaligned(xc + W), k2.odd, simd_detail::multiply_add(V::load_unaligned(xc), k2.even, acc));
    } else {
      return simd_detail::multiply_add(V::load_unaligned(xc), load_row_as<A>(kc), acc);
    }
  };
  std::vector<index_t> piece(static_cast<std::size_t>(n));  // where query row i's piece starts in a key's row
  for (index_t i = 0; i < n; ++i) piece[static_cast<std::size_t>(i)] = i / per_piece * d;
  auto rest = [&](index_t i, const T* key) {  // the columns past the last whole step
    A sum(0);
    for (index_t c = d_vec; c < d; ++c) sum += x[i * d + c] * static_cast<A>(key[piece[static_cast<std::size_t>(i)] + c]);
    return sum;
  };
  auto dot = [&](index_t i, const T* key) {  // x_i · its piece of key, the whole steps, in two chains
    const A* xi = x + i * d;
    const T* ki = key + piece[static_cast<std::size_t>(i)];
    V even_steps(A(0)), odd_steps(A(0));
    index_t c = 0;
    for (; c + 2 * step <= d_vec; c += 2 * step) {
      even_steps = add_step(xi + c, ki + c, even_steps);
      odd_steps = add_step(xi + c + step, ki + c + step, odd_steps);
    }
    if (c < d_vec) even_steps = add_step(xi + c, ki + c, even_steps);
    return even_steps + odd_steps;
  };
  // Every line of the key rows ahead (stream_prefetch.hpp): the cache streams
  // from memory once a step, as the weights do.
  const index_t row_bytes = stride * index_t{sizeof(T)};
  const stream_distance ahead = stream_ahead(row_bytes);
  for (index_t t = 0; t < keys; ++t) {
    const T* key = first + t * stride;
    for (index_t b = 0; b < row_bytes; b += 64) prefetch_ahead(reinterpret_cast<const std::byte*>(key) + b, ahead);
    for (index_t b = 0; b < values_row_bytes; b += 64) prefetch_into_l2(values_first + t * values_row_bytes + b);
    index_t i0 = 0;
    for (; i0 + W <= n; i0 += W) {
      V acc[W];
      DIFFTX_UNROLL(16)
      for (index_t i = 0; i < W; ++i) acc[i] = dot(i0 + i, key);
      alignas(64) A sums[W];
      lane_sums(acc, sums);
      for (index_t i = 0; i < W; ++i) s[(i0 + i) * s_stride + t] = sums[i];
    }
    for (; i0 < n; ++i0) s[i0 * s_stride + t] = xsimd::hadd(dot(i0, key));
    if (d_vec < d)
      for (index_t i = 0; i < n; ++i) s[i * s_stride + t] += rest(i, key);
  }
}

// out[m][c] = Σ_t p[m][t] · V(t, c) for c < dv and each of the Maps maps, V's
// row t at v_first + t·stride (T, or int8): the rows stream past once for
// every few vectors of columns and all maps (a differential head's two maps,
// and the query rows that share V's group), those vectors of each map's out
// held in registers: fewer vectors at once for more maps, so that AVX2's 16
// registers hold them.
template <int Maps, class A, class T>
void weighted_sums_of_rows(const std::array<const A*, Maps>& p, const T* v_first, index_t stride, index_t keys,
                           index_t dv, const std::array<A*, Maps>& out) {
  using V = vec<A>;
  constexpr index_t W = V::size;
  const stream_distance ahead = stream_ahead(stride * index_t{sizeof(T)});  // the rows' lines this pass reads, ahead
  constexpr bool wide = sizeof(V) >= 64;  // AVX-512: 32 vector registers, else 16
  auto columns = [&](auto vectors, index_t c0) {
    constexpr index_t NV = decltype(vectors)::value;
    V acc[Maps][NV];
    for (auto& map_acc : acc)
      for (auto& a : map_acc) a = V(A(0));
    for (index_t t = 0; t < keys; ++t) {
      V row[NV];
      for (index_t v = 0; v < NV; ++v) {
        if (v * W * index_t{sizeof(T)} % 64 == 0) prefetch_ahead(v_first + t * stride + c0 + v * W, ahead);
        row[v] = load_row_as<A>(v_first + t * stride + c0 + v * W);
      }
      for (index_t m = 0; m < Maps; ++m) {
        const V pv(p[m][t]);
        for (index_t v = 0; v < NV; ++v) acc[m][v] = simd_detail::multiply_add(pv, row[v], acc[m][v]);
      }
    }
    for (index_t m = 0; m < Maps; ++m)
      for (index_t v = 0; v < NV; ++v) acc[m][v].store_unaligned(out[m] + c0 + v * W);
  };
  index_t c0 = 0;
  if constexpr (reads_pairs<A, T>) {
    // reads_pairs: NP runs of 2W columns, each as its even and odd columns,
    // interleaved again when stored.
    auto pair_columns = [&](auto runs, index_t first) {
      constexpr index_t NP = decltype(runs)::value;
      V even[Maps][NP], odd[Maps][NP];
      for (index_t m = 0; m < Maps; ++m)
        for (index_t u = 0; u < NP; ++u) even[m][u] = odd[m][u] = V(A(0));
      for (index_t t = 0; t < keys; ++t) {
        bf16_pair_halves row[NP];
        for (index_t u = 0; u < NP; ++u) {
          if (2 * u * W * index_t{sizeof(T)} % 64 == 0) prefetch_ahead(v_first + t * stride + first + 2 * u * W, ahead);
          row[u] = load_bf16_pairs(v_first + t * stride + first + 2 * u * W);
        }
        for (index_t m = 0; m < Maps; ++m) {
          const V pv(p[m][t]);
          for (index_t u = 0; u < NP; ++u) {
            even[m][u] = simd_detail::multiply_add(pv, row[u].even, even[m][u]);
            odd[m][u] = simd_detail::multiply_add(pv, row[u].odd, odd[m][u]);
          }
        }
      }
      alignas(64) A e[W], o[W];
      for (index_t m = 0; m < Maps; ++m)
        for (index_t u = 0; u < NP; ++u) {
          even[m][u].store_aligned(e);
          odd[m][u].store_aligned(o);
          A* run = out[m] + first + 2 * u * W;
          for (index_t i = 0; i < W; ++i) {
            run[2 * i] = e[i];
            run[2 * i + 1] = o[i];
          }
        }
    };
    constexpr index_t NP = (wide ? 4 : 2) / (Maps > 2 ? 2 : 1);  // 2·Maps·NP + 2·NP vectors
    for (; c0 + 2 * NP * W <= dv; c0 += 2 * NP * W) pair_columns(std::integral_constant<index_t, NP>{}, c0);
    for (; c0 + 2 * W <= dv; c0 += 2 * W) pair_columns(std::integral_constant<index_t, 1>{}, c0);
  }
  constexpr index_t NV = wide || Maps <= 2 ? 4 : 2;  // Maps·NV + NV vectors
  for (; c0 + NV * W <= dv; c0 += NV * W) columns(std::integral_constant<index_t, NV>{}, c0);
  for (; c0 + W <= dv; c0 += W) columns(std::integral_constant<index_t, 1>{}, c0);
  for (; c0 < dv; ++c0)
    for (index_t m = 0; m < Maps; ++m) {
      A x(0);
      for (index_t t = 0; t < keys; ++t) x += p[m][t] * static_cast<A>(v_first[t * stride + c0]);
      out[m][c0] = x;
    }
}

}  // namespace difftx::simd_detail
