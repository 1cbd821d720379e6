// simd rotary position embedding (formulas in difftx/ops/rope.hpp). For each
// position the cosines and signed sines are tabulated once (in double, then
// rounded, as the reference does; xsimd's vector sincos keeps the table from
// costing more than the rotations; or copied from a caller's rope_table),
// duplicated per pair, so a rotation is
//   out = x ⊙ [c0, c0, c1, c1, ...] + swap_pairs(x) ⊙ [-s0, s0, -s1, s1, ...].
#pragma once

#include <cmath>
#include <vector>

#include "difftx/ops/rope.hpp"
#include "difftx/policy/simd/common.hpp"

namespace difftx {

namespace simd_detail {

struct swap_pairs_mask {
  static constexpr unsigned get(unsigned i, unsigned) { return i ^ 1u; }
};

// Rotates x[B, N, V, d] in place, position by position: fill(p, cosines,
// sines) writes position p's cosines and sines duplicated per pair, the sines
// signed [-s0, s0, -s1, s1, ...] (times sign).
template <class T, class Fill>
void rope_rotate(const policy::simd& p, TensorView<T, 4> x, index_t offset, Fill&& fill) {
  using A = accum_t<T>;
  using V = vec<A>;
  using index_batch = xsimd::batch<xsimd::as_unsigned_integer_t<A>>;
  constexpr index_t W = V::size;
  const index_t B = x.extent(0), N = x.extent(1), H = x.extent(2), d = x.extent(3);
  fork(thread_count(p, x.size()), [&](int t, int parts) {
    std::vector<A> cosines(static_cast<std::size_t>(d)), sines(static_cast<std::size_t>(d)), scratch(static_cast<std::size_t>(d));
    const auto [first, last] = share_of(N, t, parts);
    for (index_t n = first; n < last; ++n) {
      fill(offset + n, cosines, sines);
      for (index_t b = 0; b < B; ++b)
        for (index_t h = 0; h < H; ++h) {
          T* vector = x.data() + ((b * N + n) * H + h) * d;
          A* v = scratch.data();
          to_accum(vector, d, v);
          index_t c = 0;
          for (; c + W <= d; c += W) {
            const V xv = V::load_unaligned(v + c);
            const V swapped = xsimd::swizzle(xv, xsimd::make_batch_constant<index_batch, swap_pairs_mask>());
            simd_detail::multiply_add(xv, V::load_unaligned(cosines.data() + c), swapped * V::load_unaligned(sines.data() + c))
                .store_unaligned(v + c);
          }
          for (; c < d; c += 2) {
            const A x0 = v[c], x1 = v[c + 1];
            v[c] = x0 * cosines[static_cast<std::size_t>(c)] + x1 * sines[static_cast<std::size_t>(c)];
            v[c + 1] = x1 * cosines[static_cast<std::size_t>(c + 1)] + x0 * sines[static_cast<std::size_t>(c + 1)];
          }
          from_accum(v, d, vector);
        }
    }
  });
}

// Pair i's entries of a position's duplicated cosines and signed sines.
template <class A>
void set_rope_pair(std::vector<A>& cosines, std::vector<A>& sines, index_t i, A c, A s) {
  const auto e = static_cast<std::size_t>(2 * i);
  cosines[e] = cosines[e + 1] = c;
  sines[e] = -s;
  sines[e + 1] = s;
}

// The angles from theta: sin and cos in double, WD angles at a time, then rounded.
template <class T>
void rope_rotate(const policy::simd& p, TensorView<T, 4> x, index_t offset, double theta, const rope_scaling& scaling,
                 double sign) {
  using A = accum_t<T>;
  constexpr index_t WD = vec<double>::size;
  const index_t d = x.extent(3);
  std::vector<double> inverse_frequency(static_cast<std::size_t>(d / 2));
  for (index_t i = 0; i < d / 2; ++i)
    inverse_frequency[static_cast<std::size_t>(i)] = rope_inverse_frequency(theta, scaling, i, d);
  rope_rotate(p, x, offset, [&](index_t position_index, std::vector<A>& cosines, std::vector<A>& sines) {
    const double position = static_cast<double>(position_index);
    auto set_pair = [&](index_t i, double c, double s) {
      set_rope_pair(cosines, sines, i, static_cast<A>(c), static_cast<A>(sign * s));
    };
    index_t i = 0;
    for (; i + WD <= d / 2; i += WD) {
      const auto [sin, cos] = xsimd::sincos(vec<double>(position) * vec<double>::load_unaligned(inverse_frequency.data() + i));
      alignas(64) double sin_lanes[WD], cos_lanes[WD];
      sin.store_aligned(sin_lanes);
      cos.store_aligned(cos_lanes);
      for (index_t l = 0; l < WD; ++l) set_pair(i + l, cos_lanes[l], sin_lanes[l]);
    }
    for (; i < d / 2; ++i) {
      const double angle = position * inverse_frequency[static_cast<std::size_t>(i)];
      set_pair(i, std::cos(angle), std::sin(angle));
    }
  });
}

// The angles a caller's table holds (ops/rope.hpp, rope_table).
template <class T>
void rope_rotate(const policy::simd& p, TensorView<T, 4> x, index_t offset, const rope_table<accum_t<T>>& table,
                 double sign) {
  using A = accum_t<T>;
  rope_rotate(p, x, offset, [&](index_t position, std::vector<A>& cosines, std::vector<A>& sines) {
    for (index_t i = 0; i < x.extent(3) / 2; ++i)
      set_rope_pair(cosines, sines, i, table.cos(position, i), sign < 0 ? -table.sin(position, i) : table.sin(position, i));
  });
}

}  // namespace simd_detail

// x[B, N, V, d] rotated in place by the angle of each position.
template <class T>
  requires supported_by<policy::simd, T>
void rope_forward(const policy::simd& p, TensorView<T, 4> x, index_t offset, double theta,
                  const rope_scaling& scaling = {}) {
  detail::check_rope("rope_forward", memory_space::host, x, "x", offset, theta, scaling);
  simd_detail::rope_rotate(p, x, offset, theta, scaling, +1.0);
}

// dx[B, N, V, d] (given as dy, in place) = rotation by the negated angle.
template <class T>
  requires supported_by<policy::simd, T>
void rope_backward(const policy::simd& p, TensorView<T, 4> dx, index_t offset, double theta,
                  const rope_scaling& scaling = {}) {
  detail::check_rope("rope_backward", memory_space::host, dx, "dx", offset, theta, scaling);
  simd_detail::rope_rotate(p, dx, offset, theta, scaling, -1.0);
}

// The same with a caller's cos and sin tables (ops/rope.hpp, rope_table).
template <class T>
  requires supported_by<policy::simd, T>
void rope_forward(const policy::simd& p, TensorView<T, 4> x, index_t offset, const rope_table<accum_t<T>>& table) {
  detail::check_rope("rope_forward", memory_space::host, x, "x", offset, table);
  simd_detail::rope_rotate(p, x, offset, table, +1.0);
}
template <class T>
  requires supported_by<policy::simd, T>
void rope_backward(const policy::simd& p, TensorView<T, 4> dx, index_t offset, const rope_table<accum_t<T>>& table) {
  detail::check_rope("rope_backward", memory_space::host, dx, "dx", offset, table);
  simd_detail::rope_rotate(p, dx, offset, table, -1.0);
}

}  // namespace difftx
