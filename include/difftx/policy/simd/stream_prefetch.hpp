// Software prefetching for the loops that stream weights from memory once:
// decoding's products, its attention's reads of the KV cache
// (attention_decode_kernels.hpp), and read_through, which measures the rate
// they are held to (memory_read.hpp).
//
// Such a loop reads a group of rows side by side (two, or four, each a
// sequential stream of 64-byte lines) and does arithmetic on every line. On an
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

namespace difftx::simd_detail {

// How far ahead a loop over groups of group_bytes (the bytes between a load
// and the same column of the next group's rows) prefetches: whole groups, at
// least 8 KiB. Shorter distances left the read below its best rate and much
// longer ones (32 KiB and more) slowed it, lines leaving L1 before their use.
inline constexpr index_t least_stream_ahead = 8192;
constexpr index_t stream_ahead(index_t group_bytes) noexcept {
  if (group_bytes <= 0) return least_stream_ahead;
  return (least_stream_ahead + group_bytes - 1) / group_bytes * group_bytes;
}

// Asks for the 64-byte line `ahead` bytes past `at`, for reading, into every
// cache level (prefetcht0 on x86). The address is computed as an integer:
// near the end of a matrix it lies past the object, and a prefetch never
// faults.
inline void prefetch_ahead(const void* at, index_t ahead) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(at) + static_cast<std::uintptr_t>(ahead)), 0, 3);
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
