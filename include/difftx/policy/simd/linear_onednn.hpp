// Linear's products on oneDNN's matmul (onednn_matmul.hpp) where policy::simd
// takes it (matmuls, onednn_takes); each returns false, having written
// nothing, where it does not, and linear.hpp computes the product itself.
// Only for a build that links oneDNN (DIFFTX_ONEDNN; onednn_products.hpp
// chooses between this file and linear_without_onednn.hpp).
//   forward        y[M, N] = x[M, K] · w[N, K]ᵀ
//   input gradient dx[M, K] (=|+=) dy[M, N] · w[N, K]
//   weight gradient dw[N, K] += dy[M, N]ᵀ · x[M, K]
//   int8 weights   sums[M, N] = x8[M, K] · w8[N, K]ᵀ exactly in int32, the
//                  products of linear_int8.hpp (gemm_int8.hpp's own elsewhere)
// The forward products may read w packed (policy::simd::packed_weights,
// pack_weights below; Linear::add_packed_weights).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "difftx/ops/int8.hpp"
#include "difftx/ops/linear.hpp"
#include "difftx/policy/simd/common.hpp"
#include "difftx/policy/simd/gemm_int8.hpp"
#include "difftx/policy/simd/onednn_matmul.hpp"

namespace difftx::simd_detail {

// Whether automatic takes oneDNN for T: where its kernels were measured faster
// than difftx's own products (docs/benchmarks.md, "Linear's products against
// oneDNN and PyTorch"): float and bfloat16 on Zen 4 (brgemm on AVX-512 and
// AVX512_BF16) and on an AMX Xeon. float16 (kernels only with AVX512_FP16)
// has not been measured: forced only.
// int8 weights' products (T = std::int8_t) were measured on Zen 4 (oneDNN's
// u8·s8 brgemm on AVX512_VNNI); on an AMX Xeon oneDNN picks AMX-INT8 itself;
// CPUs without VNNI never take them (onednn_int8_exact).
template <class T>
constexpr bool onednn_measured_faster() {
  return std::is_same_v<T, float> || std::is_same_v<T, Eigen::bfloat16> || std::is_same_v<T, std::int8_t>;
}
// Below this many rows difftx's int8 kernels were measured faster than
// oneDNN's on Zen 4 (docs/design.md, "oneDNN's matmul"): automatic keeps them,
// unless the weights are packed for oneDNN, which then was the faster.
inline constexpr index_t onednn_int8_min_rows = 32;

// The types of oneDNN's product for Linear in T (std::int8_t: int8 weights).
template <class T>
constexpr matmul_types onednn_types() {
  if constexpr (std::is_same_v<T, std::int8_t>) return int8_products_types;
  else return matmul_types::all(onednn_type<T>());
}

// The rows of a prefill or training product, for asking what such a product runs on.
inline constexpr index_t many_rows = 4096;
// The columns of int8 weights packed for oneDNN in one block, whose int32
// sums onednn_int8_products holds for a chunk of rows at a time.
inline constexpr index_t int8_packed_columns = 4096;

// Whether oneDNN multiplies a product of M rows in T (std::int8_t: int8
// weights) under p: never decoding's few rows (difftx's GEMV streams the
// weights once), never without the library, int8 only where its sums are
// exact. weights_packed: they are packed for oneDNN (pack_weights).
template <class T>
bool onednn_takes(const policy::simd& p, index_t M, bool weights_packed = false) {
  if constexpr (onednn_computes<T> || std::is_same_v<T, std::int8_t>) {
    using library = policy::simd::matmul_library;
    if (M <= gemv_max_rows || p.matmuls == library::difftx) return false;
    if constexpr (std::is_same_v<T, std::int8_t>) {
      if (!onednn_int8_exact()) return false;  // forced too: difftx's int8 kernels are exact everywhere
      if (p.matmuls == library::automatic && M < onednn_int8_min_rows && !weights_packed) return false;
    }
    return p.matmuls == library::onednn || onednn_measured_faster<T>();
  }
  return false;
}

}  // namespace difftx::simd_detail

template <class T>
std::string difftx::policy::simd::matmul_kernel() const {
  if (simd_detail::onednn_takes<T>(*this, simd_detail::many_rows))
    if (const auto kernel = simd_detail::onednn_matmuls::instance().implementation(simd_detail::onednn_types<T>(),
                                                                                   simd_detail::thread_count(*this));
        !kernel.empty())
      return "onednn " + kernel;
  return "";
}

// W [N, K] (or int8 rows [N, padded K]) in oneDNN's layout, in blocks of
// block_columns columns: all of N for float types; int8 weights in blocks of
// int8_packed_columns, as their products hold the int32 sums a block at a time.
struct difftx::policy::simd::packed_weights {
  index_t rows, cols;  // W's N and K (int8: its padded K)
  index_t block_columns;
  std::vector<simd_detail::onednn_packed_matrix> blocks;
  std::size_t bytes() const {
    std::size_t total = 0;
    for (const auto& block : blocks) total += block.bytes();
    return total;
  }
};

namespace difftx {

// w also in the layout oneDNN's matmul reads, for the forward products it
// takes under p: it then reads that copy rather than copying w into the layout
// on every call. nullptr where oneDNN takes no product of w's type, or reads w
// as it lies.
template <class T>
  requires simd_detail::onednn_computes<T>
std::shared_ptr<const policy::simd::packed_weights> pack_weights(const policy::simd& p, TensorView<const T, 2> w) {
  using namespace simd_detail;
  if (!onednn_takes<T>(p, many_rows)) return nullptr;
  const index_t N = w.extent(0), K = w.extent(1);
  auto packed = onednn_matmuls::instance().pack(onednn_types<T>(), N, K, {w.data(), 1, K}, thread_count(p));
  if (!packed) return nullptr;
  return std::make_shared<const policy::simd::packed_weights>(
      policy::simd::packed_weights{N, K, N, {std::move(*packed)}});
}

// The same for int8 weights, in blocks of int8_packed_columns.
template <class A>
std::shared_ptr<const policy::simd::packed_weights> pack_weights(const policy::simd& p, const int8_rows<A>& w) {
  using namespace simd_detail;
  if (!onednn_takes<std::int8_t>(p, many_rows)) return nullptr;
  policy::simd::packed_weights packed{w.rows, w.padded, int8_packed_columns, {}};
  for (index_t j0 = 0; j0 < w.rows; j0 += int8_packed_columns) {
    auto block = onednn_matmuls::instance().pack(int8_products_types, std::min(int8_packed_columns, w.rows - j0),
                                                 w.padded, {w.row(j0), 1, w.padded}, thread_count(p));
    if (!block) return nullptr;
    packed.blocks.push_back(std::move(*block));
  }
  return std::make_shared<const policy::simd::packed_weights>(std::move(packed));
}

}  // namespace difftx

namespace difftx::simd_detail {

// Throws input_error unless packed is what pack_weights makes of a weight of
// N x K (int8: K padded) in T (std::int8_t: int8 rows).
template <class T>
void check_packed(std::string_view where, const policy::simd::packed_weights& packed, index_t N, index_t K) {
  const auto name = [](index_t rows, index_t cols) {
    return "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
  };
  require(packed.rows == N && packed.cols == K, where, "packed",
          std::string(std::is_same_v<T, std::int8_t> ? "int8 rows (K padded)" : "w") + " packed, " + name(N, K),
          name(packed.rows, packed.cols));
  const index_t width = std::max<index_t>(packed.block_columns, 1);
  const auto expected = onednn_types<T>();
  bool made_for_w = packed.block_columns > 0 && packed.blocks.size() == static_cast<std::size_t>((N + width - 1) / width);
  for (std::size_t b = 0; made_for_w && b < packed.blocks.size(); ++b) {
    const auto& block = packed.blocks[b];
    made_for_w = block.types.a == expected.a && block.types.b == expected.b && block.types.c == expected.c &&
                 block.K == K && block.N == std::min(width, N - static_cast<index_t>(b) * width);
  }
  const auto what = [] {
    if constexpr (std::is_same_v<T, std::int8_t>) return std::string("int8 rows");
    else return std::string(scalar_traits<T>::name) + " weights";
  };
  require(made_for_w, where, "packed", "blocks packed by pack_weights from " + what(), "blocks of another type or shape");
}

// packed: w's packed copy, or nullptr; oneDNN reads it where it has a kernel
// for the product on that layout, else w.
template <class T>
bool onednn_linear_forward(const policy::simd& p, cview<T, 2> x, cview<T, 2> w, TensorView<T, 2> y,
                           const policy::simd::packed_weights* packed = nullptr) {
  if constexpr (onednn_computes<T>) {
    const index_t M = x.extent(0), K = x.extent(1), N = w.extent(0);
    if (!onednn_takes<T>(p, M)) return false;
    auto& matmuls = onednn_matmuls::instance();
    if (packed && matmuls.run(M, {x.data(), K, 1}, packed->blocks.front(), y.data(), N, false, thread_count(p)))
      return true;
    return matmuls.run(onednn_types<T>(), M, N, K, {x.data(), K, 1}, {w.data(), 1, K}, y.data(), N, false,
                       thread_count(p));
  }
  return false;
}

template <class T>
bool onednn_input_gradient(const policy::simd& p, cview<T, 2> w, cview<T, 2> dy, TensorView<T, 2> dx, bool add) {
  if constexpr (onednn_computes<T>) {
    const index_t M = dy.extent(0), N = dy.extent(1), K = w.extent(1);
    if (onednn_takes<T>(p, M))
      return onednn_matmuls::instance().run(onednn_types<T>(), M, K, N, {dy.data(), N, 1}, {w.data(), K, 1}, dx.data(),
                                            K, add, thread_count(p));
  }
  return false;
}

template <class T>
bool onednn_weight_gradient(const policy::simd& p, cview<T, 2> x, cview<T, 2> dy, TensorView<T, 2> dw) {
  if constexpr (onednn_computes<T>) {
    const index_t M = x.extent(0), K = x.extent(1), N = dy.extent(1);
    if (onednn_takes<T>(p, M))
      return onednn_matmuls::instance().run(onednn_types<T>(), N, K, M, {dy.data(), 1, N}, {x.data(), K, 1}, dw.data(),
                                            K, true, thread_count(p));
  }
  return false;
}

// The int8 sums of onednn_int8_products below over blocks of `width` columns
// and `chunk` rows: product(i0, rows, j0, n, sums) writes a block's sums
// (false where oneDNN has no kernel for it), which then go to store less the
// offset, the block's rows on the policy's threads.
template <class A, class Product, class Store>
bool onednn_int8_blocks(int threads, const int8_rows<A>& b, index_t M, index_t chunk, index_t width, Product&& product,
                        Store&& store) {
  const index_t N = b.rows;
  aligned_vector<std::int32_t> sums(static_cast<std::size_t>(std::min(chunk, M) * std::min(width, N)));
  for (index_t i0 = 0; i0 < M; i0 += chunk)
    for (index_t j0 = 0; j0 < N; j0 += width) {
      const index_t rows = std::min(chunk, M - i0), n = std::min(width, N - j0);
      if (!product(i0, rows, j0, n, sums.data())) return false;
#pragma omp parallel for num_threads(threads) schedule(static)
      for (index_t i = 0; i < rows; ++i) {
        std::int32_t* row = sums.data() + i * n;
        remove_unsigned_offset(row, b, j0, n);
        store(i0 + i, j0, n, static_cast<const std::int32_t*>(row));
      }
    }
  return true;
}

// The exact int8 sums of a's rows with b's (same padding) on oneDNN, handed to
// store(i, j0, n, sums) as gemm_int8.hpp's int8_products hands them: in blocks
// of 16 MiB of sums (columns as many as fit M rows, at least 64; with b
// packed, its blocks' columns and as many rows as fit), each block's rows
// stored on the policy's threads. a goes in offset to unsigned bytes (a + 128,
// u8 · s8: the products x86's int8 instructions make, vpdpbusd and AMX's
// tdpbusd) and each sum comes out less 128·Σ_p b[j, p] (gemm_int8.hpp's
// helpers for both). packed: b's packed copy (pack_weights), or nullptr;
// oneDNN reads it where it has a kernel for the product on that layout, else
// b. False where oneDNN does not take the product; then, or if a block has no
// kernel, the caller's int8_products computes every sum again.
template <class A, class Store>
bool onednn_int8_products(const policy::simd& p, const int8_rows<A>& a, const int8_rows<A>& b, Store&& store,
                          const policy::simd::packed_weights* packed = nullptr) {
  const index_t M = a.rows, N = b.rows, kp = a.padded;
  if (!onednn_takes<std::int8_t>(p, M, packed != nullptr)) return false;
  const int threads = thread_count(p);
  const auto offset = offset_to_unsigned(p, a);
  auto& matmuls = onednn_matmuls::instance();
  constexpr index_t block_sums = index_t{4} << 20;
  if (packed) {
    const index_t width = packed->block_columns;
    const auto from_packed = [&](index_t i0, index_t rows, index_t j0, index_t n, std::int32_t* sums) {
      return matmuls.run(rows, {offset.data() + i0 * kp, kp, 1}, packed->blocks[static_cast<std::size_t>(j0 / width)],
                         sums, n, false, threads);
    };
    if (onednn_int8_blocks(threads, b, M, block_sums / width, width, from_packed, store)) return true;
    if (!onednn_takes<std::int8_t>(p, M)) return false;  // the rows difftx's kernels take unpacked
  }
  const auto from_rows = [&](index_t i0, index_t rows, index_t j0, index_t n, std::int32_t* sums) {
    return matmuls.run(int8_products_types, rows, n, kp, {offset.data() + i0 * kp, kp, 1}, {b.row(j0), 1, kp}, sums,
                       n, false, threads);
  };
  return onednn_int8_blocks(threads, b, M, M, std::min(N, std::max<index_t>(64, block_sums / M / 64 * 64)), from_rows,
                            store);
}

}  // namespace difftx::simd_detail
