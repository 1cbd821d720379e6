// simd linear forward with int8 weights (formula in difftx/ops/linear.hpp):
// the rows of x quantized in parallel, the exact integer products of
// gemm_int8.hpp (or oneDNN's u8·s8→s32 matmul for many rows where the policy
// takes it, linear_onednn.hpp: the same sums), then y = A(sum) · s_x · s_w, in
// the reference's order (the same bits). Decoding's few rows stream each weight
// byte once, a quarter of float32's bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "difftx/ops/int8.hpp"
#include "difftx/ops/linear.hpp"
#include "difftx/policy/simd/common.hpp"
#include "difftx/policy/simd/gemm_int8.hpp"
#include "difftx/policy/simd/onednn_products.hpp"

namespace difftx {

namespace simd_detail {

// The rows of x [M, K] (storage T) quantized, on the policy's threads.
template <class T>
int8_rows<accum_t<T>> quantized_rows(const policy::simd& p, cview<T, 2> x) {
  using A = accum_t<T>;
  const index_t M = x.extent(0), K = x.extent(1);
  int8_rows<A> rows(M, K);
  fork(M > 4 ? thread_count(p) : 1, [&](int t, int n) {
    std::vector<A> scratch;
    const auto [first, last] = share_of(M, t, n);
    for (index_t m = first; m < last; ++m) rows.set_row(m, accum_row(x.data() + m * K, K, scratch));
  });
  return rows;
}

// y[m, j0 .. j0 + n) = sums · s_x[m] · s_w[j], in the reference's order.
template <class T, class A>
void store_scaled(const int8_rows<A>& x8, const int8_rows<A>& w, TensorView<T, 2> y, index_t m, index_t j0, index_t n,
                  const std::int32_t* sums) {
  alignas(64) A out[64];
  const A step = x8.steps[static_cast<std::size_t>(m)];
  for (index_t c0 = 0; c0 < n; c0 += 64) {
    const index_t width = std::min<index_t>(64, n - c0);
    for (index_t c = 0; c < width; ++c) out[c] = A(sums[c0 + c]) * step * w.steps[static_cast<std::size_t>(j0 + c0 + c)];
    from_accum(out, width, y.data() + m * w.rows + j0 + c0);
  }
}

// y[M, N] = (x[M, K] quantized per row) · w8[N, K]^T, scaled; packed: w8's
// packed copy for oneDNN, or nullptr.
template <class T>
void int8_linear_forward(const policy::simd& p, cview<T, 2> x, const int8_rows<accum_t<T>>& w,
                         const policy::simd::packed_weights* packed, TensorView<T, 2> y) {
  detail::check_linear_stored("linear_forward", memory_space::host, x, w, y, "int8 weights");
  const auto x8 = quantized_rows<T>(p, x);
  const auto store = [&](index_t m, index_t j0, index_t n, const std::int32_t* sums) {
    store_scaled(x8, w, y, m, j0, n, sums);
  };
  if (!onednn_int8_products(p, x8, w, store, packed)) int8_products(p, x8, w, store);
}

}  // namespace simd_detail

// y[M, N] = (x[M, K] quantized per row) · w8[N, K]^T, scaled
template <class T>
  requires supported_by<policy::simd, T>
void linear_forward(const policy::simd& p, cview<T, 2> x, const int8_rows<accum_t<T>>& w, TensorView<T, 2> y) {
  simd_detail::int8_linear_forward(p, x, w, nullptr, y);
}

#if defined(DIFFTX_ONEDNN)
// The same with w8 also packed (pack_weights, linear_onednn.hpp): the same bits.
template <class T>
  requires supported_by<policy::simd, T>
void linear_forward(const policy::simd& p, cview<T, 2> x, const int8_rows<accum_t<T>>& w,
                    const policy::simd::packed_weights& packed, TensorView<T, 2> y) {
  simd_detail::check_packed<std::int8_t>("linear_forward", packed, w.rows, w.padded);
  simd_detail::int8_linear_forward(p, x, w, &packed, y);
}
#endif

}  // namespace difftx
