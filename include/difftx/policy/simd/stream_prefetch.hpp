// Software prefetching for the loops that stream weights from memory once:
// decoding's products, its attention's reads of the KV cache
// (attention_decode_kernels.hpp), and read_through, which measures the rate
// they are held to (memory_read.hpp).
//
// Such a loop reads one row, or a group of rows side by side (two, or four,
// each a sequential stream of 64-byte lines; policy::stream_order below), and
// does arithmetic on every line. On an
// Intel Xeon (Emerald Rapids, 2 cores of a shared host) the hardware
// prefetchers alone held it to about three quarters of a plain read's rate,
// whichever instruction did the arithmetic (vdpbf16ps, conversion and FMAs,
// AMX, vpdpbusd): the out-of-order window keeps fewer loads in flight when
// each line costs more instructions. Asking for every line as far ahead as
// the rows that follow it in memory, in the order the loop will load them,
// lets the arithmetic wait on lines already in cache instead; a plain read
// gains too, less (docs/benchmarks.md, "Decoding a checkpoint", has both).
#pragma once

#include <cstdint>

#include "difftx/core/tensor.hpp"

namespace difftx::policy {

// policy::simd::streaming: how decoding's products read the rows of a weight
// they stream from memory. automatic reads one row after the other on AMD's
// CPUs and a few rows side by side (two of float or bfloat16, four of int8)
// on others, as each was measured faster on its CPU (docs/design.md,
// "float16 and bfloat16 products"); the other two force an order for
// comparisons. Every row's sum is computed in the same order either way: the
// results are the same bits.
enum class stream_order { automatic, one_row_at_a_time, rows_side_by_side };

}  // namespace difftx::policy

namespace difftx::simd_detail {

// What the streaming loops' choices below were measured by, asked once: the
// CPU's vendor, and whether it has AVX-512 (on AMD's: Zen 4 and later).
struct streaming_cpu {
  bool intel = false, amd = false, avx512 = false;
};
inline streaming_cpu this_streaming_cpu() noexcept {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && !defined(_MSC_VER)
  static const streaming_cpu cpu{__builtin_cpu_is("intel") != 0, __builtin_cpu_is("amd") != 0,
                                 __builtin_cpu_supports("avx512f") != 0};
  return cpu;
#else
  return {};
#endif
}

// The order a setting reads rows in on this CPU: one_row_at_a_time or
// rows_side_by_side. On an AMD EPYC (Zen 4) one row at a time read the
// float32, bfloat16 (vdpbf16ps) and int8 products 1.4x, 1.8x and 1.9x faster
// than two or four side by side; on an Intel Xeon two side by side were the
// faster.
inline policy::stream_order resolved_stream_order(policy::stream_order wanted) noexcept {
  using order = policy::stream_order;
  if (wanted != order::automatic) return wanted;
  return this_streaming_cpu().amd ? order::one_row_at_a_time : order::rows_side_by_side;
}

// How far ahead a loop over groups of group_bytes (the bytes between a load
// and the same column of the next group's rows) asks for its lines: `near`
// into every cache level, whole groups and at least 8 KiB; `far` into L2
// (and the levels past it) only, whole multiples of near and at least
// far_stream_least() bytes, or 0 for none. Shorter near distances left the
// read below its best rate and much longer ones (32 KiB and more) slowed it,
// lines leaving L1 before their use. The far requests keep more of the stream
// in flight than L1's few outstanding misses allow: on an Intel Xeon (Emerald
// Rapids) the products then read at a plain read's rate where near alone
// held them to about 85% of it (docs/benchmarks.md, "Decoding a checkpoint").
inline constexpr index_t least_stream_ahead = 8192;
struct stream_distance {
  index_t near = least_stream_ahead, far = 0;
};

// The far distance's least bytes on this CPU: 64 KiB on Intel's and on AMD's
// from Zen 4 on (the first with AVX-512), where it was measured: on a Zen 4
// the far requests made a bfloat16 decode step of a 375M checkpoint about an
// eighth faster and a float32 one about 5% (docs/design.md, "float16 and
// bfloat16 products"). AMD's CPUs before Zen 4 fill L1 at every prefetch level
// (their optimization guides), where lines asked for 32 KiB ahead were
// measured to leave before their use: 0 there, and on other CPUs until measured.
inline index_t far_stream_least() noexcept {
  const streaming_cpu cpu = this_streaming_cpu();
  return cpu.intel || (cpu.amd && cpu.avx512) ? 65536 : 0;
}

inline stream_distance stream_ahead(index_t group_bytes) noexcept {
  auto whole = [](index_t least, index_t unit) { return (least + unit - 1) / unit * unit; };
  const index_t near = group_bytes <= 0 ? least_stream_ahead : whole(least_stream_ahead, group_bytes);
  const index_t far_least = far_stream_least();
  return {near, far_least > 0 ? whole(far_least, near) : 0};
}

// Asks for the 64-byte lines `ahead.near` bytes past `at` (prefetcht0 on x86)
// and `ahead.far` bytes past it (prefetcht1), for reading. The addresses are
// computed as integers: near the end of a matrix they lie past the object,
// and a prefetch never faults.
inline void prefetch_ahead(const void* at, const stream_distance& ahead) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  const auto address = reinterpret_cast<std::uintptr_t>(at);
  __builtin_prefetch(reinterpret_cast<const void*>(address + static_cast<std::uintptr_t>(ahead.near)), 0, 3);
  if (ahead.far > 0) __builtin_prefetch(reinterpret_cast<const void*>(address + static_cast<std::uintptr_t>(ahead.far)), 0, 2);
#else
  (void)at;
  (void)ahead;
#endif
}

// Asks for the line at `at` into L2 and the levels past it (prefetcht1):
// for data read a little later, by another loop, that should not crowd L1.
inline void prefetch_into_l2(const void* at) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(at, 0, 2);
#else
  (void)at;
#endif
}

}  // namespace difftx::simd_detail
