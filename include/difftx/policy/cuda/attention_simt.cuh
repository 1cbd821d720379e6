// The CUDA attention kernels for any storage type and head size up to 128, in
// float arithmetic on the CUDA cores (formulas in difftx/ops/attention.hpp).
// They serve float32 and every shape the tensor-core kernels
// (attention_mma.cuh) do not. Four threads share a row: each holds a quarter of
// the row's head vectors (slices of ceil(d/4); the last may be short), dot
// products are summed across the four with shuffles, and key (or query) tiles
// are staged in shared memory as float. Kernels are compiled for a largest head
// size MaxD (32 or 128) and loop over the actual one.
//
//   forward : per (batch row, head, 32 queries), online softmax per map over
//             key tiles of 16, one accumulator per map (O_2 is saved).
//   backward: rowsum(dO ⊙ O_m) and dλ first; then dK, dV per (batch row,
//             group, 32 keys) over every query of the group's heads; then dQ
//             per (batch row, head, 32 queries) over the keys. Two passes
//             recompute the scores, but nothing is shared between blocks.
#pragma once

#include <cfloat>

#include "difftx/policy/cuda/device_types.cuh"

namespace difftx::cuda_detail {

constexpr int simt_rows = 32;  // rows (queries or keys) per block, 4 threads each
constexpr int simt_tile = 16;  // keys or queries staged in shared memory at a time

// Sizes of one attention call, as the kernels need them.
struct attention_shape {
  int B, N, H, G, d, dv;
  bool causal;
  float scale;  // 1 / sqrt(d)
  __host__ __device__ int group_size() const { return H / G; }
  // The d values of map m of head `head` at position i in a [B, N, heads, maps, d] tensor.
  template <class P>
  __device__ P* head_row(P* base, int b, int i, int heads, int head, int m, int maps) const {
    return base + (((static_cast<long long>(b) * N + i) * heads + head) * maps + m) * d;
  }
};

// Sum over the four threads of a row (lanes 4k..4k+3).
__device__ __forceinline__ float quad_sum(float x) {
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

// Copies rows [first, first + count) of `width` values into shared float rows
// of `stride` (zeros past N). row_pointer(r) gives the global address of row r.
template <class DT, class RowPointer>
__device__ void stage_rows(float* dst, int stride, int width, int first, int count, int N, RowPointer row_pointer) {
  for (int e = threadIdx.x; e < count * width; e += blockDim.x) {
    const int r = e / width, c = e % width;
    dst[r * stride + c] = first + r < N ? to_float(row_pointer(first + r)[c]) : 0.0f;
  }
}

template <int Maps, int MaxD, class DT>
__global__ void __launch_bounds__(128) attention_forward_simt(const DT* q, const DT* k, const DT* v, const float* lambda,
                                                              attention_shape s, DT* o, DT* o2, float* lse) {
  constexpr int MaxDV = Maps * MaxD, QP = (MaxD + 3) / 4, VP = (MaxDV + 3) / 4;
  __shared__ float k_tile[Maps][simt_tile][MaxD], v_tile[simt_tile][MaxDV];
  const int b = blockIdx.z, h = blockIdx.y, j = h / s.group_size();
  const int row = blockIdx.x * simt_rows + threadIdx.x / 4, part = threadIdx.x % 4;
  const quarter qd(part, s.d), qv(part, s.dv);

  float q_part[Maps][QP], acc[Maps][VP], running_max[Maps], running_sum[Maps];
#pragma unroll
  for (int m = 0; m < Maps; ++m) {
    const DT* q_row = s.head_row(q, b, min(row, s.N - 1), s.H, h, m, Maps) + qd.begin;
#pragma unroll
    for (int c = 0; c < QP; ++c) q_part[m][c] = qd.has(c) ? to_float(q_row[c]) * s.scale : 0.0f;
#pragma unroll
    for (int c = 0; c < VP; ++c) acc[m][c] = 0;
    running_max[m] = -FLT_MAX;
    running_sum[m] = 0;
  }

  const int last_row = min(s.N, static_cast<int>(blockIdx.x + 1) * simt_rows) - 1;
  const int key_end = s.causal ? last_row + 1 : s.N;
  for (int t0 = 0; t0 < key_end; t0 += simt_tile) {
    __syncthreads();
    for (int m = 0; m < Maps; ++m)
      stage_rows<DT>(&k_tile[m][0][0], MaxD, s.d, t0, simt_tile, s.N,
                     [&](int t) { return s.head_row(k, b, t, s.G, j, m, Maps); });
    stage_rows<DT>(&v_tile[0][0], MaxDV, s.dv, t0, simt_tile, s.N,
                   [&](int t) { return v + ((static_cast<long long>(b) * s.N + t) * s.G + j) * s.dv; });
    __syncthreads();
    for (int t = 0; t < simt_tile; ++t) {
      const bool live = visible(row, t0 + t, s.N, s.causal);
#pragma unroll
      for (int m = 0; m < Maps; ++m) {
        float dot = 0;
#pragma unroll
        for (int c = 0; c < QP; ++c)
          if (qd.has(c)) dot += q_part[m][c] * k_tile[m][t][qd.begin + c];
        const float score = quad_sum(dot);
        if (!live) continue;
        const float new_max = fmaxf(running_max[m], score);
        const float rescale = expf(running_max[m] - new_max), p = expf(score - new_max);
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
    const float first = acc[0][c] / running_sum[0];
    if constexpr (Maps == 2) {
      const float second = acc[1][c] / running_sum[1];
      o[out_row + c] = from_float<DT>(first - lambda[0] * second);
      o2[out_row + c] = from_float<DT>(second);
    } else {
      o[out_row + c] = from_float<DT>(first);
    }
  }
  if (part == 0)
    for (int m = 0; m < Maps; ++m)
      lse[((static_cast<long long>(b) * s.H + h) * Maps + m) * s.N + row] = running_max[m] + logf(running_sum[m]);
}

// rowsum(dO ⊙ O_m) per row, with O_1 = O + λ O_2; dλ -= Σ rowsum(dO ⊙ O_2).
// One warp per row of [B, N, H]; rowsum is [B, H, Maps, N].
template <int Maps, class DT>
__global__ void attention_rowsums(const DT* o, const DT* o2, const DT* d_o, const float* lambda, attention_shape s,
                                  float* rowsum, float* dlambda) {
  const long long row = blockIdx.x * static_cast<long long>(blockDim.x / 32) + threadIdx.x / 32;
  if (row >= static_cast<long long>(s.B) * s.N * s.H) return;
  const int lane = threadIdx.x % 32;
  float first = 0, second = 0;
  for (int c = lane; c < s.dv; c += 32) {
    const float g = to_float(d_o[row * s.dv + c]);
    first += g * to_float(o[row * s.dv + c]);
    if constexpr (Maps == 2) second += g * to_float(o2[row * s.dv + c]);
  }
  first = warp_sum(first);
  const int b = static_cast<int>(row / (static_cast<long long>(s.N) * s.H)), i = static_cast<int>(row / s.H % s.N),
            h = static_cast<int>(row % s.H);
  float* out = rowsum + (static_cast<long long>(b) * s.H + h) * Maps * s.N + i;
  if constexpr (Maps == 2) {
    second = warp_sum(second);
    if (lane == 0) {
      out[0] = first + lambda[0] * second;
      out[s.N] = second;
      atomicAdd(dlambda, -second);
    }
  } else if (lane == 0) {
    out[0] = first;
  }
}

// dK, dV of 32 keys of one group over every query that sees them.
template <int Maps, int MaxD, class DT>
__global__ void __launch_bounds__(128) attention_backward_dkdv_simt(const DT* q, const DT* k, const DT* v,
                                                                    const DT* d_o, const float* lse,
                                                                    const float* rowsum, const float* lambda,
                                                                    attention_shape s, DT* dk, DT* dv) {
  constexpr int MaxDV = Maps * MaxD, QP = (MaxD + 3) / 4, VP = (MaxDV + 3) / 4;
  __shared__ float q_tile[Maps][simt_tile][MaxD], do_tile[simt_tile][MaxDV], lse_tile[Maps][simt_tile],
      rowsum_tile[Maps][simt_tile];
  const int b = blockIdx.z, j = blockIdx.y;
  const int key = blockIdx.x * simt_rows + threadIdx.x / 4, part = threadIdx.x % 4;
  const int key_row = min(key, s.N - 1);
  const quarter qd(part, s.d), qv(part, s.dv);
  const float coeff[2] = {1.0f, Maps == 2 ? -lambda[0] : 0.0f};

  float k_part[Maps][QP], v_part[VP], dk_acc[Maps][QP], dv_acc[VP];
#pragma unroll
  for (int m = 0; m < Maps; ++m) {
    const DT* k_row = s.head_row(k, b, key_row, s.G, j, m, Maps) + qd.begin;
#pragma unroll
    for (int c = 0; c < QP; ++c) {
      k_part[m][c] = qd.has(c) ? to_float(k_row[c]) : 0.0f;
      dk_acc[m][c] = 0;
    }
  }
  const DT* v_row = v + ((static_cast<long long>(b) * s.N + key_row) * s.G + j) * s.dv + qv.begin;
#pragma unroll
  for (int c = 0; c < VP; ++c) {
    v_part[c] = qv.has(c) ? to_float(v_row[c]) : 0.0f;
    dv_acc[c] = 0;
  }

  const int first_query = s.causal ? static_cast<int>(blockIdx.x) * simt_rows : 0;
  for (int hl = 0; hl < s.group_size(); ++hl) {
    const int h = j * s.group_size() + hl;
    for (int i0 = first_query; i0 < s.N; i0 += simt_tile) {
      __syncthreads();
      for (int m = 0; m < Maps; ++m)
        stage_rows<DT>(&q_tile[m][0][0], MaxD, s.d, i0, simt_tile, s.N,
                       [&](int i) { return s.head_row(q, b, i, s.H, h, m, Maps); });
      stage_rows<DT>(&do_tile[0][0], MaxDV, s.dv, i0, simt_tile, s.N,
                     [&](int i) { return d_o + ((static_cast<long long>(b) * s.N + i) * s.H + h) * s.dv; });
      for (int e = threadIdx.x; e < Maps * simt_tile; e += blockDim.x) {
        const int m = e / simt_tile, i = i0 + e % simt_tile;
        const long long at = ((static_cast<long long>(b) * s.H + h) * Maps + m) * s.N + i;
        lse_tile[m][e % simt_tile] = i < s.N ? lse[at] : 0.0f;
        rowsum_tile[m][e % simt_tile] = i < s.N ? rowsum[at] : 0.0f;
      }
      __syncthreads();
      for (int i = 0; i < simt_tile; ++i) {
        const bool live = visible(i0 + i, key, s.N, s.causal);
        float dp = 0;
#pragma unroll
        for (int c = 0; c < VP; ++c)
          if (qv.has(c)) dp += v_part[c] * do_tile[i][qv.begin + c];
        dp = quad_sum(dp);
        float p[Maps], weight = 0;
#pragma unroll
        for (int m = 0; m < Maps; ++m) {
          float dot = 0;
#pragma unroll
          for (int c = 0; c < QP; ++c)
            if (qd.has(c)) dot += k_part[m][c] * q_tile[m][i][qd.begin + c];
          const float score = quad_sum(dot) * s.scale;
          p[m] = live ? expf(score - lse_tile[m][i]) : 0.0f;
          weight += coeff[m] * p[m];
        }
#pragma unroll
        for (int c = 0; c < VP; ++c)
          if (qv.has(c)) dv_acc[c] += weight * do_tile[i][qv.begin + c];
#pragma unroll
        for (int m = 0; m < Maps; ++m) {
          const float ds = coeff[m] * p[m] * (dp - rowsum_tile[m][i]) * s.scale;
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
      if (qd.has(c)) dk_row[c] = from_float<DT>(dk_acc[m][c]);
  }
  DT* dv_row = dv + ((static_cast<long long>(b) * s.N + key) * s.G + j) * s.dv + qv.begin;
#pragma unroll
  for (int c = 0; c < VP; ++c)
    if (qv.has(c)) dv_row[c] = from_float<DT>(dv_acc[c]);
}

// dQ of 32 queries of one head over the keys they see.
template <int Maps, int MaxD, class DT>
__global__ void __launch_bounds__(128) attention_backward_dq_simt(const DT* q, const DT* k, const DT* v, const DT* d_o,
                                                                  const float* lse, const float* rowsum,
                                                                  const float* lambda, attention_shape s, DT* dq) {
  constexpr int MaxDV = Maps * MaxD, QP = (MaxD + 3) / 4, VP = (MaxDV + 3) / 4;
  __shared__ float k_tile[Maps][simt_tile][MaxD], v_tile[simt_tile][MaxDV];
  const int b = blockIdx.z, h = blockIdx.y, j = h / s.group_size();
  const int row = blockIdx.x * simt_rows + threadIdx.x / 4, part = threadIdx.x % 4;
  const int query_row = min(row, s.N - 1);
  const quarter qd(part, s.d), qv(part, s.dv);
  const float coeff[2] = {1.0f, Maps == 2 ? -lambda[0] : 0.0f};

  float q_part[Maps][QP], do_part[VP], dq_acc[Maps][QP], row_lse[Maps], row_sum[Maps];
#pragma unroll
  for (int m = 0; m < Maps; ++m) {
    const DT* q_row = s.head_row(q, b, query_row, s.H, h, m, Maps) + qd.begin;
#pragma unroll
    for (int c = 0; c < QP; ++c) {
      q_part[m][c] = qd.has(c) ? to_float(q_row[c]) : 0.0f;
      dq_acc[m][c] = 0;
    }
    const long long at = ((static_cast<long long>(b) * s.H + h) * Maps + m) * s.N + query_row;
    row_lse[m] = lse[at];
    row_sum[m] = rowsum[at];
  }
  const DT* do_row = d_o + ((static_cast<long long>(b) * s.N + query_row) * s.H + h) * s.dv + qv.begin;
#pragma unroll
  for (int c = 0; c < VP; ++c) do_part[c] = qv.has(c) ? to_float(do_row[c]) : 0.0f;

  const int last_row = min(s.N, static_cast<int>(blockIdx.x + 1) * simt_rows) - 1;
  const int key_end = s.causal ? last_row + 1 : s.N;
  for (int t0 = 0; t0 < key_end; t0 += simt_tile) {
    __syncthreads();
    for (int m = 0; m < Maps; ++m)
      stage_rows<DT>(&k_tile[m][0][0], MaxD, s.d, t0, simt_tile, s.N,
                     [&](int t) { return s.head_row(k, b, t, s.G, j, m, Maps); });
    stage_rows<DT>(&v_tile[0][0], MaxDV, s.dv, t0, simt_tile, s.N,
                   [&](int t) { return v + ((static_cast<long long>(b) * s.N + t) * s.G + j) * s.dv; });
    __syncthreads();
    for (int t = 0; t < simt_tile; ++t) {
      const bool live = visible(row, t0 + t, s.N, s.causal);
      float dp = 0;
#pragma unroll
      for (int c = 0; c < VP; ++c)
        if (qv.has(c)) dp += do_part[c] * v_tile[t][qv.begin + c];
      dp = quad_sum(dp);
#pragma unroll
      for (int m = 0; m < Maps; ++m) {
        float dot = 0;
#pragma unroll
        for (int c = 0; c < QP; ++c)
          if (qd.has(c)) dot += q_part[m][c] * k_tile[m][t][qd.begin + c];
        const float score = quad_sum(dot) * s.scale;
        const float p = live ? expf(score - row_lse[m]) : 0.0f;
        const float ds = coeff[m] * p * (dp - row_sum[m]) * s.scale;
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
      if (qd.has(c)) dq_row[c] = from_float<DT>(dq_acc[m][c]);
  }
}

}  // namespace difftx::cuda_detail
