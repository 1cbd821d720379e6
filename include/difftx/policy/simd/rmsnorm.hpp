// simd RMSNorm forward/backward (formulas in difftx/ops/rmsnorm.hpp): one row
// per iteration over OpenMP threads, xsimd within the row.
#pragma once

#include <cmath>
#include <vector>

#include "difftx/ops/rmsnorm.hpp"
#include "difftx/policy/simd/common.hpp"

namespace difftx {

namespace simd_detail {
// s · w in the accumulation type, once per call rather than per row.
template <class T>
std::vector<accum_t<T>> scaled_weight(cview<T, 1> w, double scale) {
  std::vector<accum_t<T>> scaled(static_cast<std::size_t>(w.size()));
  to_accum(w.data(), w.size(), scaled.data());
  for (auto& v : scaled) v *= static_cast<accum_t<T>>(scale);
  return scaled;
}
}  // namespace simd_detail

// x[M, C], w[C] -> y[M, C] = scale · x · rstd · w,  rstd[M]
template <class T>
  requires supported_by<policy::simd, T>
void rmsnorm_forward(const policy::simd& p, cview<T, 2> x, cview<T, 1> w, double eps, double scale,
                     TensorView<T, 2> y, TensorView<accum_t<T>, 1> rstd) {
  using namespace simd_detail;
  using A = accum_t<T>;
  constexpr std::string_view where = "rmsnorm_forward";
  detail::check_rmsnorm(where, memory_space::host, x, w, y, rstd, "y");
  const index_t M = x.extent(0), C = x.extent(1);
  constexpr index_t W = vec<A>::size;
  const std::vector<A> w_scaled = scaled_weight<T>(w, scale);
  fork(thread_count(p, M * C), [&](int t, int n) {
    std::vector<A> in_scratch, out(static_cast<std::size_t>(C));
    const auto [first, last] = share_of(M, t, n);
    for (index_t m = first; m < last; ++m) {
      const A* row = accum_row(x.data() + m * C, C, in_scratch);
      const A sum_sq = dot(row, row, C);
      A r = A(1) / std::sqrt(sum_sq / static_cast<A>(C) + static_cast<A>(eps));
      if (!std::isfinite(sum_sq)) {  // overflowed: rescale by the largest |x| (ops/rmsnorm.hpp)
        A largest = 0;
        for (index_t c = 0; c < C; ++c) largest = std::max(largest, std::abs(row[c]));
        A scaled_sq = 0;
        for (index_t c = 0; c < C; ++c) scaled_sq += (row[c] / largest) * (row[c] / largest);
        r = A(1) / (largest * std::sqrt(scaled_sq / static_cast<A>(C) + static_cast<A>(eps) / (largest * largest)));
      }
      rstd(m) = r;
      const vec<A> rv(r);
      index_t c = 0;
      for (; c + W <= C; c += W)
        (vec<A>::load_unaligned(row + c) * rv * vec<A>::load_unaligned(w_scaled.data() + c)).store_unaligned(out.data() + c);
      for (; c < C; ++c) out[static_cast<std::size_t>(c)] = row[c] * r * w_scaled[static_cast<std::size_t>(c)];
      from_accum(out.data(), C, y.data() + m * C);
    }
  });
}

// dy[M, C] -> dx[M, C] (assign), dw[C] (+=)
template <class T>
  requires supported_by<policy::simd, T>
void rmsnorm_backward(const policy::simd& p, cview<T, 2> x, cview<T, 1> w, cview<accum_t<T>, 1> rstd, double scale,
                      cview<T, 2> dy, TensorView<T, 2> dx, TensorView<T, 1> dw) {
  using namespace simd_detail;
  using A = accum_t<T>;
  constexpr std::string_view where = "rmsnorm_backward";
  detail::check_rmsnorm_backward(where, memory_space::host, x, w, rstd, dy, dx, dw);
  const index_t M = x.extent(0), C = x.extent(1);
  constexpr index_t W = vec<A>::size;
  const A s = static_cast<A>(scale);
  const std::vector<A> w_scaled = scaled_weight<T>(w, scale);
  const int threads = thread_count(p);
  std::vector<std::vector<A>> dw_partial(static_cast<std::size_t>(threads), std::vector<A>(static_cast<std::size_t>(C), A(0)));
#pragma omp parallel num_threads(threads)
  {
#if defined(_OPENMP)
    auto& dw_acc = dw_partial[static_cast<std::size_t>(omp_get_thread_num())];
#else
    auto& dw_acc = dw_partial[0];
#endif
    std::vector<A> x_scratch, dy_scratch, g(static_cast<std::size_t>(C)), out(static_cast<std::size_t>(C));
#pragma omp for schedule(static)
    for (index_t m = 0; m < M; ++m) {
      const A* xr = accum_row(x.data() + m * C, C, x_scratch);
      const A* dyr = accum_row(dy.data() + m * C, C, dy_scratch);
      const A r = rstd(m);
      const vec<A> rv(r);
      // g = s w ⊙ dy;  mean(g ⊙ x̂) = r · dot(g, x) / C;  dw += s · dy ⊙ x̂
      index_t c = 0;
      for (; c + W <= C; c += W) {
        const auto dyv = vec<A>::load_unaligned(dyr + c), xv = vec<A>::load_unaligned(xr + c);
        (vec<A>::load_unaligned(w_scaled.data() + c) * dyv).store_unaligned(g.data() + c);
        simd_detail::multiply_add(vec<A>(s) * dyv, xv * rv, vec<A>::load_unaligned(dw_acc.data() + c)).store_unaligned(dw_acc.data() + c);
      }
      for (; c < C; ++c) {
        const auto cs = static_cast<std::size_t>(c);
        g[cs] = w_scaled[cs] * dyr[c];
        dw_acc[cs] += s * dyr[c] * xr[c] * r;
      }
      const A mean_g_xhat = r * dot(g.data(), xr, C) / static_cast<A>(C);
      // dx = r (g - x̂ mean(g ⊙ x̂)) with x̂ = r x (no r², which underflows where x is huge)
      const vec<A> mean(mean_g_xhat);
      for (c = 0; c + W <= C; c += W)
        (rv * simd_detail::negative_multiply_add(mean, rv * vec<A>::load_unaligned(xr + c), vec<A>::load_unaligned(g.data() + c)))
            .store_unaligned(out.data() + c);
      for (; c < C; ++c)
        out[static_cast<std::size_t>(c)] = r * (g[static_cast<std::size_t>(c)] - r * xr[c] * mean_g_xhat);
      from_accum(out.data(), C, dx.data() + m * C);
    }
  }
  std::vector<A> dw_total(static_cast<std::size_t>(C));
  to_accum(dw.data(), C, dw_total.data());
  for (const auto& partial : dw_partial)
    for (index_t c = 0; c < C; ++c) dw_total[static_cast<std::size_t>(c)] += partial[static_cast<std::size_t>(c)];
  from_accum(dw_total.data(), C, dw.data());
}

}  // namespace difftx
