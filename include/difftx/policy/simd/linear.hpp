// simd linear forward/backward (shapes in difftx/ops/linear.hpp): Eigen GEMMs,
// the output split into blocks over OpenMP threads (Eigen runs each block on
// one thread inside a parallel region). float16/bfloat16 operands are converted
// to float for the product and the result rounded back once.
#pragma once

#include <vector>

#include <Eigen/Core>

#include "difftx/ops/linear.hpp"
#include "difftx/policy/simd/common.hpp"

namespace difftx {

namespace simd_detail {

template <class A>
using row_matrix = Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class A>
using matrix_map = Eigen::Map<row_matrix<A>>;
template <class A>
using const_matrix_map = Eigen::Map<const row_matrix<A>>;

// A [rows, cols] operand as the accumulation type: mapped in place or converted.
template <class T>
struct accum_matrix {
  using A = accum_t<T>;
  std::vector<A> storage;
  const A* data;
  accum_matrix(const T* source, index_t rows, index_t cols) {
    if constexpr (std::is_same_v<T, A>) {
      data = source;
    } else {
      storage.resize(static_cast<std::size_t>(rows * cols));
      to_accum(source, rows * cols, storage.data());
      data = storage.data();
    }
  }
  const_matrix_map<A> map(index_t rows, index_t cols) const { return {data, rows, cols}; }
};

// Eigen built with OpenMP threads a GEMM itself when omp_get_max_threads() > 1
// and the calling team has one thread, which is every block of a one-part
// split: a second split inside ours, slower than one thread (it packs for
// threads it does not get). Setting the count inside our region changes only
// this region's implicit task, never the caller's setting.
inline void single_threaded_eigen() noexcept {
#if defined(_OPENMP)
  omp_set_num_threads(1);
#endif
}

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
    single_threaded_eigen();
    const index_t begin = extent * part / parts, end = extent * (part + 1) / parts;
    if (by_rows)
      block(begin, end, index_t{0}, cols);
    else
      block(index_t{0}, rows, begin, end);
  }
}

}  // namespace simd_detail

// y[M, N] = x[M, K] · w[N, K]^T
template <class T>
  requires supported_by<policy::simd, T>
void linear_forward(const policy::simd& p, cview<T, 2> x, cview<T, 2> w, TensorView<T, 2> y) {
  using namespace simd_detail;
  using A = accum_t<T>;
  constexpr std::string_view where = "linear_forward";
  detail::check_linear(where, memory_space::host, x, w, y, "y");
  const index_t M = x.extent(0), K = x.extent(1), N = w.extent(0);
  const accum_matrix<T> xa(x.data(), M, K), wa(w.data(), N, K);
  std::vector<A> y_storage(std::is_same_v<T, A> ? 0 : static_cast<std::size_t>(M * N));
  A* y_data = std::is_same_v<T, A> ? reinterpret_cast<A*>(y.data()) : y_storage.data();
  matrix_map<A> Y(y_data, M, N);
  const auto X = xa.map(M, K);
  const auto W = wa.map(N, K);
  parallel_blocks(M, N, thread_count(p), [&](index_t r0, index_t r1, index_t c0, index_t c1) {
    Y.block(r0, c0, r1 - r0, c1 - c0).noalias() = X.middleRows(r0, r1 - r0) * W.middleRows(c0, c1 - c0).transpose();
  });
  if constexpr (!std::is_same_v<T, A>) from_accum(y_data, M * N, y.data());
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
  const int threads = thread_count(p);
  const accum_matrix<T> xa(x.data(), M, K), wa(w.data(), N, K), dya(dy.data(), M, N);
  const auto X = xa.map(M, K);
  const auto W = wa.map(N, K);
  const auto DY = dya.map(M, N);

  // Gradients that accumulate (dw always, dx with write_mode::add) are read in A.
  auto accumulate_into = [&](TensorView<T, 2> target, index_t rows, index_t cols, bool add, auto&& product) {
    std::vector<A> storage;
    A* data;
    if constexpr (std::is_same_v<T, A>) {
      data = reinterpret_cast<A*>(target.data());
    } else {
      storage.resize(static_cast<std::size_t>(rows * cols));
      if (add) to_accum(target.data(), rows * cols, storage.data());
      data = storage.data();
    }
    matrix_map<A> out(data, rows, cols);
    parallel_blocks(rows, cols, threads, [&](index_t r0, index_t r1, index_t c0, index_t c1) {
      auto block = out.block(r0, c0, r1 - r0, c1 - c0);
      if (add)
        block.noalias() += product(r0, r1, c0, c1);
      else
        block.noalias() = product(r0, r1, c0, c1);
    });
    if constexpr (!std::is_same_v<T, A>) from_accum(data, rows * cols, target.data());
  };
  accumulate_into(dx, M, K, dx_mode == write_mode::add, [&](index_t r0, index_t r1, index_t c0, index_t c1) {
    return DY.middleRows(r0, r1 - r0) * W.middleCols(c0, c1 - c0);
  });
  accumulate_into(dw, N, K, true, [&](index_t r0, index_t r1, index_t c0, index_t c1) {
    return DY.middleCols(r0, r1 - r0).transpose() * X.middleCols(c0, c1 - c0);
  });
}

}  // namespace difftx
