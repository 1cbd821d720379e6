// A packed batch in cuDNN's ragged layout (attention_cudnn.cuh) as index
// arithmetic: the length its graph pads every sequence to, each tensor's row
// width, and where a row's log-sum-exp lies in the per-sequence blocks of
// lse [1, H, Maps, total] (modules/sequences.hpp). Shared by the kernels and
// the host; no CUDA header, so it is tested without a GPU.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

#if defined(__CUDACC__)
#define DIFFTX_HOST_DEVICE __host__ __device__
#else
#define DIFFTX_HOST_DEVICE
#endif

namespace difftx::cuda_detail {

// The tensors whose rows a ragged call offsets, and cu_seqlens itself (rows).
enum ragged_tensor : int { ragged_rows, ragged_q, ragged_k, ragged_v, ragged_o, ragged_stats, ragged_tensor_count };

// Offsets per tensor in a ragged batch's table [ragged_tensor_count, stride]:
// the sequences + 1 offsets, rounded up to an even count so that every row
// starts 16-byte aligned (cuDNN's tensors default to that alignment).
constexpr std::int64_t ragged_offsets_stride(std::int64_t sequences) { return (sequences + 2) / 2 * 2; }

// Elements in one token's row of tensor t: q [.., H, Maps, d], k [.., G, Maps, d],
// v [.., G, dv], o [.., H, dv]; cuDNN's statistics [total, H] per map.
constexpr std::int64_t ragged_row_elements(ragged_tensor t, std::int64_t H, std::int64_t G, std::int64_t maps,
                                           std::int64_t d, std::int64_t dv) {
  switch (t) {
    case ragged_q: return H * maps * d;
    case ragged_k: return G * maps * d;
    case ragged_v: return G * dv;
    case ragged_o: return H * dv;
    case ragged_stats: return H;
    default: return 1;
  }
}

// n rounded up to a power of two, at least 64: what a ragged graph is built
// for, of the longest sequence (every sequence's padded length, never stored:
// the padding mask holds each to its own) and of the token total (what cuDNN
// sizes its scratch by), so that packs of the same sequence count and similar
// lengths share one graph.
constexpr std::int64_t ragged_bucket(std::int64_t n) {
  return std::max<std::int64_t>(64, static_cast<std::int64_t>(std::bit_ceil(static_cast<std::uint64_t>(n))));
}

// The sequence holding row t: the last b with rows[b] <= t, rows = cu_seqlens of `sequences` sequences.
DIFFTX_HOST_DEVICE inline int sequence_of_row(const std::int64_t* rows, int sequences, std::int64_t t) {
  int b = 0, last = sequences - 1;
  while (b < last) {
    const int mid = (b + last + 1) / 2;
    if (rows[mid] <= t)
      b = mid;
    else
      last = mid - 1;
  }
  return b;
}

// Where map m's log-sum-exp of head h at row t lies in lse [1, H, Maps, total]
// held as per-sequence blocks [H, Maps, length].
DIFFTX_HOST_DEVICE inline std::int64_t packed_lse_index(const std::int64_t* rows, int sequences, int H, int maps, int h,
                                                        int m, std::int64_t t) {
  const int b = sequence_of_row(rows, sequences, t);
  const std::int64_t begin = rows[b], length = rows[b + 1] - begin;
  return maps * H * begin + (static_cast<std::int64_t>(h) * maps + m) * length + (t - begin);
}

}  // namespace difftx::cuda_detail

#undef DIFFTX_HOST_DEVICE
