// Linear projection in the nn.Linear convention (w is [out, in]).
//   forward : y[M, N]  = x[M, K] · w[N, K]^T
//   backward: dx[M, K] = dy[M, N] · w[N, K]        (assign or add, see write_mode)
//             dw[N, K] += dy[M, N]^T · x[M, K]      (parameter gradients accumulate)
// Each policy implements linear_forward / linear_backward for these shapes and
// calls the checks below first.
//
// int8 weights (inference; the low-bit CPU policies, ops/int8.hpp): w as
// int8_rows<A> [N, K], step s_w[n] per output channel; x is quantized per row
// the same way (step s_x[m]) and
//   y[m, n] = A(Σ_k x8[m, k] · w8[n, k]) · s_x[m] · s_w[n]
// with the integer sum exact (int32, K <= 133144) and the two products in A,
// left to right, so every policy gives the same bits.
//
// w as decoding panels (inference, host policies; ops/decoding_panels.hpp):
// the same product for x of at most decoding_panels<T>::max_rows rows.
//
// Several products of one x (decoding's q, k and v; gate and up):
//   linear_forward(policy, x[M, K], parts): y_k[M, N_k] = x · w_k[N_k, K]^T
// for each linear_part {&w_k, y_k}, w_k float weights (cview<T, 2>) or int8
// rows; the same bits as one linear_forward a part.
#pragma once

#include <span>

#include "difftx/ops/common.hpp"
#include "difftx/ops/decoding_panels.hpp"

namespace difftx::detail {

template <class X, class W, class Y>
void check_linear(std::string_view where, memory_space space, const X& x, const W& w, const Y& y, const char* y_name) {
  require_nonempty(where, "x", x);
  require_nonempty(where, "w", w);
  require(x.extent(1) == w.extent(1), where, "w",
          [&] { return "shape [N, " + std::to_string(x.extent(1)) + "] (x is [M, K])"; },
          [&] { return shape_string(w.shape()); });
  require_shape(where, y_name, y, {x.extent(0), w.extent(0)});
  require_all_in(where, space, {{"x", x.space()}, {"w", w.space()}, {y_name, y.space()}});
}

template <class X, class W, class DY, class DX, class DW>
void check_linear_backward(std::string_view where, memory_space space, const X& x, const W& w, const DY& dy,
                           const DX& dx, const DW& dw) {
  check_linear(where, space, x, w, dy, "dy");
  require_shape(where, "dx", dx, x.shape());
  require_shape(where, "dw", dw, w.shape());
  require_all_in(where, space, {{"dx", dx.space()}, {"dw", dw.space()}});
}

// The largest K whose int8 products stay exact in int32: K · 127² < 2^31.
inline constexpr index_t int8_max_depth = 133144;

// w stored as `what` (int8 weights, decoding panels) of w.rows x w.cols.
template <class X, class W, class Y>
void check_linear_stored(std::string_view where, memory_space space, const X& x, const W& w, const Y& y,
                         std::string_view what) {
  require_nonempty(where, "x", x);
  // (messages as callables, built only on a failure: every decoding product runs this check)
  require(w.rows > 0 && x.extent(1) == w.cols, where, "w",
          [&] { return std::string(what) + " [N, " + std::to_string(x.extent(1)) + "]"; },
          [&] { return std::string("[") + std::to_string(w.rows) + ", " + std::to_string(w.cols) + "]"; });
  require_shape(where, "y", y, {x.extent(0), w.rows});
  require_all_in(where, space, {{"x", x.space()}, {"y", y.space()}});
}

template <class X, class T, class Y>
void check_linear_panels(std::string_view where, memory_space space, const X& x, const decoding_panels<T>& w,
                         const Y& y) {
  check_linear_stored(where, space, x, w, y, "decoding panels");
  require(x.extent(0) <= decoding_panels<T>::max_rows, where, "x",
          [] {
            return std::string("at most ") + std::to_string(decoding_panels<T>::max_rows) + " rows (decoding panels)";
          },
          [&] { return std::to_string(x.extent(0)) + " rows"; });
}

}  // namespace difftx::detail

namespace difftx {

// One of several products of the same x: y = x · wᵀ, w a cview<T, 2> or int8_rows<accum_t<T>>.
template <class W, class T>
struct linear_part {
  const W* w;
  TensorView<T, 2> y;
};

namespace detail {

// Every part's shapes before any product writes.
template <class X, class W, class T>
void check_linear_parts(std::string_view where, memory_space space, const X& x, std::span<const linear_part<W, T>> parts) {
  require(!parts.empty(), where, "parts", "at least one product", "none");
  for (const auto& part : parts) {
    if constexpr (requires { part.w->extent(0); })
      check_linear(where, space, x, *part.w, part.y, "y");
    else
      check_linear_stored(where, space, x, *part.w, part.y, "int8 weights");
  }
}

}  // namespace detail

// Any policy: one product after the other. policy::simd computes decoding's
// few rows of x as one product (policy/simd/linear_parts.hpp).
template <class Policy, class T, class W>
void linear_forward(const Policy& p, cview<T, 2> x, std::span<const linear_part<W, T>> parts) {
  detail::check_linear_parts("linear_forward", p.memory().space(), x, parts);
  for (const auto& part : parts) linear_forward(p, x, *part.w, part.y);
}

}  // namespace difftx
