// What the simd kernels share: the vector type of an accumulation type,
// conversions between storage and accumulation types, the thread count and
// chunked loops over threads.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "difftx/core/x86_intrinsics.hpp"  // before Eigen
#include <Eigen/Core>
#include <xsimd/xsimd.hpp>
#if defined(_OPENMP)
#include <omp.h>
#endif

#include "difftx/core/scalar_traits.hpp"
#include "difftx/core/tensor.hpp"
#include "difftx/policy/simd/step_team.hpp"
#include "difftx/policy/simd/tag.hpp"

// Fully unrolls the loop that follows at every optimisation level. The
// decoding kernels keep several partial sums in an array indexed by a short
// constant loop; GCC 12 at -O2 leaves such loops rolled and the sums in
// memory (a store and a load per step), which held those kernels below the
// rate one core streams from memory (measured with a 1B checkpoint; see
// docs/benchmarks.md's git history). Users' builds are often -O2.
#define DIFFTX_PRAGMA(text) _Pragma(#text)
#if defined(__clang__)
#define DIFFTX_UNROLL(n) DIFFTX_PRAGMA(unroll n)
#elif defined(__GNUC__)
#define DIFFTX_UNROLL(n) DIFFTX_PRAGMA(GCC unroll n)
#else
#define DIFFTX_UNROLL(n)
#endif

namespace difftx::simd_detail {

template <class A>
using vec = xsimd::batch<A>;

// x·y + z, and z − x·y, each with one rounding (the project compiles with
// -ffp-contract=off, so nothing else fuses). xsimd 8, Debian bookworm's, has
// no AVX-512 kernel for fma and fnma and computes x * y + z there in two
// roundings; on AVX-512 these call the instructions, elsewhere xsimd's.
template <class A, class Arch>
xsimd::batch<A, Arch> multiply_add(const xsimd::batch<A, Arch>& x, const xsimd::batch<A, Arch>& y,
                                   const xsimd::batch<A, Arch>& z) noexcept {
#if defined(__AVX512F__)
  if constexpr (std::is_base_of_v<xsimd::avx512f, Arch> && std::is_same_v<A, float>)
    return _mm512_fmadd_ps(x, y, z);
  else if constexpr (std::is_base_of_v<xsimd::avx512f, Arch> && std::is_same_v<A, double>)
    return _mm512_fmadd_pd(x, y, z);
  else
#endif
    return xsimd::fma(x, y, z);
}
template <class A, class Arch>
xsimd::batch<A, Arch> negative_multiply_add(const xsimd::batch<A, Arch>& x, const xsimd::batch<A, Arch>& y,
                                            const xsimd::batch<A, Arch>& z) noexcept {
#if defined(__AVX512F__)
  if constexpr (std::is_base_of_v<xsimd::avx512f, Arch> && std::is_same_v<A, float>)
    return _mm512_fnmadd_ps(x, y, z);
  else if constexpr (std::is_base_of_v<xsimd::avx512f, Arch> && std::is_same_v<A, double>)
    return _mm512_fnmadd_pd(x, y, z);
  else
#endif
    return xsimd::fnma(x, y, z);
}

// e^z. On AVX-512, xsimd 8's exp multiplies and adds in two roundings (the
// missing fma above) and so runs slower under -ffp-contract=off; Eigen's packet
// exp evaluates its polynomial with fused multiply-adds, so it is taken where
// its packet has vec<A>'s width, and xsimd's elsewhere.
template <class A>
vec<A> exponential(const vec<A>& z) noexcept {
  using packet = typename Eigen::internal::packet_traits<A>::type;
  if constexpr (Eigen::internal::packet_traits<A>::HasExp &&
                sizeof(packet) == sizeof(A) * vec<A>::size)
    return Eigen::internal::pexp(static_cast<packet>(z));
  else
    return xsimd::exp(z);
}

inline int thread_count(const policy::simd& p) noexcept {
#if defined(_OPENMP)
  return p.threads > 0 ? p.threads : omp_get_max_threads();
#else
  (void)p;
  return 1;
#endif
}
// Elementwise work on fewer values than this runs on the calling thread alone:
// opening a parallel region (waking the team, a barrier at its end) costs more
// than a decode step's norm, RoPE or residual add of one token (2-8 thousand
// values), and the 1B model's decode step opened a dozen such regions per layer.
constexpr index_t parallel_min_values = index_t{1} << 15;
inline int thread_count(const policy::simd& p, index_t values) noexcept {
  return values >= parallel_min_values ? thread_count(p) : 1;
}

// n elements of T as the accumulation type, into out. A bfloat16 is the top
// half of a float's bits: a shift the compiler vectorises (Eigen's cast goes
// element by element, which made packing several times slower). Eigen vectorises the
// float16 conversion with F16C / AVX-512 where the target has them.
template <class T>
void to_accum(const T* in, index_t n, accum_t<T>* out) {
  using A = accum_t<T>;
  if constexpr (std::is_same_v<T, A>)
    std::copy_n(in, n, out);
  else if constexpr (std::is_same_v<T, Eigen::bfloat16>)
    for (index_t i = 0; i < n; ++i)
      out[i] = std::bit_cast<float>(std::uint32_t{Eigen::numext::bit_cast<std::uint16_t>(in[i])} << 16);
  else
    Eigen::Map<Eigen::Array<A, Eigen::Dynamic, 1>>(out, n) =
        Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(in, n).template cast<A>();
}
template <class T>
void from_accum(const accum_t<T>* in, index_t n, T* out) {
  using A = accum_t<T>;
  if constexpr (std::is_same_v<T, A>)
    std::copy_n(in, n, out);
  else
    Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(out, n) =
        Eigen::Map<const Eigen::Array<A, Eigen::Dynamic, 1>>(in, n).template cast<T>();
}

// W consecutive values of T as one vector of their accumulation type,
// converted in registers (bfloat16: widen and shift; float16: F16C), so that
// a kernel can stream T without a converted copy.
template <class T>
vec<accum_t<T>> load_as_accum(const T* p) {
  using A = accum_t<T>;
  using V = vec<A>;
  if constexpr (std::is_same_v<T, A>) {
    return V::load_unaligned(p);
  } else {
#if defined(__AVX512F__)
    if constexpr (V::size == 16 && std::is_same_v<T, Eigen::bfloat16>)
      return _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
    if constexpr (V::size == 16 && std::is_same_v<T, Eigen::half>)
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#endif
#if defined(__AVX2__)
    if constexpr (V::size == 8 && std::is_same_v<T, Eigen::bfloat16>)
      return _mm256_castsi256_ps(
          _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
#endif
#if defined(__F16C__)
    if constexpr (V::size == 8 && std::is_same_v<T, Eigen::half>)
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#endif
    alignas(64) A lanes[V::size];
    to_accum(p, V::size, lanes);
    return V::load_aligned(lanes);
  }
}

// W consecutive int8 values as one vector of A, sign-extended and converted in
// registers (an int8 key/value cache read in place).
template <class A>
vec<A> load_int8_as(const std::int8_t* p) {
  using V = vec<A>;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<A, float> && V::size == 16)
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#endif
#if defined(__AVX2__)
  if constexpr (std::is_same_v<A, float> && V::size == 8)
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#endif
  alignas(64) A lanes[V::size];
  for (std::size_t i = 0; i < V::size; ++i) lanes[i] = A(p[i]);
  return V::load_aligned(lanes);
}
// A row's W values as A: T's (load_as_accum) or int8's.
template <class A, class E>
vec<A> load_row_as(const E* p) {
  if constexpr (std::is_same_v<E, std::int8_t>)
    return load_int8_as<A>(p);
  else
    return load_as_accum(p);
}

// 2W consecutive bfloat16 values as two vectors of W floats, the even
// columns and the odd ones. A bfloat16 is a float's top 16 bits, so each
// 32-bit word of the load holds two floats' tops: the even column is the
// word shifted up by 16 bits, the odd one the word with its low half cleared.
// Two bit operations within lanes per 2W values, where load_as_accum widens
// W values with a cross-lane shuffle and a shift.
struct bf16_pair_halves {
  vec<float> even, odd;
};
template <class V = vec<float>>  // a template, so that only the branch of V's width is compiled
bf16_pair_halves load_bf16_pairs(const Eigen::bfloat16* p) {
#if defined(__AVX512F__)
  if constexpr (V::size == 16) {
    const __m512i words = _mm512_loadu_si512(p);
    return {V(_mm512_castsi512_ps(_mm512_slli_epi32(words, 16))),
            V(_mm512_castsi512_ps(_mm512_and_si512(words, _mm512_set1_epi32(static_cast<int>(0xffff0000u)))))};
  }
#endif
#if defined(__AVX2__)
  if constexpr (V::size == 8) {
    const __m256i words = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return {V(_mm256_castsi256_ps(_mm256_slli_epi32(words, 16))),
            V(_mm256_castsi256_ps(_mm256_and_si256(words, _mm256_set1_epi32(static_cast<int>(0xffff0000u)))))};
  }
#endif
  alignas(64) float even[V::size], odd[V::size];
  for (std::size_t i = 0; i < V::size; ++i) {
    even[i] = static_cast<float>(p[2 * i]);
    odd[i] = static_cast<float>(p[2 * i + 1]);
  }
  return {V::load_aligned(even), V::load_aligned(odd)};
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(_MSC_VER)
// Lane t of the result is the sum of acc[t]'s lanes: four rounds of adding
// two shuffles of a pair of vectors, each halving what is left to add
// (256-bit halves, 128-bit quarters, pairs, single lanes), then one
// permutation back into row order. A target attribute, so that code built
// without AVX-512 may call it where the CPU has it (gemm_bf16_pairs.hpp).
[[gnu::target("avx512f"), gnu::noinline]] inline __m512 lane_sums_avx512(const __m512 (&acc)[16]) noexcept {
  __m512 v[8], w[4], x[2];
  for (int t = 0; t < 8; ++t)  // quarters 0-1: row t's halves added; 2-3: row t + 8's
    v[t] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[t], acc[t + 8], 0x44), _mm512_shuffle_f32x4(acc[t], acc[t + 8], 0xee));
  for (int t = 0; t < 4; ++t)  // quarters: rows t, t + 8, t + 4, t + 12
    w[t] = _mm512_add_ps(_mm512_shuffle_f32x4(v[t], v[t + 4], 0x88), _mm512_shuffle_f32x4(v[t], v[t + 4], 0xdd));
  for (int t = 0; t < 2; ++t)  // in each quarter, lanes 0 and 2 hold w[t]'s row, 1 and 3 w[t + 2]'s
    x[t] = _mm512_add_ps(_mm512_unpacklo_ps(w[t], w[t + 2]), _mm512_unpackhi_ps(w[t], w[t + 2]));
  // Lane j of quarter q: the row of w[0], w[2], w[1], w[3] (j = 0..3) in that quarter.
  const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(x[0], x[1], 0x44), _mm512_shuffle_ps(x[0], x[1], 0xee));
  const __m512i row_order = _mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15);
  return _mm512_permutexvar_ps(row_order, sums);
}
#endif

// out[i] = the sum of rows[i]'s lanes, for the W = vec<A>::size vectors at
// rows. xsimd's haddp does all W at once, but its lane order is right only for
// 8 floats (AVX): xsimd 8.1's 16-lane float version returns the sums permuted
// (and needs AVX512DQ), so 16 floats take lane_sums_avx512 and other widths
// reduce one vector at a time.
template <class A>
void lane_sums(const vec<A>* rows, A* out) {
  constexpr index_t W = vec<A>::size;
#if defined(__AVX512F__) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(_MSC_VER)
  if constexpr (std::is_same_v<A, float> && W == 16) {
    __m512 registers[16];
    for (index_t i = 0; i < W; ++i) registers[i] = rows[i];
    _mm512_storeu_ps(out, lane_sums_avx512(registers));
    return;
  }
#endif
  if constexpr (std::is_same_v<A, float> && W == 8)
    xsimd::haddp(rows).store_unaligned(out);
  else
    for (index_t i = 0; i < W; ++i) out[i] = xsimd::hadd(rows[i]);
}

// out[t] = Σ_c x[c] · R(t, c) for t < rows, R's row t at first + t·stride in
// its storage type (T, or int8), converted in registers: W rows at a time,
// their W accumulators reduced across lanes together (lane_sums). A
// matrix-vector product for a few rows: decoding's scores and its projections.
template <class A, class T>
void dots_with_rows(const A* x, const T* first, index_t stride, index_t rows, index_t k, A* out) {
  using V = vec<A>;
  constexpr index_t W = V::size;
  const index_t k_vec = k / W * W;
  auto rest = [&](index_t t) {  // the columns past the last whole vector
    A sum(0);
    for (index_t c = k_vec; c < k; ++c) sum += x[c] * static_cast<A>(first[t * stride + c]);
    return sum;
  };
  index_t t = 0;
  for (; t + W <= rows; t += W) {
    V acc[W];
    for (auto& a : acc) a = V(A(0));
    for (index_t c = 0; c < k_vec; c += W) {
      const V xv = V::load_unaligned(x + c);
      for (index_t n = 0; n < W; ++n) acc[n] = simd_detail::multiply_add(xv, load_row_as<A>(first + (t + n) * stride + c), acc[n]);
    }
    lane_sums(acc, out + t);
    if (k_vec < k)
      for (index_t n = 0; n < W; ++n) out[t + n] += rest(t + n);
  }
  for (; t < rows; ++t) {
    V acc(A(0));
    for (index_t c = 0; c < k_vec; c += W) acc = simd_detail::multiply_add(V::load_unaligned(x + c), load_row_as<A>(first + t * stride + c), acc);
    out[t] = xsimd::hadd(acc) + rest(t);
  }
}

// Runs f(begin, end) over [0, n) in chunks of `chunk` on the policy's threads:
// on the calling thread when there is one chunk, or fewer values than
// parallel_min_values (values_per_item for each of the n; SwiGLU's gate of a
// decoded token, 4096 values in 4 chunks, opened a region every layer).
template <class F>
void parallel_chunks(const policy::simd& p, index_t n, index_t chunk, F&& f, index_t values_per_item = 1) {
  const index_t chunks = (n + chunk - 1) / chunk;
  fork(chunks > 1 ? thread_count(p, n * values_per_item) : 1, [&](int t, int parts) {
    const auto [first, last] = share_of(chunks, t, parts);
    for (index_t c = first; c < last; ++c) f(c * chunk, std::min(n, (c + 1) * chunk));
  });
}

// A chunk of T as the accumulation type: in place when T is its own
// accumulation type, else converted into the scratch buffer.
template <class T>
const accum_t<T>* chunk_as_accum(const T* in, index_t n, accum_t<T>* scratch) {
  if constexpr (std::is_same_v<T, accum_t<T>>) {
    return in;
  } else {
    to_accum(in, n, scratch);
    return scratch;
  }
}
// Where a kernel writes a chunk of output: straight into T's memory when T is
// its own accumulation type, else into scratch (then converted by the caller).
template <class T>
accum_t<T>* output_chunk(T* out, accum_t<T>* scratch) {
  if constexpr (std::is_same_v<T, accum_t<T>>)
    return out;
  else
    return scratch;
}

// Scratch for the kernels' tiles, aligned to the vector width: std::vector's
// buffers are 16-byte aligned, so half of the 32-byte loads of a tile could
// straddle two cache lines, each such load a second cache access, which
// the tile products' inner loops feel (the attention backward ran slower).
template <class A>
using aligned_vector = std::vector<A, Eigen::aligned_allocator<A>>;

// chunk_as_accum with a scratch buffer that grows to the row's size.
template <class T>
const accum_t<T>* accum_row(const T* row, index_t n, std::vector<accum_t<T>>& scratch) {
  if constexpr (!std::is_same_v<T, accum_t<T>>) scratch.resize(static_cast<std::size_t>(n));
  return chunk_as_accum(row, n, scratch.data());
}

// Sum and dot product of n values, vectorised.
template <class A>
A sum(const A* x, index_t n) {
  constexpr index_t W = vec<A>::size;
  vec<A> acc(A(0));
  index_t i = 0;
  for (; i + W <= n; i += W) acc += vec<A>::load_unaligned(x + i);
  A s = xsimd::hadd(acc);
  for (; i < n; ++i) s += x[i];
  return s;
}
template <class A>
A dot(const A* x, const A* y, index_t n) {
  constexpr index_t W = vec<A>::size;
  vec<A> acc(A(0));
  index_t i = 0;
  for (; i + W <= n; i += W) acc = simd_detail::multiply_add(vec<A>::load_unaligned(x + i), vec<A>::load_unaligned(y + i), acc);
  A s = xsimd::hadd(acc);
  for (; i < n; ++i) s += x[i] * y[i];
  return s;
}

}  // namespace difftx::simd_detail
