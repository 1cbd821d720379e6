// How the float16/bfloat16 matrix products (gemm.hpp, gemm_bf16_pairs.hpp)
// split C[M, N] (=|+=) A[M, K] · B[K, N] over threads: each thread owns
// blocks of C, accumulates one block at a time in float in its own buffer,
// and rounds it back to T once. What differs between the products is how a
// block's A · B is packed and multiplied, which the caller passes in.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "difftx/policy/simd/common.hpp"

namespace difftx::simd_detail {

// How A[M, K] is stored: a[i·lda + p] (rows) or a[p·lda + i] (columns, i.e. Aᵀ row-major).
enum class a_storage { rows, columns };
// How B[K, N] is stored: b[p·ldb + j] (rows) or b[j·ldb + p] (columns, i.e. Bᵀ row-major).
enum class b_storage { rows, columns };

// Blocks: C's block_rows x block_cols block stays in L2 across the depth loop
// (32 KB as float); so do the slices of A and B that the kernels sweep.
constexpr index_t block_rows = 66, block_cols = 128;

// The per-thread buffers: they outlive the call, so that repeated products
// (every decode step, every layer) do not allocate and fault in fresh pages
// every time.
template <class E>
struct gemm_scratch {
  aligned_vector<E> a, b, c;
  static gemm_scratch& local() {
    thread_local gemm_scratch scratch;
    return scratch;
  }
};

// Runs C's blocks on the policy's threads. For each block (rows [i0, i0 + m),
// columns [j0, j0 + n)) the float accumulator cb[m][n_pad] (n rounded up to
// col_align, the padding never stored) starts as zero or as C, then
// add_product(i0, j0, m, n, n_pad, cb) adds the block's A · B into it.
template <class T, class AddProduct>
void for_each_c_block(const policy::simd& p, index_t M, index_t N, index_t col_align, T* c, index_t ldc,
                      bool accumulate, AddProduct&& add_product) {
  using A = accum_t<T>;
  if (M == 0 || N == 0) return;
  const index_t row_blocks = (M + block_rows - 1) / block_rows, col_blocks = (N + block_cols - 1) / block_cols;
  const index_t blocks = row_blocks * col_blocks;
  const int threads = static_cast<int>(std::min<index_t>(thread_count(p), blocks));

#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (threads > 1)
  for (index_t block = 0; block < blocks; ++block) {
    auto& scratch = gemm_scratch<A>::local();
    const index_t i0 = block / col_blocks * block_rows, j0 = block % col_blocks * block_cols;
    const index_t m = std::min(block_rows, M - i0), n = std::min(block_cols, N - j0);
    const index_t n_pad = (n + col_align - 1) / col_align * col_align;
    scratch.c.resize(static_cast<std::size_t>(block_rows * (block_cols + col_align)));
    A* cb = scratch.c.data();
    for (index_t i = 0; i < m; ++i) {  // padded columns too: the kernels update them
      std::fill(cb + i * n_pad, cb + (i + 1) * n_pad, A(0));
      if (accumulate) to_accum(c + (i0 + i) * ldc + j0, n, cb + i * n_pad);
    }
    add_product(i0, j0, m, n, n_pad, cb);
    for (index_t i = 0; i < m; ++i) from_accum(cb + i * n_pad, n, c + (i0 + i) * ldc + j0);
  }
}

// A run of slices [front, back) shared between threads: its owner takes
// slices one at a time from the front, others take several at a time from
// the back. Both ends live in one atomic word.
class slice_run {
 public:
  void assign(index_t front, index_t back) noexcept { ends_.store(pack(front, back), std::memory_order_relaxed); }
  index_t left() const noexcept {
    const auto e = ends_.load(std::memory_order_relaxed);
    return back_of(e) - front_of(e);
  }
  // The front slice, or -1 when none is left.
  index_t take_front() noexcept {
    auto e = ends_.load(std::memory_order_relaxed);
    do {
      if (front_of(e) >= back_of(e)) return -1;
    } while (!ends_.compare_exchange_weak(e, pack(front_of(e) + 1, back_of(e)), std::memory_order_relaxed));
    return front_of(e);
  }
  // Up to `count` slices from the back, [s0, s1); empty when none is left.
  std::pair<index_t, index_t> take_back(index_t count) noexcept {
    auto e = ends_.load(std::memory_order_relaxed);
    index_t s0 = 0;
    do {
      s0 = std::max(front_of(e), back_of(e) - count);
      if (s0 >= back_of(e)) return {0, 0};
    } while (!ends_.compare_exchange_weak(e, pack(front_of(e), s0), std::memory_order_relaxed));
    return {s0, back_of(e)};
  }

 private:
  static std::uint64_t pack(index_t front, index_t back) noexcept {
    return static_cast<std::uint64_t>(front) << 32 | static_cast<std::uint32_t>(back);
  }
  static index_t front_of(std::uint64_t e) noexcept { return static_cast<index_t>(e >> 32); }
  static index_t back_of(std::uint64_t e) noexcept { return static_cast<index_t>(e & 0xffffffffu); }
  alignas(64) std::atomic<std::uint64_t> ends_{0};  // a line of its own: the owner writes it per slice
};

// Decoding's y[M, N] = x[M, K] · w[N, K]ᵀ for a few rows of x: nothing to
// reuse a packed copy of w for, so w streams once, straight from memory.
// row_dots(i, j, rows) writes out[i·N + j + t] for t < rows ≤ slice, the dot
// products of x's row i with w's rows j + t; w's slice of rows stays in
// cache for every row of x.
//
// Each thread owns an equal run of slices and reads it front to back, one
// forward stream; a thread whose run is done takes a quarter of what is left
// from the back of the run with the most left, until none is. The two
// threads of a 2-core VM do not read at the same rate (one 5-10% slower for
// a whole process, either one): guided scheduling, which hands out half the
// rows first, left the faster thread waiting at the end of the products for
// 1.5 to 7 ms of a 45-70 ms bfloat16 decode step of the 1B checkpoint; with
// runs taken from the back, 0.2 to 1.2 ms.
//
// Several products of the same rows of x (decoding's q, k and v; gate and
// up) run as one: part k's w has part_rows[k] rows, row_dots(k, i, j, rows),
// and the slices of all parts are one run, so one parallel region and one
// wait at its end instead of one per product.
constexpr index_t gemv_max_rows = 4;

// One of the products: w's `rows` rows of depth K (as stored), into y[M, rows].
template <class T>
struct gemv_part {
  const T* w;
  index_t rows;
  T* y;
};

template <class RowDots>
void for_each_gemv_slice(const policy::simd& p, index_t M, std::span<const index_t> part_rows, index_t slice,
                         RowDots&& row_dots) {
  std::vector<index_t> first{0};  // part k's slices are [first[k], first[k + 1])
  for (const index_t rows : part_rows) first.push_back(first.back() + (rows + slice - 1) / slice);
  const index_t slices = first.back();
  const int threads = static_cast<int>(std::min<index_t>(thread_count(p), slices));
  auto run_slices = [&](index_t s0, index_t s1) {
    std::size_t k = 0;
    for (index_t s = s0; s < s1; ++s) {
      while (s >= first[k + 1]) ++k;
      const index_t j = (s - first[k]) * slice, rows = std::min(slice, part_rows[k] - j);
      for (index_t i = 0; i < M; ++i) row_dots(k, i, j, rows);
    }
  };
  if (threads <= 1) return run_slices(0, slices);
  std::vector<slice_run> runs(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    const auto [first_slice, last_slice] = share_of(slices, t, threads);
    runs[static_cast<std::size_t>(t)].assign(first_slice, last_slice);
  }
  fork(threads, [&](int t, int) {
    slice_run& own = runs[static_cast<std::size_t>(t)];
    for (index_t s; (s = own.take_front()) >= 0;) run_slices(s, s + 1);
    for (;;) {
      slice_run* most = nullptr;  // (a team smaller than asked for leaves runs without an owner: taken here too)
      index_t most_left = 0;
      for (auto& r : runs)
        if (const index_t left = r.left(); left > most_left) {
          most = &r;
          most_left = left;
        }
      if (!most) break;
      const auto [s0, s1] = most->take_back(std::max<index_t>(1, most_left / 4));
      run_slices(s0, s1);
    }
  });
}

// Over gemv_parts: row_dots(part, i, j, rows).
template <class T, class RowDots>
void for_each_gemv_slice(const policy::simd& p, index_t M, std::span<const gemv_part<T>> parts, index_t slice,
                         RowDots&& row_dots) {
  std::vector<index_t> rows;
  for (const auto& part : parts) rows.push_back(part.rows);
  for_each_gemv_slice(p, M, std::span<const index_t>(rows), slice,
                      [&](std::size_t k, index_t i, index_t j, index_t n) { row_dots(parts[k], i, j, n); });
}

// One product: row_dots(i, j, rows).
template <class RowDots>
void for_each_gemv_slice(const policy::simd& p, index_t M, index_t N, index_t slice, RowDots&& row_dots) {
  const index_t rows[] = {N};
  for_each_gemv_slice(p, M, std::span<const index_t>(rows), slice,
                      [&](std::size_t, index_t i, index_t j, index_t n) { row_dots(i, j, n); });
}

}  // namespace difftx::simd_detail
