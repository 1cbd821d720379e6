// simd elementwise helpers (difftx/ops/elementwise.hpp).
#pragma once

#include <algorithm>

#include "difftx/ops/elementwise.hpp"
#include "difftx/policy/simd/common.hpp"

namespace difftx {

// y += x, any rank
template <class T, std::size_t R>
  requires supported_by<policy::simd, T>
void add_into(const policy::simd& p, cview<T, R> x, TensorView<T, R> y) {
  using namespace simd_detail;
  using A = accum_t<T>;
  detail::check_same_shape("add_into", memory_space::host, x, y);
  constexpr index_t chunk = 4096;
  parallel_chunks(p, x.size(), chunk, [&](index_t begin, index_t end) {
    A xs[chunk], ys[chunk];
    const index_t n = end - begin;
    to_accum(x.data() + begin, n, xs);
    to_accum(y.data() + begin, n, ys);
    for (index_t i = 0; i < n; ++i) ys[i] += xs[i];
    from_accum(ys, n, y.data() + begin);
  });
}

// y = x, any rank
template <class T, std::size_t R>
  requires supported_by<policy::simd, T>
void copy_into(const policy::simd& p, cview<T, R> x, TensorView<T, R> y) {
  detail::check_same_shape("copy_into", memory_space::host, x, y);
  simd_detail::parallel_chunks(p, x.size(), 1 << 16, [&](index_t begin, index_t end) {
    std::copy(x.data() + begin, x.data() + end, y.data() + begin);
  });
}

}  // namespace difftx
