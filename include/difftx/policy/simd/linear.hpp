// simd linear forward/backward (shapes in difftx/ops/linear.hpp): Eigen GEMMs,
// the output split into blocks over OpenMP threads (Eigen runs each block on
// one thread inside a parallel region); decoding's few rows of x stream w
// instead (streamed_dots), or w's decoding panels into partial sums of y
// (panel_gemv). float16/bfloat16 products go to reduced_gemm (gemm.hpp),
// which converts while it packs. Products of many rows go to oneDNN's matmul
// where the policy takes it (linear_onednn.hpp).
#pragma once

#include <algorithm>
#include <span>
#include <vector>

#include "difftx/core/x86_intrinsics.hpp"  // before Eigen
#include <Eigen/Core>

#include "difftx/ops/linear.hpp"
#include "difftx/policy/simd/common.hpp"
#include "difftx/policy/simd/gemm.hpp"
#include "difftx/policy/simd/gemv_amx_bf16.hpp"
#include "difftx/policy/simd/onednn_products.hpp"
#include "difftx/policy/simd/stream_prefetch.hpp"

namespace difftx {

namespace simd_detail {

template <class A>
using row_matrix = Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class A>
using matrix_map = Eigen::Map<row_matrix<A>>;
template <class A>
using const_matrix_map = Eigen::Map<const row_matrix<A>>;

// Eigen built with OpenMP threads a GEMM itself when omp_get_max_threads() > 1
// and the calling team has one thread, which is every block of a one-part
// split: a second split inside ours, slower than one thread (it packs for
// threads it does not get). The count is set for this scope only: a part run
// on a step_team's lead shares the lead's implicit task with the rest of the step.
class single_threaded_eigen {
 public:
#if defined(_OPENMP)
  single_threaded_eigen() noexcept : before_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~single_threaded_eigen() { omp_set_num_threads(before_); }
#else
  single_threaded_eigen() noexcept : before_(1) {}
#endif
  single_threaded_eigen(const single_threaded_eigen&) = delete;
  single_threaded_eigen& operator=(const single_threaded_eigen&) = delete;

 private:
  int before_;
};

// C[rows, cols] (=|+=) product, computed in row blocks (or column blocks when
// there are few rows) on `threads` threads. block(C_block, r0, r1, c0, c1)
// evaluates the product for that block of C.
template <class Block>
void parallel_blocks(index_t rows, index_t cols, int threads, Block&& block) {
  const bool by_rows = rows >= cols || rows >= 64 * threads;
  const index_t extent = by_rows ? rows : cols;
  const index_t parts = std::max<index_t>(1, std::min<index_t>(threads, extent / 16));
#pragma omp parallel for num_threads(static_cast<int>(parts)) schedule(static)
  for (index_t part = 0; part < parts; ++part) {
    const single_threaded_eigen one_thread;
    const auto [begin, end] = share_of(extent, static_cast<int>(part), static_cast<int>(parts));
    if (by_rows)
      block(begin, end, index_t{0}, cols);
    else
      block(index_t{0}, rows, begin, end);
  }
}

// out[r] = Σ_c x[c] · row[r·stride + c] for R rows, each read as one
// sequential stream into partial sums, x's vector loaded once for all R,
// every line prefetched whole groups of R rows ahead (stream_prefetch.hpp).
// Decoding's float and double products read w this way (for_each_gemv_slice
// shares the rows out), two rows at a time where that reads faster than one
// alone (Intel's AVX-512, as in the bfloat16 row_dots), else one at a time
// (policy::stream_order: Zen 4 streams one row alone faster). Eight partial
// sums a row, four where two rows' must share AVX2's sixteen registers with x.
template <int R, class A>
void streamed_dots(const A* x, const A* row, index_t stride, index_t k, A* out) noexcept {
  using V = vec<A>;
  constexpr index_t W = V::size, unroll = R == 1 || W * sizeof(A) >= 64 ? 8 : 4;
  const stream_distance ahead = stream_ahead(R * stride * index_t{sizeof(A)});
  V part[R][unroll];
  for (auto& r : part)
    for (auto& q : r) q = V(A(0));
  index_t c = 0;
  for (; c + unroll * W <= k; c += unroll * W)
    DIFFTX_UNROLL(8)
    for (index_t u = 0; u < unroll; ++u) {
      const V xv = V::load_unaligned(x + c + u * W);
      for (int r = 0; r < R; ++r) {
        if (u * W * index_t{sizeof(A)} % 64 == 0) prefetch_ahead(row + r * stride + c + u * W, ahead);
        part[r][u] = simd_detail::multiply_add(xv, V::load_unaligned(row + r * stride + c + u * W), part[r][u]);
      }
    }
  for (; c + W <= k; c += W) {
    const V xv = V::load_unaligned(x + c);
    for (int r = 0; r < R; ++r) part[r][0] = simd_detail::multiply_add(xv, V::load_unaligned(row + r * stride + c), part[r][0]);
  }
  for (int r = 0; r < R; ++r) {
    for (index_t u = 1; u < unroll; ++u) part[r][0] += part[r][u];
    A sum = xsimd::hadd(part[r][0]);
    for (index_t e = c; e < k; ++e) sum += x[e] * row[r * stride + e];
    out[r] = sum;
  }
}

// out[n] (=|+=) Σ_{k < depth} x[k] · w[n, k0 + k] for one panel of decoding
// panels (ops/decoding_panels.hpp): the panel read front to back (float16 and
// bfloat16 widened in registers), out in L1.
template <bool first, class A, class T>
void add_panel(const A* x, const T* panel, index_t blocks, A* out) noexcept {
  using V = vec<A>;
  using P = decoding_panels<T>;
  static_assert(P::width % V::size == 0, "a block of the panel holds whole vectors");
  V h[P::depth];
  DIFFTX_UNROLL(8)
  for (index_t r = 0; r < P::depth; ++r) h[r] = V(x[r]);
  for (index_t b = 0; b < blocks; ++b, panel += P::depth * P::width, out += P::width)
    DIFFTX_UNROLL(4)
    for (index_t v = 0; v < P::width; v += V::size) {
      V acc = first ? V(A(0)) : V::load_unaligned(out + v);
      DIFFTX_UNROLL(8)
      for (index_t r = 0; r < P::depth; ++r) acc = simd_detail::multiply_add(h[r], load_as_accum(panel + r * P::width + v), acc);
      acc.store_unaligned(out + v);
    }
}

// Decoding's y[M, N] = x[M, K] · w^T (M ≤ max_rows) on w's decoding panels:
// the panels stream once, in chunks of panel_chunk panels that the threads
// take as for_each_gemv_slice shares slices out (one forward stream per
// thread). Each chunk sums into a partial y of its own (N values of A, padded
// to whole blocks), and the partial y's are added in chunk order: the same
// bits for any number of threads. x's rows are copied (float16 and bfloat16:
// widened) and zero-padded to whole panels.
constexpr index_t panel_chunk = 32;
template <class T>
void panel_gemv(const policy::simd& p, index_t M, const T* x, const decoding_panels<T>& w, T* y) {
  using A = accum_t<T>;
  using P = decoding_panels<T>;
  const index_t N = w.rows, K = w.cols, blocks = w.blocks(), n_pad = blocks * P::width, panels = w.panels();
  const index_t chunks = (panels + panel_chunk - 1) / panel_chunk, x_size = panels * P::depth;
  auto& scratch = gemm_scratch<A>::local();  // the calling thread's: x's rows as A, the partial y's
  scratch.a.resize(static_cast<std::size_t>(M * x_size));
  scratch.c.resize(static_cast<std::size_t>(chunks * M * n_pad));
  A* const xp = scratch.a.data();
  A* const partial = scratch.c.data();
  for (index_t i = 0; i < M; ++i) {
    to_accum(x + i * K, K, xp + i * x_size);
    std::fill(xp + i * x_size + K, xp + (i + 1) * x_size, A(0));
  }
  for_each_gemv_slice(p, 1, chunks, 1, [&](index_t, index_t c, index_t) {
    const index_t p0 = c * panel_chunk, p1 = std::min(panels, p0 + panel_chunk);
    for (index_t i = 0; i < M; ++i) {
      A* const out = partial + (c * M + i) * n_pad;
      const A* const xi = xp + i * x_size;
      add_panel<true>(xi + p0 * P::depth, w.panel(p0), blocks, out);
      for (index_t q = p0 + 1; q < p1; ++q) add_panel<false>(xi + q * P::depth, w.panel(q), blocks, out);
    }
  });
  using V = vec<A>;
  for (index_t i = 0; i < M; ++i) {  // chunk 0's partial y += the others', in chunk order, then into y
    A* const sum = partial + i * n_pad;
    for (index_t c = 1; c < chunks; ++c) {
      const A* const add = partial + (c * M + i) * n_pad;
      for (index_t n = 0; n < n_pad; n += V::size)
        (V::load_unaligned(sum + n) + V::load_unaligned(add + n)).store_unaligned(sum + n);
    }
    from_accum(sum, N, y + i * N);
  }
}

// Decoding's products of float or double x[M, K] (M ≤ gemv_max_rows) with
// each part's w: its rows streamed two at a time or one at a time
// (streamed_dots; p.streaming_used()).
template <class T>
void float_gemv(const policy::simd& p, index_t M, index_t K, const T* x, std::span<const gemv_part<T>> parts) {
  const bool side_by_side = p.streaming_used() == policy::stream_order::rows_side_by_side;
  for_each_gemv_slice(p, M, parts, vec<T>::size, [&](const gemv_part<T>& part, index_t i, index_t j, index_t n) {
    const T* const w = part.w + j * K;
    T* const y = part.y + i * part.rows + j;
    index_t t = 0;
    if (side_by_side)
      for (; t + 2 <= n; t += 2) streamed_dots<2>(x + i * K, w + t * K, K, K, y + t);
    for (; t < n; ++t) streamed_dots<1>(x + i * K, w + t * K, K, K, y + t);
  });
}

// Whether y = x · wᵀ in T, x [M, K], streams w once as decoding's products do
// (else a matrix product): up to gemv_max_rows rows, and bfloat16 rows that
// AMX takes (several prompts decoded together).
template <class T>
bool decoding_streams(const policy::simd& p, index_t M, index_t K) noexcept {
  if constexpr (std::is_same_v<T, Eigen::bfloat16>)
    if (amx_gemv_takes(p, M, K)) return true;
  return M <= gemv_max_rows;
}

// Decoding's products of x[M, K] (decoding_streams) with each part's w,
// in any number type: float and double streamed (float_gemv); bfloat16 of
// more than gemv_max_rows rows on AMX where it takes them (gemv_amx_bf16.hpp);
// float16 and bfloat16 on the dot-product instruction where the policy's
// setting resolves to it (bf16_product.hpp), else converted in registers.
template <class T>
void decoding_gemv(const policy::simd& p, index_t M, index_t K, const T* x, std::span<const gemv_part<T>> parts) {
  if constexpr (std::is_same_v<T, accum_t<T>>) {
    float_gemv(p, M, K, x, parts);
  } else {
#if DIFFTX_AMX
    if constexpr (std::is_same_v<T, Eigen::bfloat16>)
      if (amx_gemv_takes(p, M, K)) return amx_bf16_gemv<amx_tile_unit>(p, M, K, x, parts);
#endif
#if DIFFTX_BF16_PAIRS
    if constexpr (std::is_same_v<T, Eigen::bfloat16>)
      if (p.bf16_decoding_product_used() == policy::bf16_product::dot_instructions)
        return bf16_pair_gemv<avx512_bf16_pairs>(p, M, K, x, parts);
#endif
    reduced_gemv(p, M, K, x, parts);
  }
}

// y[M, N] = x[M, K] · w[N, K]^T; packed: w's packed copy for oneDNN, or nullptr.
template <class T>
void float_linear_forward(const policy::simd& p, cview<T, 2> x, cview<T, 2> w,
                          const policy::simd::packed_weights* packed, TensorView<T, 2> y) {
  using A = accum_t<T>;
  detail::check_linear("linear_forward", memory_space::host, x, w, y, "y");
  const index_t M = x.extent(0), K = x.extent(1), N = w.extent(0);
  if (decoding_streams<T>(p, M, K)) {
    const gemv_part<T> part{w.data(), N, y.data()};
    return decoding_gemv(p, M, K, x.data(), std::span(&part, 1));
  }
  if (onednn_linear_forward(p, x, w, y, packed)) return;
  if constexpr (!std::is_same_v<T, A>) {
    reduced_gemm<a_storage::rows, b_storage::columns>(p, M, N, K, x.data(), K, w.data(), K, y.data(), N, false);
  } else {
    matrix_map<A> Y(y.data(), M, N);
    const const_matrix_map<A> X(x.data(), M, K), W(w.data(), N, K);
    parallel_blocks(M, N, thread_count(p), [&](index_t r0, index_t r1, index_t c0, index_t c1) {
      Y.block(r0, c0, r1 - r0, c1 - c0).noalias() = X.middleRows(r0, r1 - r0) * W.middleRows(c0, c1 - c0).transpose();
    });
  }
}

}  // namespace simd_detail

// y[M, N] = x[M, K] · w[N, K]^T
template <class T>
  requires supported_by<policy::simd, T>
void linear_forward(const policy::simd& p, cview<T, 2> x, cview<T, 2> w, TensorView<T, 2> y) {
  simd_detail::float_linear_forward(p, x, w, nullptr, y);
}

#if defined(DIFFTX_ONEDNN)
// The same with w also packed (pack_weights, linear_onednn.hpp).
template <class T>
  requires supported_by<policy::simd, T>
void linear_forward(const policy::simd& p, cview<T, 2> x, cview<T, 2> w, const policy::simd::packed_weights& packed,
                    TensorView<T, 2> y) {
  simd_detail::check_packed<T>("linear_forward", packed, w.extent(0), w.extent(1));
  simd_detail::float_linear_forward(p, x, w, &packed, y);
}
#endif

// y[M, N] = x[M, K] · w^T with w as decoding panels (M ≤ max_rows)
template <class T>
  requires supported_by<policy::simd, T>
void linear_forward(const policy::simd& p, cview<T, 2> x, const decoding_panels<T>& w, TensorView<T, 2> y) {
  detail::check_linear_panels("linear_forward", memory_space::host, x, w, y);
  simd_detail::panel_gemv(p, x.extent(0), x.data(), w, y.data());
}

// dx[M, K] (=|+=) dy[M, N] · w[N, K];  dw[N, K] += dy^T · x
template <class T>
  requires supported_by<policy::simd, T>
void linear_backward(const policy::simd& p, cview<T, 2> x, cview<T, 2> w, cview<T, 2> dy, TensorView<T, 2> dx,
                     TensorView<T, 2> dw, write_mode dx_mode = write_mode::assign) {
  using namespace simd_detail;
  using A = accum_t<T>;
  constexpr std::string_view where = "linear_backward";
  detail::check_linear_backward(where, memory_space::host, x, w, dy, dx, dw);
  const index_t M = x.extent(0), K = x.extent(1), N = w.extent(0);
  const bool dx_add = dx_mode == write_mode::add;
  const int threads = thread_count(p);
  if (!onednn_input_gradient(p, w, dy, dx, dx_add)) {
    if constexpr (!std::is_same_v<T, A>) {
      reduced_gemm<a_storage::rows, b_storage::rows>(p, M, K, N, dy.data(), N, w.data(), K, dx.data(), K, dx_add);
    } else {
      const const_matrix_map<A> W(w.data(), N, K), DY(dy.data(), M, N);
      matrix_map<A> DX(dx.data(), M, K);
      parallel_blocks(M, K, threads, [&](index_t r0, index_t r1, index_t c0, index_t c1) {
        auto block = DX.block(r0, c0, r1 - r0, c1 - c0);
        const auto product = DY.middleRows(r0, r1 - r0) * W.middleCols(c0, c1 - c0);
        if (dx_add)
          block.noalias() += product;
        else
          block.noalias() = product;
      });
    }
  }
  if (!onednn_weight_gradient(p, x, dy, dw)) {
    if constexpr (!std::is_same_v<T, A>) {
      reduced_gemm<a_storage::columns, b_storage::rows>(p, N, K, M, dy.data(), N, x.data(), K, dw.data(), K, true);
    } else {
      const const_matrix_map<A> X(x.data(), M, K), DY(dy.data(), M, N);
      matrix_map<A> DW(dw.data(), N, K);
      parallel_blocks(N, K, threads, [&](index_t r0, index_t r1, index_t c0, index_t c1) {
        DW.block(r0, c0, r1 - r0, c1 - c0).noalias() +=
            DY.middleCols(r0, r1 - r0).transpose() * X.middleCols(c0, c1 - c0);
      });
    }
  }
}

}  // namespace difftx
