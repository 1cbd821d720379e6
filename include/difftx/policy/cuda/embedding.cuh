// CUDA embedding lookup and its scatter-add backward (difftx/ops/embedding.hpp),
// and the device check of token ids that the cross-entropy shares.
//
// Token ids live in device memory (token_t, int32). The reference throws
// input_error for an id outside [0, V) before it writes anything; so does this
// policy: one kernel scans every id (the first bad flat index by atomicMin,
// and the count of ids >= 0, which the cross-entropy needs), and one 16-byte
// download brings the verdict back. That is one host round trip per call (a
// stream synchronisation), not one per id; a bad id costs a second small
// download, to name it in the message.
//
// The backward is deterministic, without atomics: the ids are sorted with
// their row numbers (cub::DeviceRadixSort, stable, so rows of one id stay in
// ascending order), then the first position of each run of equal ids sums
// those rows of dy in the accumulation type, in ascending row order (the
// reference's order), and adds the sum to dw once. Atomics in the accumulation
// type would need a [V, C] buffer in that type and sum in a different order
// on every run; the sort needs O(M) scratch, gives the same bits on every run,
// and in float64 the same bits as the reference.
#pragma once

#include <algorithm>
#include <bit>
#include <climits>
#include <cstddef>
#include <string>

#include <cub/device/device_radix_sort.cuh>

#include "difftx/ops/embedding.hpp"
#include "difftx/policy/cuda/device_types.cuh"
#include "difftx/policy/cuda/elementwise.cuh"
#include "difftx/policy/cuda/tag.cuh"

namespace difftx {

namespace cuda_detail {

// What one scan of token ids found: the first flat index of an id that is not
// allowed (ULLONG_MAX if none) and how many ids are >= 0.
struct token_scan {
  unsigned long long first_bad;
  unsigned long long non_negative;
};

constexpr unsigned token_scan_threads = 256;

// A template (of the id type) so that the header defines no non-inline kernel.
template <class Tok>
__global__ void __launch_bounds__(token_scan_threads)
    token_scan_kernel(const Tok* tokens, long long n, long long count, bool allow_negative, token_scan* out) {
  unsigned long long first_bad = ULLONG_MAX, non_negative = 0;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long t = tokens[i];
    const bool ok = (allow_negative && t < 0) || (t >= 0 && t < count);
    if (!ok && first_bad == ULLONG_MAX) first_bad = static_cast<unsigned long long>(i);  // a thread's indices ascend
    non_negative += t >= 0 ? 1 : 0;
  }
  non_negative = warp_sum(non_negative);
  for (int offset = 16; offset > 0; offset /= 2) {
    const unsigned long long other = __shfl_xor_sync(0xffffffffu, first_bad, offset);
    first_bad = other < first_bad ? other : first_bad;
  }
  if (threadIdx.x % 32 == 0) {
    if (non_negative > 0) atomicAdd(&out->non_negative, non_negative);
    if (first_bad != ULLONG_MAX) atomicMin(&out->first_bad, first_bad);
  }
}

// The device counterpart of detail::check_token_range: throws the same
// input_error for an id outside [0, count) (negative ids allowed with
// allow_negative), and returns the number of ids >= 0. Waits for the stream.
template <class Tok>
index_t check_token_range(const policy::cuda& p, std::string_view where, std::string_view argument, const Tok& tokens,
                          index_t count, bool allow_negative = false) {
  const long long n = tokens.size();
  Tensor<token_scan, 1> scan({1}, p.memory());  // zeroed: non_negative = 0; first_bad = ULLONG_MAX below
  static_assert(offsetof(token_scan, first_bad) == 0);
  DIFFTX_CUDA_CHECK(cudaMemsetAsync(scan.data(), 0xFF, sizeof(unsigned long long), p.stream()));
  const unsigned blocks = std::min<unsigned>(blocks_for(n, token_scan_threads), 1024u);
  token_scan_kernel<<<blocks, token_scan_threads, 0, p.stream()>>>(tokens.data(), n, count, allow_negative,
                                                                   scan.data());
  DIFFTX_CUDA_CHECK(cudaGetLastError());
  token_scan found{};
  p.memory().download(&found, scan.data(), sizeof found);
  if (found.first_bad != ULLONG_MAX) {
    token_t t = 0;
    p.memory().download(&t, tokens.data() + found.first_bad, sizeof t);
    throw input_error(std::string(where), std::string(argument),
                      allow_negative ? "ids < " + std::to_string(count) + " (negative: ignored)"
                                     : "ids in [0, " + std::to_string(count) + ")",
                      std::to_string(t) + " at flat index " + std::to_string(found.first_bad));
  }
  return static_cast<index_t>(found.non_negative);
}

// One block per position i of the sorted ids; the first position of each run
// of equal ids sums that run's rows of dy (rows ascending) and adds to dw.
template <class DT, class A = device_accum_t<DT>>
__global__ void embedding_backward_kernel(const token_t* sorted_tokens, const int* sorted_rows, int M, const DT* dy,
                                          DT* dw, int C) {
  const int i = blockIdx.x;
  const token_t v = sorted_tokens[i];
  if (i > 0 && sorted_tokens[i - 1] == v) return;
  int end = i + 1;
  while (end < M && sorted_tokens[end] == v) ++end;
  DT* dw_row = dw + static_cast<long long>(v) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    A acc = 0;
    for (int r = i; r < end; ++r) acc += to_accum(dy[static_cast<long long>(sorted_rows[r]) * C + c]);
    dw_row[c] = from_accum<DT>(to_accum(dw_row[c]) + acc);
  }
}

}  // namespace cuda_detail

// tokens[M], w[V, C] -> y[M, C] = w[tokens[m], :]
template <class T>
  requires supported_by<policy::cuda, T>
void embedding_forward(const policy::cuda& p, cview<token_t, 1> tokens, cview<T, 2> w, TensorView<T, 2> y) {
  using namespace cuda_detail;
  constexpr std::string_view where = "embedding_forward";
  detail::check_embedding(where, memory_space::device, tokens, w, "w", y, "y");
  cuda_detail::check_token_range(p, where, "tokens", tokens, w.extent(0));
  using DT = device_t<T>;
  const long long C = w.extent(1);
  const token_t* tp = tokens.data();
  const DT* wp = device_pointer(w.data());
  DT* yp = device_pointer(y.data());
  launch_for_each(p, y.size(), [=] __device__(long long e) { yp[e] = wp[tp[e / C] * C + e % C]; });
}

// dy[M, C] -> dw[V, C] += scatter-add of dy's rows into rows tokens[m]
template <class T>
  requires supported_by<policy::cuda, T>
void embedding_backward(const policy::cuda& p, cview<token_t, 1> tokens, cview<T, 2> dy, TensorView<T, 2> dw) {
  using namespace cuda_detail;
  constexpr std::string_view where = "embedding_backward";
  detail::check_embedding(where, memory_space::device, tokens, dw, "dw", dy, "dy");
  require(tokens.size() <= INT_MAX && dw.extent(1) <= INT_MAX, where, "tokens",
          "at most " + std::to_string(INT_MAX) + " ids and columns on the CUDA policy",
          std::to_string(tokens.size()) + " ids of " + std::to_string(dw.extent(1)) + " columns");
  cuda_detail::check_token_range(p, where, "tokens", tokens, dw.extent(0));
  using DT = device_t<T>;
  const int M = static_cast<int>(tokens.size()), C = static_cast<int>(dw.extent(1));

  // Sort (id, row) pairs by id; the sort is stable, so each id's rows ascend.
  Tensor<int, 1> rows({M}, p.memory()), sorted_rows({M}, p.memory());
  Tensor<token_t, 1> sorted_tokens({M}, p.memory());
  int* rows_p = rows.data();
  launch_for_each(p, M, [=] __device__(long long m) { rows_p[m] = static_cast<int>(m); });
  // ids are in [0, V): only their low bit_width(V - 1) bits differ
  const int end_bit = std::max(1, static_cast<int>(std::bit_width(static_cast<unsigned long long>(dw.extent(0) - 1))));
  std::size_t scratch_bytes = 0;
  DIFFTX_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, scratch_bytes, tokens.data(), sorted_tokens.data(),
                                                    rows.data(), sorted_rows.data(), M, 0, end_bit, p.stream()));
  Tensor<unsigned char, 1> scratch({static_cast<index_t>(std::max<std::size_t>(scratch_bytes, 1))}, p.memory());
  DIFFTX_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch.data(), scratch_bytes, tokens.data(), sorted_tokens.data(),
                                                    rows.data(), sorted_rows.data(), M, 0, end_bit, p.stream()));
  embedding_backward_kernel<<<static_cast<unsigned>(M), 128, 0, p.stream()>>>(
      sorted_tokens.data(), sorted_rows.data(), M, device_pointer(dy.data()), device_pointer(dw.data()), C);
  DIFFTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace difftx
