// The CUDA attention kernels for any storage type and head size up to 128, on
// the CUDA cores in the accumulation type A = device_accum_t<DT> (float, or
// double for float64; formulas in difftx/ops/attention.hpp). They serve
// float32, float64 and every shape the tensor-core kernels (attention_mma.cuh)
// do not. Four threads share a row: each holds a quarter of the row's head
// vectors (slices of ceil(d/4); the last may be short), dot products are
// summed across the four with shuffles, and key (or query) tiles are staged in
// shared memory in A. Kernels are compiled for a largest head size MaxD (32 or
// 128) and loop over the actual one.
//
// Static shared memory stays under 48 KiB: with two maps and MaxD = 128 a
// tile of 16 rows is 16 · (2·128 + 256) values = 32 KiB in float (plus 256 B
// of lse/rowsum in the dK/dV kernel); in double the tile is 8 rows, the same
// 32 KiB (simt_tile_for<A>).
//
//   forward : per (batch row, head, 32 queries), online softmax per map over
//             key tiles of 16 (8 in double), one accumulator per map (O_2 is saved).
//   backward: rowsum(dO ⊙ O_m) and dλ first; then dK, dV per (batch row,
//             group, 32 keys) over every query of the group's heads; then dQ
//             per (batch row, head, 32 queries) over the keys. Two passes
//             recompute the scores, but nothing is shared between blocks.
#pragma once

#include <cfloat>
#include <type_traits>

#include "difftx/policy/cuda/device_types.cuh"

namespace difftx::cuda_detail {

constexpr int simt_rows = 32;  // rows (queries or keys) per block, 4 threads each
// Keys or queries staged in shared memory at a time: 16 in float, 8 in double,
// so the tiles take the same 32 KiB at MaxD = 128 (see the top of this file).
template <class A>
constexpr int simt_tile_for = std::is_same_v<A, double> ? 8 : 16;

// Sizes of one attention call, as the kernels need them.
struct attention_shape {
  int B, N, H, G, d, dv;
  bool causal;
  float scale;           // 1 / sqrt(d), for the float kernels
  double scale_double;   // 1 / sqrt(d), for the double kernels
  template <class A>
  __device__ A scale_in() const {
    if constexpr (std::is_same_v<A, double>)
      return scale_double;
    else
      return scale;
  }
  __host__ __device__ int group_size() const { return H / G; }
  // The d values of map m of head `head` at position i in a [B, N, heads, maps, d] tensor.
  template <class P>
  __device__ P* head_row(P* base, int b, int i, int heads, int head, int m, int maps) const {
    return base + (((static_cast<long long>(b) * N + i) * heads + head) * maps + m) * d;
  }
};

// Sum over the four threads of a row (lanes 4k..4k+3).
template <class A>
__device__ __forceinline__ A quad_sum(A x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

__device__ __forceinline__ bool visible(int query, int key, int N, bool causal) {
  return query < N && key < N && (!causal || key <= query);
}

// The part of a head vector of n values that one of a row's four threads owns:
// [part · size, part · size + size) with size = ceil(n / 4), cut at n.
struct quarter {
  int begin, size, n;
  __device__ quarter(int part, int n_) : begin(part * ((n_ + 3) / 4)), size((n_ + 3) / 4), n(n_) {}
  __device__ bool has(int c) const { return c < size && begin + c < n; }
};

// Copies rows [first, first + count) of `width` values into shared rows of
// `stride` in the accumulation type (zeros past N). row_pointer(r) gives the
// global address of row r.
template <class DT, class RowPointer>
__device__ void stage_rows(device_accum_t<DT>* dst, int stride, int width, int first, int count, int N,
                           RowPointer row_pointer) {
  using A = device_accum_t<DT>;
  for (int e = threadIdx.x; e < count * width; e += blockDim.x) {
    const int r = e / width, c = e % width;
    dst[r * stride + c] = first + r < N ? to_accum(row_pointer(first + r)[c]) : A(0);
  }
}

// lambda and lse are in the accumulation type A (accum_t<T> in the op's signature).
template <int Maps, int MaxD, class DT>
__global__ void __launch_bounds__(128)
    attention_forward_simt(const DT* q, const DT* k, const DT* v, const device_accum_t<DT>* lambda, attention_shape s,
                           DT* o, DT* o2, device_accum_t<DT>* lse) {
  using A = device_accum_t<DT>;
  constexpr int MaxDV = Maps * MaxD, QP = (MaxD + 3) / 4, VP = (MaxDV + 3) / 4, Tile = simt_tile_for<A>;
  __shared__ A k_tile[Maps][Tile][MaxD], v_tile[Tile][MaxDV];
  const int b = blockIdx.z, h = blockIdx.y, j = h / s.group_size();
  const int row = blockIdx.x * simt_rows + threadIdx.x / 4, part = threadIdx.x % 4;
  const quarter qd(part, s.d), qv(part, s.dv);
  const A scale = s.scale_in<A>();

  A q_part[Maps][QP], acc[Maps][VP], running_max[Maps], running_sum[Maps];
#pragma unroll
  for (int m = 0; m < Maps; ++m) {
    const DT* q_row = s.head_row(q, b, min(row, s.N - 1), s.H, h, m, Maps) + qd.begin;
#pragma unroll
    for (int c = 0; c < QP; ++c) q_part[m][c] = qd.has(c) ? to_accum(q_row[c]) * scale : A(0);
#pragma unroll
    for (int c = 0; c < VP; ++c) acc[m][c] = 0;
    running_max[m] = lowest_of<A>();
    running_sum[m] = 0;
  }

  const int last_row = min(s.N, static_cast<int>(blockIdx.x + 1) * simt_rows) - 1;
  const int key_end = s.causal ? last_row + 1 : s.N;
  for (int t0 = 0; t0 < key_end; t0 += Tile) {
    __syncthreads();
    for (int m = 0; m < Maps; ++m)
      stage_rows<DT>(&k_tile[m][0][0], MaxD, s.d, t0, Tile, s.N,
                     [&](int t) { return s.head_row(k, b, t, s.G, j, m, Maps); });
    stage_rows<DT>(&v_tile[0][0], MaxDV, s.dv, t0, Tile, s.N,
                   [&](int t) { return v + ((static_cast<long long>(b) * s.N + t) * s.G + j) * s.dv; });
    __syncthreads();
    for (int t = 0; t < Tile; ++t) {
      const bool live = visible(row, t0 + t, s.N, s.causal);
#pragma unroll
      for (int m = 0; m < Maps; ++m) {
        A dot = 0;
#pragma unroll
        for (int c = 0; c < QP; ++c)
          if (qd.has(c)) dot += q_part[m][c] * k_tile[m][t][qd.begin + c];
        const A score = quad_sum(dot);
        if (!live) continue;
        const A new_max = max_of(running_max[m], score);
        const A rescale = exp_of(running_max[m] - new_max), p = exp_of(score - new_max);
        running_sum[m] = running_sum[m] * rescale + p;
        running_max[m] = new_max;
#pragma unroll
        for (int c = 0; c < VP; ++c)
          if (qv.has(c)) acc[m][c] = acc[m][c] * rescale + p * v_tile[t][qv.begin + c];
      }
    }
  }
  if (row >= s.N) return;
  const long long out_row = ((static_cast<long long>(b) * s.N + row) * s.H + h) * s.dv + qv.begin;
#pragma unroll
  for (int c = 0; c < VP; ++c) {
    if (!qv.has(c)) continue;
    const A first = acc[0][c] / running_sum[0];
    if constexpr (Maps == 2) {
      const A second = acc[1][c] / running_sum[1];
      o[out_row + c] = from_accum<DT>(first - lambda[0] * second);
      o2[out_row + c] = from_accum<DT>(second);
    } else {
      o[out_row + c] = from_accum<DT>(first);
    }
  }
  if (part == 0)
    for (int m = 0; m < Maps; ++m)
      lse[((static_cast<long long>(b) * s.H + h) * Maps + m) * s.N + row] = running_max[m] + log_of(running_sum[m]);
}

// rowsum(dO ⊙ O_m) per row, with O_1 = O + λ O_2; dλ -= Σ rowsum(dO ⊙ O_2)
// unless dlambda is null (the tensor-core backward sums dλ itself).
// One warp per row of [B, N, H]; rowsum is [B, H, Maps, N]. lambda, rowsum and
// dlambda are in the accumulation type A (dλ: one atomicAdd in A a block,
// double too on sm_60+).
template <int Maps, class DT>
__global__ void attention_rowsums(const DT* o, const DT* o2, const DT* d_o, const device_accum_t<DT>* lambda,
                                  attention_shape s, device_accum_t<DT>* rowsum, device_accum_t<DT>* dlambda) {
  using A = device_accum_t<DT>;
  const long long row = blockIdx.x * static_cast<long long>(blockDim.x / 32) + threadIdx.x / 32;
  const bool in_range = row < static_cast<long long>(s.B) * s.N * s.H;
  const int lane = threadIdx.x % 32;
  A first = 0, second = 0;
  if (in_range) {
    for (int c = lane; c < s.dv; c += 32) {
      const A g = to_accum(d_o[row * s.dv + c]);
      first += g * to_accum(o[row * s.dv + c]);
      if constexpr (Maps == 2) second += g * to_accum(o2[row * s.dv + c]);
    }
    first = warp_sum(first);
    const int b = static_cast<int>(row / (static_cast<long long>(s.N) * s.H)), i = static_cast<int>(row / s.H % s.N),
              h = static_cast<int>(row % s.H);
    A* out = rowsum + (static_cast<long long>(b) * s.H + h) * Maps * s.N + i;
    if constexpr (Maps == 2) {
      second = warp_sum(second);
      if (lane == 0) {
        out[0] = first + lambda[0] * second;
        out[s.N] = second;
      }
    } else if (lane == 0) {
      out[0] = first;
    }
  }
  if constexpr (Maps == 2)
    if (dlambda) block_atomic_add(dlambda, -second, in_range);  // the same pointer for the whole block
}

// dK, dV of 32 keys of one group over every query that sees them.
template <int Maps, int MaxD, class DT>
__global__ void __launch_bounds__(128)
    attention_backward_dkdv_simt(const DT* q, const DT* k, const DT* v, const DT* d_o, const device_accum_t<DT>* lse,
                                 const device_accum_t<DT>* rowsum, const device_accum_t<DT>* lambda, attention_shape s,
                                 DT* dk, DT* dv) {
  using A = device_accum_t<DT>;
  constexpr int MaxDV = Maps * MaxD, QP = (MaxD + 3) / 4, VP = (MaxDV + 3) / 4, Tile = simt_tile_for<A>;
  __shared__ A q_tile[Maps][Tile][MaxD], do_tile[Tile][MaxDV], lse_tile[Maps][Tile], rowsum_tile[Maps][Tile];
  const int b = blockIdx.z, j = blockIdx.y;
  const int key = blockIdx.x * simt_rows + threadIdx.x / 4, part = threadIdx.x % 4;
  const int key_row = min(key, s.N - 1);
  const quarter qd(part, s.d), qv(part, s.dv);
  const A coeff[2] = {A(1), Maps == 2 ? -lambda[0] : A(0)};
  const A scale = s.scale_in<A>();

  A k_part[Maps][QP], v_part[VP], dk_acc[Maps][QP], dv_acc[VP];
#pragma unroll
  for (int m = 0; m < Maps; ++m) {
    const DT* k_row = s.head_row(k, b, key_row, s.G, j, m, Maps) + qd.begin;
#pragma unroll
    for (int c = 0; c < QP; ++c) {
      k_part[m][c] = qd.has(c) ? to_accum(k_row[c]) : A(0);
      dk_acc[m][c] = 0;
    }
  }
  const DT* v_row = v + ((static_cast<long long>(b) * s.N + key_row) * s.G + j) * s.dv + qv.begin;
#pragma unroll
  for (int c = 0; c < VP; ++c) {
    v_part[c] = qv.has(c) ? to_accum(v_row[c]) : A(0);
    dv_acc[c] = 0;
  }

  const int first_query = s.causal ? static_cast<int>(blockIdx.x) * simt_rows : 0;
  for (int hl = 0; hl < s.group_size(); ++hl) {
    const int h = j * s.group_size() + hl;
    for (int i0 = first_query; i0 < s.N; i0 += Tile) {
      __syncthreads();
      for (int m = 0; m < Maps; ++m)
        stage_rows<DT>(&q_tile[m][0][0], MaxD, s.d, i0, Tile, s.N,
                       [&](int i) { return s.head_row(q, b, i, s.H, h, m, Maps); });
      stage_rows<DT>(&do_tile[0][0], MaxDV, s.dv, i0, Tile, s.N,
                     [&](int i) { return d_o + ((static_cast<long long>(b) * s.N + i) * s.H + h) * s.dv; });
      for (int e = threadIdx.x; e < Maps * Tile; e += blockDim.x) {
        const int m = e / Tile, i = i0 + e % Tile;
        const long long at = ((static_cast<long long>(b) * s.H + h) * Maps + m) * s.N + i;
        lse_tile[m][e % Tile] = i < s.N ? lse[at] : A(0);
        rowsum_tile[m][e % Tile] = i < s.N ? rowsum[at] : A(0);
      }
      __syncthreads();
      for (int i = 0; i < Tile; ++i) {
        const bool live = visible(i0 + i, key, s.N, s.causal);
        A dp = 0;
#pragma unroll
        for (int c = 0; c < VP; ++c)
          if (qv.has(c)) dp += v_part[c] * do_tile[i][qv.begin + c];
        dp = quad_sum(dp);
        A p[Maps], weight = 0;
#pragma unroll
        for (int m = 0; m < Maps; ++m) {
          A dot = 0;
#pragma unroll
          for (int c = 0; c < QP; ++c)
            if (qd.has(c)) dot += k_part[m][c] * q_tile[m][i][qd.begin + c];
          const A score = quad_sum(dot) * scale;
          p[m] = live ? exp_of(score - lse_tile[m][i]) : A(0);
          weight += coeff[m] * p[m];
        }
#pragma unroll
        for (int c = 0; c < VP; ++c)
          if (qv.has(c)) dv_acc[c] += weight * do_tile[i][qv.begin + c];
#pragma unroll
        for (int m = 0; m < Maps; ++m) {
          const A ds = coeff[m] * p[m] * (dp - rowsum_tile[m][i]) * scale;
#pragma unroll
          for (int c = 0; c < QP; ++c)
            if (qd.has(c)) dk_acc[m][c] += ds * q_tile[m][i][qd.begin + c];
        }
      }
    }
  }
  if (key >= s.N) return;
#pragma unroll
  for (int m = 0; m < Maps; ++m) {
    DT* dk_row = s.head_row(dk, b, key, s.G, j, m, Maps) + qd.begin;
#pragma unroll
    for (int c = 0; c < QP; ++c)
      if (qd.has(c)) dk_row[c] = from_accum<DT>(dk_acc[m][c]);
  }
  DT* dv_row = dv + ((static_cast<long long>(b) * s.N + key) * s.G + j) * s.dv + qv.begin;
#pragma unroll
  for (int c = 0; c < VP; ++c)
    if (qv.has(c)) dv_row[c] = from_accum<DT>(dv_acc[c]);
}

// dQ of 32 queries of one head over the keys they see.
template <int Maps, int MaxD, class DT>
__global__ void __launch_bounds__(128)
    attention_backward_dq_simt(const DT* q, const DT* k, const DT* v, const DT* d_o, const device_accum_t<DT>* lse,
                               const device_accum_t<DT>* rowsum, const device_accum_t<DT>* lambda, attention_shape s,
                               DT* dq) {
  using A = device_accum_t<DT>;
  constexpr int MaxDV = Maps * MaxD, QP = (MaxD + 3) / 4, VP = (MaxDV + 3) / 4, Tile = simt_tile_for<A>;
  __shared__ A k_tile[Maps][Tile][MaxD], v_tile[Tile][MaxDV];
  const int b = blockIdx.z, h = blockIdx.y, j = h / s.group_size();
  const int row = blockIdx.x * simt_rows + threadIdx.x / 4, part = threadIdx.x % 4;
  const int query_row = min(row, s.N - 1);
  const quarter qd(part, s.d), qv(part, s.dv);
  const A coeff[2] = {A(1), Maps == 2 ? -lambda[0] : A(0)};
  const A scale = s.scale_in<A>();

  A q_part[Maps][QP], do_part[VP], dq_acc[Maps][QP], row_lse[Maps], row_sum[Maps];
#pragma unroll
  for (int m = 0; m < Maps; ++m) {
    const DT* q_row = s.head_row(q, b, query_row, s.H, h, m, Maps) + qd.begin;
#pragma unroll
    for (int c = 0; c < QP; ++c) {
      q_part[m][c] = qd.has(c) ? to_accum(q_row[c]) : A(0);
      dq_acc[m][c] = 0;
    }
    const long long at = ((static_cast<long long>(b) * s.H + h) * Maps + m) * s.N + query_row;
    row_lse[m] = lse[at];
    row_sum[m] = rowsum[at];
  }
  const DT* do_row = d_o + ((static_cast<long long>(b) * s.N + query_row) * s.H + h) * s.dv + qv.begin;
#pragma unroll
  for (int c = 0; c < VP; ++c) do_part[c] = qv.has(c) ? to_accum(do_row[c]) : A(0);

  const int last_row = min(s.N, static_cast<int>(blockIdx.x + 1) * simt_rows) - 1;
  const int key_end = s.causal ? last_row + 1 : s.N;
  for (int t0 = 0; t0 < key_end; t0 += Tile) {
    __syncthreads();
    for (int m = 0; m < Maps; ++m)
      stage_rows<DT>(&k_tile[m][0][0], MaxD, s.d, t0, Tile, s.N,
                     [&](int t) { return s.head_row(k, b, t, s.G, j, m, Maps); });
    stage_rows<DT>(&v_tile[0][0], MaxDV, s.dv, t0, Tile, s.N,
                   [&](int t) { return v + ((static_cast<long long>(b) * s.N + t) * s.G + j) * s.dv; });
    __syncthreads();
    for (int t = 0; t < Tile; ++t) {
      const bool live = visible(row, t0 + t, s.N, s.causal);
      A dp = 0;
#pragma unroll
      for (int c = 0; c < VP; ++c)
        if (qv.has(c)) dp += do_part[c] * v_tile[t][qv.begin + c];
      dp = quad_sum(dp);
#pragma unroll
      for (int m = 0; m < Maps; ++m) {
        A dot = 0;
#pragma unroll
        for (int c = 0; c < QP; ++c)
          if (qd.has(c)) dot += q_part[m][c] * k_tile[m][t][qd.begin + c];
        const A score = quad_sum(dot) * scale;
        const A p = live ? exp_of(score - row_lse[m]) : A(0);
        const A ds = coeff[m] * p * (dp - row_sum[m]) * scale;
#pragma unroll
        for (int c = 0; c < QP; ++c)
          if (qd.has(c)) dq_acc[m][c] += ds * k_tile[m][t][qd.begin + c];
      }
    }
  }
  if (row >= s.N) return;
#pragma unroll
  for (int m = 0; m < Maps; ++m) {
    DT* dq_row = s.head_row(dq, b, row, s.H, h, m, Maps) + qd.begin;
#pragma unroll
    for (int c = 0; c < QP; ++c)
      if (qd.has(c)) dq_row[c] = from_accum<DT>(dq_acc[m][c]);
  }
}

}  // namespace difftx::cuda_detail
