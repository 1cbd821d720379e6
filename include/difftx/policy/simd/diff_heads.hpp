// simd V2 head combination (formulas in difftx/ops/diff_heads.hpp): rows of D
// values, blocks of tokens per thread, Eigen array expressions on each row.
#pragma once

#include <algorithm>
#include <vector>

#include "difftx/ops/diff_heads.hpp"
#include "difftx/policy/simd/common.hpp"

namespace difftx {

namespace simd_detail {
// Tokens per work item: about 16 K values of a, at least one token.
inline index_t diff_heads_tokens(index_t heads, index_t D) { return std::max<index_t>(1, (16 << 10) / (2 * heads * D)); }
template <class A>
using row_map = Eigen::Map<Eigen::Array<A, Eigen::Dynamic, 1>>;
template <class A>
using const_row_map = Eigen::Map<const Eigen::Array<A, Eigen::Dynamic, 1>>;
}  // namespace simd_detail

// a[M, 2h, D], z[M, h] -> o[M, h, D]
template <class T>
  requires supported_by<policy::simd, T>
void diff_heads_forward(const policy::simd& p, cview<T, 3> a, cview<T, 2> z, TensorView<T, 3> o) {
  using namespace simd_detail;
  using A = accum_t<T>;
  detail::check_diff_heads("diff_heads_forward", memory_space::host, a, z, o, "o");
  const index_t M = o.extent(0), h = o.extent(1), D = o.extent(2);
  parallel_chunks(p, M, diff_heads_tokens(h, D), [&](index_t begin, index_t end) {
    std::vector<A> even, odd, out(static_cast<std::size_t>(D));
    for (index_t m = begin; m < end; ++m)
      for (index_t i = 0; i < h; ++i) {
        const A lambda = detail::sigmoid<T>(load(z(m, i)));
        const A* a1 = accum_row(a.data() + (m * 2 * h + 2 * i) * D, D, even);
        const A* a2 = accum_row(a.data() + (m * 2 * h + 2 * i + 1) * D, D, odd);
        row_map<A>(out.data(), D) = const_row_map<A>(a1, D) - lambda * const_row_map<A>(a2, D);
        from_accum(out.data(), D, o.data() + (m * h + i) * D);
      }
  }, 2 * h * D);
}

// do[M, h, D] -> da[M, 2h, D], dz[M, h] (assign)
template <class T>
  requires supported_by<policy::simd, T>
void diff_heads_backward(const policy::simd& p, cview<T, 3> a, cview<T, 2> z, cview<T, 3> d_o, TensorView<T, 3> da,
                         TensorView<T, 2> dz) {
  using namespace simd_detail;
  using A = accum_t<T>;
  detail::check_diff_heads_backward("diff_heads_backward", memory_space::host, a, z, d_o, da, dz);
  const index_t M = d_o.extent(0), h = d_o.extent(1), D = d_o.extent(2);
  parallel_chunks(p, M, diff_heads_tokens(h, D), [&](index_t begin, index_t end) {
    std::vector<A> grad_row, odd, out(static_cast<std::size_t>(D));
    for (index_t m = begin; m < end; ++m)
      for (index_t i = 0; i < h; ++i) {
        const A lambda = detail::sigmoid<T>(load(z(m, i)));
        const T* grad_stored = d_o.data() + (m * h + i) * D;
        const A* grad = accum_row(grad_stored, D, grad_row);
        const A* a2 = accum_row(a.data() + (m * 2 * h + 2 * i + 1) * D, D, odd);
        std::copy_n(grad_stored, D, da.data() + (m * 2 * h + 2 * i) * D);
        row_map<A>(out.data(), D) = -lambda * const_row_map<A>(grad, D);
        from_accum(out.data(), D, da.data() + (m * 2 * h + 2 * i + 1) * D);
        dz(m, i) = store<T>(-lambda * (A(1) - lambda) * dot(grad, a2, D));
      }
  }, 2 * h * D);
}

}  // namespace difftx
