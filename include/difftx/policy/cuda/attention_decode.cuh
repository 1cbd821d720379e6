// CUDA attention of a few new tokens over a key/value cache (decoding;
// formulas and shapes in difftx/ops/attention_decode.hpp), split over keys as
// flash-decoding does, on the CUDA cores in the accumulation type
// A = device_accum_t<DT> (float, or double for float64), one or two maps.
//
// A decoding step is bound by memory: it reads the whole cache once and has
// few query rows (T new tokens x H/G heads per group) to do arithmetic with.
// One block per (sequence, group) would leave most SMs idle on a small batch,
// so every sequence's keys are also cut into splits, one block each, and a
// second kernel puts the splits together by log-sum-exp:
//
//   split kernel, grid (row block x split, group j, sequence b): a block reads
//     the keys and values of its split once for all the query rows of group j
//     (up to decode_rows; more rows, as T (H/G) > 16, take more row blocks,
//     which read the split again, mostly from L2), and leaves per row and map
//     its maximum m_s, sum of exponentials l_s and unnormalised P·V acc_s, in
//     A, in scratch from the policy's stream-ordered memory.
//   combine kernel, one thread per output value:
//     M = max_s m_s,  L = Σ_s l_s e^(m_s - M),  O_m = Σ_s acc_s e^(m_s - M) / L,
//     o = O_1 - λ O_2 (or O_1), stored in T.
//
// Split rule: enough blocks for one full wave (SMs x resident blocks per SM,
// from the occupancy calculator) over (sequences x groups x row blocks), the
// longest sequence's keys spread over that many splits, each a multiple of the
// 32-key tile and at least decode_min_split_keys keys (a shorter split would
// write and re-read more partials than the keys it reads). Every sequence
// takes as many splits of that size as its own length needs; the blocks of
// splits past it return at once.
//
// Lengths: they are in host memory, and a decoding step should not wait for
// the host, so they travel as a kernel parameter (decode_shape::lengths), not
// by an upload (which synchronises the stream): batches of more than
// decode_batch sequences run as several launches of decode_batch sequences.
// Causality is per query row: token i of sequence b sees keys t <= lengths[b]
// - T + i; keys at or past lengths[b] are never read (a cache need not be
// cleared, and may hold NaN there).
//
// Inside a split block, per tile of 32 keys:
//   1. the tile's keys (both maps) are staged in shared memory in A, each key
//      at an odd stride, so that lanes reading different keys hit different banks;
//   2. one warp per (map, row), one lane per key: the score, then the tile's
//      maximum and sum by shuffles update the row's running max and sum
//      (online softmax); the probabilities go to shared memory;
//   3. every thread owns one or two value columns (Cols) of every row and adds
//      the tile's P·V to registers, reading V straight from global memory:
//      each value is read by one thread, coalesced, and used for every row.
//
// No GPU was lent to the session that wrote these kernels: they are checked
// against the reference by tests/cuda_test.cu where a device is present, and
// the tile, the row count and the split rule rest on the reasoning above,
// not on timings.
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <span>
#include <string>

#include "difftx/core/tensor.hpp"
#include "difftx/ops/attention_decode.hpp"
#include "difftx/policy/cuda/attention.cuh"
#include "difftx/policy/cuda/attention_simt.cuh"
#include "difftx/policy/cuda/device_types.cuh"
#include "difftx/policy/cuda/elementwise.cuh"
#include "difftx/policy/cuda/tag.cuh"

namespace difftx {

namespace cuda_detail {

constexpr int decode_threads = 128;  // four warps
constexpr int decode_warps = decode_threads / 32;
constexpr int decode_tile = 32;              // keys per shared-memory tile: one per lane when scoring
constexpr int decode_rows = 16;              // query rows per block at most
constexpr int decode_min_split_keys = 128;   // the shortest split (see the top of this file)
constexpr int decode_batch = 64;             // sequences per launch: their lengths are a kernel parameter
constexpr int decode_max_d = 128;            // as attention_forward on this policy
constexpr int decode_max_dv = 2 * decode_threads;  // two value columns per thread

// One launch of both kernels: at most decode_batch sequences, from `first`.
struct decode_shape {
  int T, H, G, S, d, dv;
  int rows;            // query rows of a group: T (H / G); row r is token r / (H/G), head j (H/G) + r % (H/G)
  int block_rows;      // rows per block: min(rows, decode_rows)
  int keys_per_split;  // a multiple of decode_tile
  int max_splits;      // splits of the launch's longest sequence: the stride of the partials
  int first, count;    // the launch's sequences: first .. first + count
  int lengths[decode_batch];  // keys of sequence first + b, the new tokens' included

  __host__ __device__ int group_size() const { return H / G; }
  __host__ __device__ int splits_of(int b) const { return (lengths[b] + keys_per_split - 1) / keys_per_split; }
};

// Where the split kernel's arrays lie in its dynamic shared memory, in A.
struct decode_shared_layout {
  int k_stride;                             // maps d + 1: odd, so lanes reading keys t and t + 1 hit different banks
  int q, k, p, row_max, row_sum, rescale;   // offsets
  int size;                                 // total, in A
  __host__ __device__ decode_shared_layout(int maps, int d, int rows) {
    k_stride = maps * d + 1;
    q = 0;                                  // [maps][rows][d], times 1 / sqrt(d)
    k = q + maps * rows * d;                // [decode_tile][k_stride]: both maps of a key, side by side
    p = k + decode_tile * k_stride;         // [maps][rows][decode_tile]: the tile's probabilities
    row_max = p + maps * rows * decode_tile;  // [maps][rows], running
    row_sum = row_max + maps * rows;          // [maps][rows], running
    rescale = row_sum + maps * rows;          // [maps][rows]: e^(old max - new max) of the current tile
    size = rescale + maps * rows;
  }
};

template <class A>
__device__ __forceinline__ A warp_max(A x) {
  for (int offset = 16; offset > 0; offset /= 2) x = max_of(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// Partials of split `split` of query row `row` ([count, T, H] of the launch)
// and map m: stats [row][Maps][max_splits][2] (max, sum), acc [row][Maps][max_splits][dv].
template <int Maps>
__host__ __device__ __forceinline__ long long decode_slot(const decode_shape& s, long long row, int m, int split) {
  return (row * Maps + m) * s.max_splits + split;
}

template <int Maps, int Cols, class DT>
__global__ void __launch_bounds__(decode_threads)
    attention_decode_split(const DT* q, const DT* k, const DT* v, decode_shape s, device_accum_t<DT> scale,
                           device_accum_t<DT>* stats, device_accum_t<DT>* partial_acc) {
  using A = device_accum_t<DT>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  A* shared = reinterpret_cast<A*>(shared_bytes);
  const decode_shared_layout layout(Maps, s.d, s.block_rows);
  A *q_s = shared + layout.q, *k_s = shared + layout.k, *p_s = shared + layout.p;
  A *row_max = shared + layout.row_max, *row_sum = shared + layout.row_sum, *rescale = shared + layout.rescale;

  const int split = blockIdx.x % s.max_splits, row0 = blockIdx.x / s.max_splits * s.block_rows;
  const int j = blockIdx.y, local_b = blockIdx.z, b = s.first + local_b;
  const int length = s.lengths[local_b], key_begin = split * s.keys_per_split;
  if (key_begin >= length) return;  // a shorter sequence: it has fewer splits
  const int key_end = min(length, key_begin + s.keys_per_split);
  const int rows = min(s.block_rows, s.rows - row0), pairs = Maps * rows;  // pair = m rows + r
  const int gs = s.group_size(), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Query row r of this block: its row of [count, T, H] and its position in the sequence.
  auto output_row = [&](int r) {
    const int row = row0 + r;
    return (static_cast<long long>(local_b) * s.T + row / gs) * s.H + j * gs + row % gs;
  };
  auto position = [&](int r) { return length - s.T + (row0 + r) / gs; };

  for (int e = threadIdx.x; e < pairs * s.d; e += decode_threads) {
    const int pair = e / s.d, c = e % s.d, m = pair / rows, r = pair % rows;
    const long long row = output_row(r) + static_cast<long long>(s.first) * s.T * s.H;
    q_s[e] = to_accum(q[(row * Maps + m) * s.d + c]) * scale;
  }
  for (int pair = threadIdx.x; pair < pairs; pair += decode_threads) {
    row_max[pair] = lowest_of<A>();
    row_sum[pair] = 0;
  }
  A acc[Maps][decode_rows][Cols];
#pragma unroll
  for (int m = 0; m < Maps; ++m)
#pragma unroll
    for (int r = 0; r < decode_rows; ++r)
#pragma unroll
      for (int c = 0; c < Cols; ++c) acc[m][r][c] = 0;

  for (int t0 = key_begin; t0 < key_end; t0 += decode_tile) {
    __syncthreads();  // the last tile's keys and probabilities are read (the first time: q_s and the stats are set)
    stage_rows<DT>(k_s, layout.k_stride, Maps * s.d, t0, decode_tile, key_end,
                   [&](int t) { return k + ((static_cast<long long>(b) * s.S + t) * s.G + j) * Maps * s.d; });
    __syncthreads();

    // 2. Scores and the online softmax step, one warp per (map, row), lane = key.
    for (int pair = warp; pair < pairs; pair += decode_warps) {
      const int m = pair / rows, r = pair % rows;
      const A* q_row = q_s + pair * s.d;
      const A* k_row = k_s + lane * layout.k_stride + m * s.d;
      A dot = 0;
      for (int c = 0; c < s.d; ++c) dot += q_row[c] * k_row[c];
      const int t = t0 + lane;
      const bool visible = t < key_end && t <= position(r);
      const A old_max = row_max[pair];  // read by every lane, written by lane 0 below
      const A new_max = max_of(old_max, warp_max(visible ? dot : lowest_of<A>()));
      const A prob = visible ? exp_of(dot - new_max) : A(0);  // masked keys: 0 explicitly, never exp(-inf)
      const A tile_sum = warp_sum(prob);
      p_s[pair * decode_tile + lane] = prob;
      __syncwarp();  // every lane's read of row_max[pair] before lane 0 overwrites it (shuffles do not order memory)
      if (lane == 0) {
        const A factor = exp_of(old_max - new_max);  // 1 while the row has seen no key (both lowest)
        rescale[pair] = factor;
        row_max[pair] = new_max;
        row_sum[pair] = row_sum[pair] * factor + tile_sum;
      }
    }
    __syncthreads();

    // 3. acc = acc e^(old max - new max) + P V over the tile's keys (none past key_end is read).
#pragma unroll
    for (int m = 0; m < Maps; ++m)
#pragma unroll
      for (int r = 0; r < decode_rows; ++r)
        if (r < rows) {
          const A factor = rescale[m * rows + r];
#pragma unroll
          for (int c = 0; c < Cols; ++c) acc[m][r][c] *= factor;
        }
    const int keys = min(decode_tile, key_end - t0);
#pragma unroll 4  // four keys' value loads in flight per thread, not one
    for (int t = 0; t < keys; ++t) {
      const DT* v_row = v + ((static_cast<long long>(b) * s.S + t0 + t) * s.G + j) * s.dv;
      A value[Cols];
#pragma unroll
      for (int c = 0; c < Cols; ++c) {
        const int column = threadIdx.x + c * decode_threads;
        value[c] = column < s.dv ? to_accum(v_row[column]) : A(0);
      }
#pragma unroll
      for (int m = 0; m < Maps; ++m)
#pragma unroll
        for (int r = 0; r < decode_rows; ++r)
          if (r < rows) {
            const A prob = p_s[(m * rows + r) * decode_tile + t];
#pragma unroll
            for (int c = 0; c < Cols; ++c) acc[m][r][c] += prob * value[c];
          }
    }
  }

  // The split's partials (the stats were last written before the last __syncthreads).
#pragma unroll
  for (int m = 0; m < Maps; ++m)
#pragma unroll
    for (int r = 0; r < decode_rows; ++r)
      if (r < rows) {
        A* out = partial_acc + decode_slot<Maps>(s, output_row(r), m, split) * s.dv;
#pragma unroll
        for (int c = 0; c < Cols; ++c) {
          const int column = threadIdx.x + c * decode_threads;
          if (column < s.dv) out[column] = acc[m][r][c];
        }
      }
  for (int pair = threadIdx.x; pair < pairs; pair += decode_threads) {
    const long long slot = decode_slot<Maps>(s, output_row(pair % rows), pair / rows, split);
    stats[2 * slot] = row_max[pair];
    stats[2 * slot + 1] = row_sum[pair];
  }
}

// Both kernels for every decode_batch sequences (one launch each, at most);
// Cols: value columns per thread (1 for dv <= 128, else 2).
template <int Maps, int Cols, class DT>
void attention_decode_launch(const policy::cuda& p, const DT* q, const DT* k, const DT* v,
                             std::span<const index_t> lengths, decode_shape s, device_accum_t<DT> scale,
                             const device_accum_t<DT>* lambda, DT* o) {
  using A = device_accum_t<DT>;
  auto kernel = attention_decode_split<Maps, Cols, DT>;
  const std::size_t bytes = static_cast<std::size_t>(decode_shared_layout(Maps, s.d, s.block_rows).size) * sizeof(A);
  allow_shared_memory(kernel, bytes);
  int sms = 0, resident = 0;
  DIFFTX_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, p.context->device));
  DIFFTX_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, decode_threads, bytes));
  const long long wave = static_cast<long long>(sms) * std::max(resident, 1);  // blocks that fill the GPU once
  const int row_blocks = (s.rows + s.block_rows - 1) / s.block_rows;
  const auto batch = static_cast<index_t>(lengths.size());

  for (index_t first = 0; first < batch; first += decode_batch) {
    s.first = static_cast<int>(first);
    s.count = static_cast<int>(std::min<index_t>(decode_batch, batch - first));
    int longest = 0;
    for (int b = 0; b < s.count; ++b) {
      s.lengths[b] = static_cast<int>(lengths[static_cast<std::size_t>(first + b)]);
      longest = std::max(longest, s.lengths[b]);
    }
    // The split rule (top of this file).
    const long long blocks_per_split = static_cast<long long>(s.count) * s.G * row_blocks;
    const long long wanted_splits = std::max<long long>(1, (wave + blocks_per_split - 1) / blocks_per_split);
    const long long keys = (longest + wanted_splits - 1) / wanted_splits;
    s.keys_per_split = static_cast<int>(
        std::max<long long>(decode_min_split_keys, (keys + decode_tile - 1) / decode_tile * decode_tile));
    s.max_splits = 1;
    for (int b = 0; b < s.count; ++b) s.max_splits = std::max(s.max_splits, s.splits_of(b));

    const long long out_rows = static_cast<long long>(s.count) * s.T * s.H;
    const long long slots = out_rows * Maps * s.max_splits;
    // Zeroed (Tensor's contract), though the combine reads only slots a split block wrote.
    Tensor<A, 1> stats({2 * slots}, p.memory()), partial_acc({slots * s.dv}, p.memory());
    const dim3 grid(static_cast<unsigned>(row_blocks * s.max_splits), static_cast<unsigned>(s.G),
                    static_cast<unsigned>(s.count));
    kernel<<<grid, decode_threads, bytes, p.stream()>>>(q, k, v, s, scale, stats.data(), partial_acc.data());
    DIFFTX_CUDA_CHECK(cudaGetLastError());

    // Combine the splits of every (sequence, token, head, map) by log-sum-exp; o = O_1 - λ O_2.
    const A* st = stats.data();
    const A* pa = partial_acc.data();
    DT* out = o + static_cast<long long>(s.first) * s.T * s.H * s.dv;
    launch_for_each(p, out_rows * s.dv, [=] __device__(long long e) {
      const long long row = e / s.dv;
      const int column = static_cast<int>(e % s.dv);
      const int splits = s.splits_of(static_cast<int>(row / (static_cast<long long>(s.T) * s.H)));
      A o_map[Maps];
#pragma unroll
      for (int m = 0; m < Maps; ++m) {
        const A* split_stats = st + 2 * decode_slot<Maps>(s, row, m, 0);
        const A* split_acc = pa + decode_slot<Maps>(s, row, m, 0) * s.dv + column;
        A most = lowest_of<A>();
        for (int sp = 0; sp < splits; ++sp) most = max_of(most, split_stats[2 * sp]);
        A sum = 0, value = 0;
        for (int sp = 0; sp < splits; ++sp) {
          const A weight = exp_of(split_stats[2 * sp] - most);  // 0 for a split with no key visible to the row
          sum += weight * split_stats[2 * sp + 1];
          value += weight * split_acc[static_cast<long long>(sp) * s.dv];
        }
        o_map[m] = value / sum;
      }
      A result = o_map[0];
      if (Maps == 2) result -= lambda[0] * o_map[Maps - 1];  // a plain if: the lambda may not capture in an if constexpr
      out[e] = from_accum<DT>(result);
    });
    // stats and partial_acc are freed in stream order, after the combine has read them.
  }
}

}  // namespace cuda_detail

// q [B,T,H,Maps,d], k [B,S,G,Maps,d], v [B,S,G,dv], lengths [B] (host), lambda [1] (Maps = 2) -> o [B,T,H,dv]
template <int Maps, class T>
  requires supported_by<policy::cuda, T>
void attention_decode(const policy::cuda& p, cview<T, 5> q, cview<T, 5> k, cview<T, 4> v,
                      std::span<const index_t> lengths, cview<accum_t<T>, 1> lambda, TensorView<T, 4> o) {
  using namespace cuda_detail;
  using DT = device_t<T>;
  using A = accum_t<T>;
  static_assert(std::is_same_v<A, device_accum_t<DT>>, "lambda is in the kernels' accumulation type");
  constexpr std::string_view where = "attention_decode";
  detail::check_attention_decode<Maps>(where, memory_space::device, q, k, v, lengths, lambda, o);
  require(q.extent(4) <= decode_max_d, where, "q", "a head size d <= 128 on the CUDA policy",
          "d = " + std::to_string(q.extent(4)));
  require(v.extent(3) <= decode_max_dv, where, "v", "a value head size dv <= 256 on the CUDA policy",
          "dv = " + std::to_string(v.extent(3)));
  require(k.extent(1) <= INT_MAX && q.extent(1) * q.extent(2) <= INT_MAX, where, "k",
          "at most " + std::to_string(INT_MAX) + " cached keys and T H query rows on the CUDA policy",
          shape_string(k.shape()));

  decode_shape s{};
  s.T = static_cast<int>(q.extent(1));
  s.H = static_cast<int>(q.extent(2));
  s.G = static_cast<int>(k.extent(2));
  s.S = static_cast<int>(k.extent(1));
  s.d = static_cast<int>(q.extent(4));
  s.dv = static_cast<int>(v.extent(3));
  s.rows = s.T * s.group_size();
  s.block_rows = std::min(s.rows, decode_rows);
  const A scale = static_cast<A>(1.0 / std::sqrt(static_cast<double>(s.d)));
  const A* lam = Maps == 2 ? lambda.data() : nullptr;
  const auto* qp = device_pointer(q.data());
  const auto* kp = device_pointer(k.data());
  const auto* vp = device_pointer(v.data());
  auto* op = device_pointer(o.data());
  if (s.dv <= decode_threads)
    attention_decode_launch<Maps, 1>(p, qp, kp, vp, lengths, s, scale, lam, op);
  else
    attention_decode_launch<Maps, 2>(p, qp, kp, vp, lengths, s, scale, lam, op);
}

}  // namespace difftx
