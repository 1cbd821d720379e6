// Integer dot products of int8 rows on the CPU: C[i, j] = Σ_p A[i, p] · B[j, p]
// exactly, in int32, for A and B stored as int8_rows (ops/int8.hpp: rows of
// int8 padded with zeros to whole 64-byte vectors). The int8 Linear (y = x·wᵀ
// with both quantized) and the int8 attention (Q·Kᵀ) are built on it.
//
// Kernels, chosen at run time once per process (int8_dot_kernel), all giving
// the same exact sums:
//  - avx512_vnni_int8: vpdpbusd (AVX512_VNNI: Ice Lake, Sapphire Rapids, Zen 4
//    and later) adds four u8·s8 products into each int32 lane. A is offset to
//    unsigned (a + 128, a byte's top bit flipped) and the sum corrected by
//    128·Σ_p B[j, p] (int8_rows::sums), so both operands stream as bytes.
//  - avx2_int8: vpmaddubsw on |a| and sign(a)·b (each pair of products at most
//    2·127·127, below int16's limit: the values are in [-127, 127]), vpmaddwd
//    to int32. Every x86-64 CPU difftx targets (Haswell, Zen 1 and later).
//  - portable_int8: plain C++, elsewhere.
// AVX-VNNI (the VEX form of vpdpbusd on CPUs without AVX-512) is not among
// them: no machine at hand has it, and a path that never ran stays out.
//
// Products: int32 sums are exact while K·127² < 2^31 (K <= 133144; Linear
// checks); vpdpbusd's lanes wrap on the way, which the correction undoes
// modulo 2^32. Blocking: B in blocks of 64 rows (64 KB at K = 1024, in L2)
// against every row of A, R rows of A x 4 rows of B per micro-kernel call;
// decoding's few rows of A against slices of 16 rows of B (int8_gemv_with).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "difftx/ops/int8.hpp"
#include "difftx/policy/simd/common.hpp"
#include "difftx/policy/simd/gemm_blocks.hpp"
#include "difftx/policy/simd/stream_prefetch.hpp"

// 1 where the x86 kernels are compiled in (GCC or clang on x86-64, not the
// MSVC ABI, as DIFFTX_BF16_PAIRS); -DDIFFTX_INT8_DOTS=0 leaves them out.
#if !defined(DIFFTX_INT8_DOTS)
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(_MSC_VER)
#define DIFFTX_INT8_DOTS 1
#else
#define DIFFTX_INT8_DOTS 0
#endif
#endif

namespace difftx::simd_detail {

// The kernel interface: out[r·ldo + c] = Σ_p a[r·lda + p] · b[c·ldb + p] for
// r < R <= rows, c < C <= 4, p < kp (a multiple of 64), a offset by 128 where
// offset_a says so (then the sum is raw: the driver corrects it). Streamed:
// b's rows are read once, from memory (decoding), every line of them
// prefetched whole groups of C rows ahead (stream_prefetch.hpp).
struct portable_int8 {
  static constexpr const char* name = "portable";
  static constexpr int rows = 4;
  static constexpr bool offset_a = false;
  template <int R, int C, bool Streamed = false>
  static void dots(index_t kp, const std::int8_t* a, index_t lda, const std::int8_t* b, index_t ldb, std::int32_t* out,
                   index_t ldo) noexcept {
    const stream_distance ahead = Streamed ? stream_ahead(C * ldb) : stream_distance{};  // only streamed dots ask ahead
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) {
        std::int32_t s = 0;
        for (index_t p = 0; p < kp; ++p) {
          if (Streamed && r == 0 && p % 64 == 0) prefetch_ahead(b + c * ldb + p, ahead);
          s += std::int32_t{a[r * lda + p]} * std::int32_t{b[c * ldb + p]};
        }
        out[r * ldo + c] = s;
      }
  }
};

#if DIFFTX_INT8_DOTS
struct avx2_int8 {
  static constexpr const char* name = "avx2";
  static constexpr int rows = 2;  // 8 accumulators, 4 of B, |a|, a, ones: 15 of the 16 registers
  static constexpr bool offset_a = false;
  template <int R, int C, bool Streamed = false>
  [[gnu::target("avx2")]] static void dots(index_t kp, const std::int8_t* a, index_t lda, const std::int8_t* b,
                                           index_t ldb, std::int32_t* out, index_t ldo) noexcept {
    const __m256i ones = _mm256_set1_epi16(1);
    const stream_distance ahead = Streamed ? stream_ahead(C * ldb) : stream_distance{};  // only streamed dots ask ahead
    __m256i acc[R][C];
    for (auto& row : acc)
      for (auto& x : row) x = _mm256_setzero_si256();
    for (index_t p = 0; p < kp; p += 32) {
      __m256i bv[C];
      for (int c = 0; c < C; ++c) {
        if (Streamed && p % 64 == 0) prefetch_ahead(b + c * ldb + p, ahead);
        bv[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + c * ldb + p));
      }
      for (int r = 0; r < R; ++r) {
        const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + r * lda + p));
        const __m256i magnitude = _mm256_sign_epi8(av, av);
        for (int c = 0; c < C; ++c) {
          const __m256i pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(bv[c], av));
          acc[r][c] = _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(pairs, ones));
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) out[r * ldo + c] = lane_sum(acc[r][c]);
  }
  [[gnu::target("avx2")]] static std::int32_t lane_sum(__m256i x) noexcept {
    const __m128i half = _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    const __m128i quarter = _mm_add_epi32(half, _mm_shuffle_epi32(half, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(quarter, _mm_shuffle_epi32(quarter, 0xb1)));
  }
};
struct avx512_vnni_int8 {
  static constexpr const char* name = "avx512vnni";
  static constexpr int rows = 4;
  static constexpr bool offset_a = true;
  template <int R, int C, bool Streamed = false>
  [[gnu::target("avx512f,avx512bw,avx512vnni")]] static void dots(index_t kp, const std::int8_t* a, index_t lda,
                                                                  const std::int8_t* b, index_t ldb, std::int32_t* out,
                                                                  index_t ldo) noexcept {
    const stream_distance ahead = Streamed ? stream_ahead(C * ldb) : stream_distance{};  // only streamed dots ask ahead
    __m512i acc[R][C];
    for (auto& row : acc)
      for (auto& x : row) x = _mm512_setzero_si512();
    for (index_t p = 0; p < kp; p += 64) {
      __m512i bv[C];
      for (int c = 0; c < C; ++c) {
        if (Streamed) prefetch_ahead(b + c * ldb + p, ahead);
        bv[c] = _mm512_loadu_si512(b + c * ldb + p);
      }
      for (int r = 0; r < R; ++r) {
        const __m512i av = _mm512_loadu_si512(a + r * lda + p);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], av, bv[c]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) {  // the zero-masked forms: GCC 12 warns on the others' undefined registers
        const __m256i half = _mm256_add_epi32(_mm512_maskz_extracti64x4_epi64(0xf, acc[r][c], 0),
                                              _mm512_maskz_extracti64x4_epi64(0xf, acc[r][c], 1));
        out[r * ldo + c] = avx2_int8::lane_sum(half);
      }
  }
};

#endif

// Which kernel this CPU runs (and its OS: AVX-512 registers saved), asked once.
enum class int8_kernel { portable, avx2, avx512_vnni };
inline int8_kernel int8_dot_kernel() noexcept {
#if DIFFTX_INT8_DOTS
  static const int8_kernel chosen = [] {
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vnni"))
      return int8_kernel::avx512_vnni;
    if (__builtin_cpu_supports("avx2")) return int8_kernel::avx2;
    return int8_kernel::portable;
  }();
  return chosen;
#else
  return int8_kernel::portable;
#endif
}
inline const char* int8_kernel_name() noexcept {
  switch (int8_dot_kernel()) {
    case int8_kernel::avx512_vnni: return "avx512vnni";
    case int8_kernel::avx2: return "avx2";
    default: return "portable";
  }
}

// a's bytes offset to unsigned (a + 128, the top bit flipped), for kernels
// that multiply u8 · s8 (vpdpbusd here, oneDNN's matmul in linear_onednn.hpp).
template <class A>
aligned_vector<std::uint8_t> offset_to_unsigned(const policy::simd& p, const int8_rows<A>& a) {
  const index_t count = a.rows * a.padded;
  aligned_vector<std::uint8_t> offset(static_cast<std::size_t>(count));
  // (the bytes through a function's own pointers: a store through a byte
  // type may alias the closure's, which kept the loop from vectorizing)
  const auto flip = [](const std::int8_t* in, std::uint8_t* out, index_t n) {
    for (index_t e = 0; e < n; ++e) out[e] = static_cast<std::uint8_t>(in[e] ^ 0x80);
  };
  fork(count > (index_t{1} << 16) ? thread_count(p) : 1, [&](int t, int n) {
    const auto [first, last] = share_of(count, t, n);
    flip(a.values.data() + first, offset.data() + first, last - first);
  });
  return offset;
}

// Raw sums of (a + 128)·b for b's rows j0 .. j0 + n made exact: less 128·Σ b,
// modulo 2^32 as the int32 lanes wrapped on the way.
template <class A>
void remove_unsigned_offset(std::int32_t* sums, const int8_rows<A>& b, index_t j0, index_t n) {
  for (index_t c = 0; c < n; ++c)
    sums[c] = static_cast<std::int32_t>(static_cast<std::uint32_t>(sums[c]) -
                                        128u * static_cast<std::uint32_t>(b.sums[static_cast<std::size_t>(j0 + c)]));
}

// a's bytes as Kernel multiplies them: offset to unsigned into `offset`
// where the kernel says, else a's own.
template <class Kernel, class A>
const std::int8_t* kernel_bytes(const policy::simd& p, const int8_rows<A>& a, aligned_vector<std::uint8_t>& offset) {
  if constexpr (Kernel::offset_a) {
    offset = offset_to_unsigned(p, a);
    return reinterpret_cast<const std::int8_t*>(offset.data());
  } else {
    return a.values.data();
  }
}

// Decoding's few rows of a (a_bytes: as kernel_bytes gives them) against
// slices of each part's rows, shared out as the float products' are
// (for_each_gemv_slice: one forward stream per thread, the slower thread's
// rest taken from the back), each row of a against 4 rows of b a call;
// store(k, i, j0, n, sums): row i of a against rows j0 .. j0 + n of part k.
// Slices of 64 rows: with 16 (the float products' slice, half their bytes at
// the same depth) the offset's removal, the scaling and the store after each
// slice held the products 1-4% further below a plain read on an Intel Xeon.
template <class Kernel, class A, class Store>
void int8_gemv_with(const policy::simd& p, const std::int8_t* a_bytes, index_t M,
                    std::span<const int8_rows<A>* const> parts, Store&& store) {
  constexpr index_t slice = 64;
  std::vector<index_t> rows;
  for (const auto* b : parts) rows.push_back(b->rows);
  const bool side_by_side = p.streaming_used() == policy::stream_order::rows_side_by_side;
  for_each_gemv_slice(p, 1, std::span<const index_t>(rows), slice, [&](std::size_t k, index_t, index_t j0, index_t n) {
    const int8_rows<A>& b = *parts[k];
    const index_t kp = b.padded;
    std::int32_t sums[gemv_max_rows * slice];
    // b's slice streams from memory for a's first row, four rows side by side
    // or one at a time (p.streaming_used()); the others find it in cache.
    const auto row_dots = [&](auto streamed, index_t i, std::int32_t* row) {
      constexpr bool Streamed = decltype(streamed)::value;
      index_t j = 0;
      if (!Streamed || side_by_side)
        for (; j + 4 <= n; j += 4)
          Kernel::template dots<1, 4, Streamed>(kp, a_bytes + i * kp, kp, b.row(j0 + j), kp, row + j, slice);
      for (; j < n; ++j) Kernel::template dots<1, 1, Streamed>(kp, a_bytes + i * kp, kp, b.row(j0 + j), kp, row + j, slice);
    };
    for (index_t i = 0; i < M; ++i) {
      std::int32_t* row = sums + i * slice;
      if (i == 0)
        row_dots(std::true_type{}, i, row);
      else
        row_dots(std::false_type{}, i, row);
      if constexpr (Kernel::offset_a) remove_unsigned_offset(row, b, j0, n);
      store(k, i, j0, n, static_cast<const std::int32_t*>(row));
    }
  });
}

// The exact products of every row of a with every row of b (same padding),
// handed to store(i, j0, n, sums): row i of a against rows j0 .. j0 + n of b.
// Rows of b in blocks of 64 over the threads; a few rows of a (decoding) as
// int8_gemv_with shares them.
template <class Kernel, class A, class Store>
void int8_products_with(const policy::simd& p, const int8_rows<A>& a, const int8_rows<A>& b, Store&& store) {
  constexpr int R = Kernel::rows;
  const index_t M = a.rows, N = b.rows, kp = a.padded;
  aligned_vector<std::uint8_t> offset;
  const std::int8_t* const a_bytes = kernel_bytes<Kernel>(p, a, offset);
  if (M <= gemv_max_rows) {
    const int8_rows<A>* const part = &b;
    return int8_gemv_with<Kernel>(p, a_bytes, M, std::span(&part, 1),
                                  [&](std::size_t, index_t i, index_t j0, index_t n, const std::int32_t* sums) {
                                    store(i, j0, n, sums);
                                  });
  }
  constexpr index_t block = 64;
  const index_t blocks = (N + block - 1) / block;
#pragma omp parallel for num_threads(thread_count(p)) schedule(dynamic, 1) if (blocks > 1)
  for (index_t jb = 0; jb < blocks; ++jb) {
    const index_t j0 = jb * block, n = std::min(block, N - j0);
    std::vector<std::int32_t> sums(static_cast<std::size_t>(R * n));
    for (index_t i0 = 0; i0 < M; i0 += R) {
      const index_t rows = std::min<index_t>(R, M - i0);
      for (index_t j = 0; j < n; j += 4) {
        const std::int8_t *ar = a_bytes + i0 * kp, *br = b.row(j0 + j);
        std::int32_t* out = sums.data() + j;
        if (rows == R && j + 4 <= n) {
          Kernel::template dots<R, 4>(kp, ar, kp, br, kp, out, n);
        } else {
          for (index_t r = 0; r < rows; ++r)
            for (index_t c = j; c < std::min(n, j + 4); ++c)
              Kernel::template dots<1, 1>(kp, ar + r * kp, kp, b.row(j0 + c), kp, sums.data() + r * n + c, n);
        }
      }
      for (index_t r = 0; r < rows; ++r) {
        std::int32_t* row = sums.data() + r * n;
        if constexpr (Kernel::offset_a) remove_unsigned_offset(row, b, j0, n);
        store(i0 + r, j0, n, static_cast<const std::int32_t*>(row));
      }
    }
  }
}

// f(Kernel{}) on this CPU's kernel.
template <class F>
void with_int8_kernel(F&& f) {
#if DIFFTX_INT8_DOTS
  switch (int8_dot_kernel()) {
    case int8_kernel::avx512_vnni: return f(avx512_vnni_int8{});
    case int8_kernel::avx2: return f(avx2_int8{});
    default: break;
  }
#endif
  f(portable_int8{});
}

// int8_products_with on this CPU's kernel.
template <class A, class Store>
void int8_products(const policy::simd& p, const int8_rows<A>& a, const int8_rows<A>& b, Store&& store) {
  with_int8_kernel([&](auto kernel) { int8_products_with<decltype(kernel)>(p, a, b, store); });
}

// Decoding's few rows of a against each part on this CPU's kernel, a's bytes
// offset once for all of them; store(k, i, j0, n, sums) as int8_gemv_with.
template <class A, class Store>
void int8_gemv(const policy::simd& p, const int8_rows<A>& a, std::span<const int8_rows<A>* const> parts, Store&& store) {
  with_int8_kernel([&](auto kernel) {
    using Kernel = decltype(kernel);
    aligned_vector<std::uint8_t> offset;
    int8_gemv_with<Kernel>(p, kernel_bytes<Kernel>(p, a, offset), a.rows, parts, store);
  });
}

}  // namespace difftx::simd_detail
