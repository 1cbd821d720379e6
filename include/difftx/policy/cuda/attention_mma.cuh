// Tensor-core attention for float16 and bfloat16 with head sizes 64 and 128
// (formulas in difftx/ops/attention.hpp), on mma.sync.m16n8k16 with float
// accumulators, the FlashAttention-2 schedule extended to two maps.
//
// Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4):
//   A 16x16 row-major: a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B 16x8 "col":      b0 (k 2t..2t+1, n g), b1 (k 2t+8..2t+9, n g)
//   C 16x8:            c0,c1 (g, 2t..2t+1), c2,c3 (g+8, 2t..2t+1)
// so the C fragments of two neighbouring 8-column tiles are, packed to 16 bits,
// the A fragment of a 16-wide k step: probabilities go from S to P·V without
// shared memory.
//
// Forward, one block per (batch row, head, 64 queries): warps own 16 query rows
// and a slice of up to 128 value columns (two slices for D = 128 with two maps;
// those warps both compute their rows' scores). Per key tile of 64: S_m = Q_m
// K_m^T, online softmax in registers (base-2 exponent, scale folded in), then
// O_m += P_m V for each map in turn; O_1, O_2 stay in registers.
//
// Backward, one block per (batch row, group, 64 keys): warps own 16 keys and a
// slice of dV's and dK's columns; over every query block of every head of the
// group, S^T = K Q^T and dP^T = V dO^T (keys as rows, so dK and dV accumulate
// in registers), dS^T = c P^T ⊙ (dP^T - D) goes through shared memory to form
// dQ = dS K for the block's 64 queries, added to a float dQ with atomics.
// With two maps the kernel also sums dλ = -Σ P_2 ⊙ dP_2 from P_2 and dP in
// float registers: the forward's O_2, from which attention_rowsums would take
// dλ = -Σ dO ⊙ O_2, rests on P_2 rounded to 16 bits for the tensor cores, and
// that rounding, summed over every query and key, biased bfloat16's dλ to
// 0.21 relative error where the exact O_2 gives 0.09 (a float64 model of the
// two on test_cuda.py's inputs).
// (One file, a little over 450 lines: the two kernels share the fragment
// layouts above and their helpers, and read best next to each other.)
#pragma once

#include <cfloat>
#include <cstdint>

#include "difftx/policy/cuda/attention_simt.cuh"

namespace difftx::cuda_detail {

constexpr int mma_block = 64;  // queries and keys per tile
constexpr int mma_pad = 8;     // elements of padding per shared row: conflict-free fragment loads

template <class DT>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<DT, __nv_bfloat16>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two floats as two 16-bit values in one register, the first in the low half.
template <class DT>
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  DT pair[2] = {from_float<DT>(lo), from_float<DT>(hi)};
  return *reinterpret_cast<const uint32_t*>(pair);
}
// Two consecutive 16-bit values of a row.
template <class DT>
__device__ __forceinline__ uint32_t load_pair(const DT* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
// Two 16-bit values one row apart (the k direction of a row-major B operand).
template <class DT>
__device__ __forceinline__ uint32_t load_column_pair(const DT* p, int row_stride) {
  const auto lo = *reinterpret_cast<const uint16_t*>(p), hi = *reinterpret_cast<const uint16_t*>(p + row_stride);
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

// A fragment of rows [r0, r0 + 16) and columns [k0, k0 + 16) of a row-major tile.
template <class DT>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const DT* tile, int stride, int r0, int k0) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  a[0] = load_pair(tile + (r0 + g) * stride + k0 + 2 * t);
  a[1] = load_pair(tile + (r0 + g + 8) * stride + k0 + 2 * t);
  a[2] = load_pair(tile + (r0 + g) * stride + k0 + 2 * t + 8);
  a[3] = load_pair(tile + (r0 + g + 8) * stride + k0 + 2 * t + 8);
}
// A fragment of A = X^T for a row-major tile X: rows of A are columns of X.
template <class DT>
__device__ __forceinline__ void load_a_transposed(uint32_t (&a)[4], const DT* tile, int stride, int r0, int k0) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  a[0] = load_column_pair(tile + (k0 + 2 * t) * stride + r0 + g, stride);
  a[1] = load_column_pair(tile + (k0 + 2 * t) * stride + r0 + g + 8, stride);
  a[2] = load_column_pair(tile + (k0 + 2 * t + 8) * stride + r0 + g, stride);
  a[3] = load_column_pair(tile + (k0 + 2 * t + 8) * stride + r0 + g + 8, stride);
}
// B fragment (k in [k0, k0 + 16), n in [n0, n0 + 8)) of B = X^T for a row-major
// tile X[n][k] (keys or queries by row, the head vector along the row).
template <class DT>
__device__ __forceinline__ void load_b_rows(uint32_t (&b)[2], const DT* tile, int stride, int k0, int n0) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  b[0] = load_pair(tile + (n0 + g) * stride + k0 + 2 * t);
  b[1] = load_pair(tile + (n0 + g) * stride + k0 + 2 * t + 8);
}
// B fragment of B = X for a row-major tile X[k][n].
template <class DT>
__device__ __forceinline__ void load_b_columns(uint32_t (&b)[2], const DT* tile, int stride, int k0, int n0) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  b[0] = load_column_pair(tile + (k0 + 2 * t) * stride + n0 + g, stride);
  b[1] = load_column_pair(tile + (k0 + 2 * t + 8) * stride + n0 + g, stride);
}
// The A fragment of k step s from C fragments c[2s], c[2s+1] (16-bit packed).
template <class DT, int Tiles>
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&c)[Tiles][4], int step) {
  a[0] = pack<DT>(c[2 * step][0], c[2 * step][1]);
  a[1] = pack<DT>(c[2 * step][2], c[2 * step][3]);
  a[2] = pack<DT>(c[2 * step + 1][0], c[2 * step + 1][1]);
  a[3] = pack<DT>(c[2 * step + 1][2], c[2 * step + 1][3]);
}

// Copies `rows` rows of `width` 16-bit values into a padded shared tile with
// 16-byte loads; rows past `valid` become zeros. row_pointer(r) is row r's address.
template <class DT, class RowPointer>
__device__ void stage_tile(DT* tile, int stride, int rows, int width, int valid, RowPointer row_pointer) {
  const int chunks = width / 8;  // 8 values in 16 bytes
  for (int e = threadIdx.x; e < rows * chunks; e += blockDim.x) {
    const int r = e / chunks, c = e % chunks * 8;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (r < valid) value = *reinterpret_cast<const uint4*>(row_pointer(r) + c);
    *reinterpret_cast<uint4*>(tile + r * stride + c) = value;
  }
}

template <int Maps, int D>
struct mma_config {
  static constexpr int DV = Maps * D;
  static constexpr int columns = DV < 128 ? DV : 128;  // value columns per warp
  static constexpr int slices = DV / columns;          // warps sharing 16 rows
  static constexpr int warps = 4 * slices;
  static constexpr int threads = 32 * warps;
  static constexpr int d_columns = D / slices;  // dK columns per warp in the backward
  static constexpr int QS = D + mma_pad, VS = DV + mma_pad;  // shared row strides
};

template <int Maps, int D, class DT>
__global__ void __launch_bounds__(mma_config<Maps, D>::threads) attention_forward_mma(
    const DT* q, const DT* k, const DT* v, const float* lambda, attention_shape s, DT* o, DT* o2, float* lse) {
  using C = mma_config<Maps, D>;
  constexpr int QS = C::QS, VS = C::VS, DV = C::DV, NT = C::columns / 8;
  constexpr float log2e = 1.4426950408889634f;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  DT* q_tile = reinterpret_cast<DT*>(shared_bytes);  // [Maps][64][QS]
  DT* k_tile = q_tile + Maps * mma_block * QS;       // [Maps][64][QS]
  DT* v_tile = k_tile + Maps * mma_block * QS;       // [64][VS]

  const int b = blockIdx.z, h = blockIdx.y, j = h / s.group_size(), i0 = blockIdx.x * mma_block;
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const int r0 = warp % 4 * 16, c0 = warp / 4 * C::columns;  // this warp's rows and value columns
  const float scale_log2 = s.scale * log2e;

  #pragma unroll
  for (int m = 0; m < Maps; ++m)
    stage_tile(q_tile + m * mma_block * QS, QS, mma_block, D, s.N - i0, [&](int r) {
      return q + ((static_cast<long long>(b) * s.N + i0 + r) * s.H + h) * Maps * D + m * D;
    });

  float acc[Maps][NT][4] = {}, running_max[Maps][2], running_sum[Maps][2] = {};
  #pragma unroll
  for (int m = 0; m < Maps; ++m) running_max[m][0] = running_max[m][1] = -FLT_MAX;

  const int blocks = (s.N + mma_block - 1) / mma_block;
  const int kb_end = s.causal ? blockIdx.x + 1 : blocks;
  for (int kb = 0; kb < kb_end; ++kb) {
    const int t0 = kb * mma_block;
    __syncthreads();  // every warp is done with the previous K and V tiles (and Q is staged)
    #pragma unroll
    for (int m = 0; m < Maps; ++m)
      stage_tile(k_tile + m * mma_block * QS, QS, mma_block, D, s.N - t0, [&](int r) {
        return k + ((static_cast<long long>(b) * s.N + t0 + r) * s.G + j) * Maps * D + m * D;
      });
    stage_tile(v_tile, VS, mma_block, DV, s.N - t0,
               [&](int r) { return v + ((static_cast<long long>(b) * s.N + t0 + r) * s.G + j) * DV; });
    __syncthreads();

    #pragma unroll
    for (int m = 0; m < Maps; ++m) {
      // S = Q_m K_m^T for 16 rows x 64 keys, in log2 units.
      float score[8][4] = {};
      #pragma unroll
      for (int k0 = 0; k0 < D; k0 += 16) {
        uint32_t a[4];
        load_a(a, q_tile + m * mma_block * QS, QS, r0, k0);
        #pragma unroll
        for (int n = 0; n < 8; ++n) {
          uint32_t bf[2];
          load_b_rows(bf, k_tile + m * mma_block * QS, QS, k0, n * 8);
          mma_16816<DT>(score[n], a, bf);
        }
      }
      float tile_max[2] = {-FLT_MAX, -FLT_MAX};
      #pragma unroll
      for (int n = 0; n < 8; ++n)
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = i0 + r0 + g + (e / 2) * 8, key = t0 + n * 8 + 2 * t + e % 2;
          score[n][e] = visible(row, key, s.N, s.causal) ? score[n][e] * scale_log2 : -FLT_MAX;
          tile_max[e / 2] = fmaxf(tile_max[e / 2], score[n][e]);
        }
      float rescale[2];
      #pragma unroll
      for (int half = 0; half < 2; ++half) {
        tile_max[half] = fmaxf(tile_max[half], __shfl_xor_sync(0xffffffffu, tile_max[half], 1));
        tile_max[half] = fmaxf(tile_max[half], __shfl_xor_sync(0xffffffffu, tile_max[half], 2));
        const float new_max = fmaxf(running_max[m][half], tile_max[half]);
        rescale[half] = exp2f(running_max[m][half] - new_max);
        running_max[m][half] = new_max;
        running_sum[m][half] *= rescale[half];
      }
      #pragma unroll
      for (int n = 0; n < 8; ++n)
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float p = score[n][e] == -FLT_MAX ? 0.0f : exp2f(score[n][e] - running_max[m][e / 2]);
          score[n][e] = p;
          running_sum[m][e / 2] += p;  // this thread's part; the quad is summed at the end
        }
      #pragma unroll
      for (int n = 0; n < NT; ++n)
        #pragma unroll
        for (int e = 0; e < 4; ++e) acc[m][n][e] *= rescale[e / 2];
      // O_m += P V for this warp's value columns.
      #pragma unroll
      for (int step = 0; step < 4; ++step) {
        uint32_t a[4];
        c_to_a<DT>(a, score, step);
        #pragma unroll
        for (int n = 0; n < NT; ++n) {
          uint32_t bf[2];
          load_b_columns(bf, v_tile, VS, step * 16, c0 + n * 8);
          mma_16816<DT>(acc[m][n], a, bf);
        }
      }
    }
  }

  #pragma unroll
  for (int m = 0; m < Maps; ++m)
    #pragma unroll
    for (int half = 0; half < 2; ++half) {
      running_sum[m][half] += __shfl_xor_sync(0xffffffffu, running_sum[m][half], 1);
      running_sum[m][half] += __shfl_xor_sync(0xffffffffu, running_sum[m][half], 2);
    }
  const float lam = Maps == 2 ? lambda[0] : 0.0f;
  #pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = i0 + r0 + g + half * 8;
    if (row >= s.N) continue;
    const long long out_row = ((static_cast<long long>(b) * s.N + row) * s.H + h) * DV;
    #pragma unroll
    for (int n = 0; n < NT; ++n)
      #pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = c0 + n * 8 + 2 * t + e;
        const float first = acc[0][n][half * 2 + e] / running_sum[0][half];
        if constexpr (Maps == 2) {
          const float second = acc[1][n][half * 2 + e] / running_sum[1][half];
          o[out_row + col] = from_float<DT>(first - lam * second);
          o2[out_row + col] = from_float<DT>(second);
        } else {
          o[out_row + col] = from_float<DT>(first);
        }
      }
    if (t == 0 && c0 == 0)
      #pragma unroll
      for (int m = 0; m < Maps; ++m)
        lse[((static_cast<long long>(b) * s.H + h) * Maps + m) * s.N + row] =
            (running_max[m][half] + log2f(running_sum[m][half])) / log2e;
  }
}

template <int Maps, int D, class DT>
__global__ void __launch_bounds__(mma_config<Maps, D>::threads) attention_backward_mma(
    const DT* q, const DT* k, const DT* v, const DT* d_o, const float* lse, const float* rowsum, const float* lambda,
    attention_shape s, DT* dk, DT* dv, float* dq_accum, float* dlambda) {
  using C = mma_config<Maps, D>;
  constexpr int QS = C::QS, VS = C::VS, DV = C::DV, NV = C::columns / 8, NK = C::d_columns / 8;
  constexpr int SS = mma_block + mma_pad;  // stride of the dS^T tiles
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  DT* k_tile = reinterpret_cast<DT*>(shared_bytes);  // [Maps][64 keys][QS]
  DT* v_tile = k_tile + Maps * mma_block * QS;       // [64 keys][VS]
  DT* q_tile = v_tile + mma_block * VS;              // [Maps][64 queries][QS]
  DT* do_tile = q_tile + Maps * mma_block * QS;      // [64 queries][VS]
  DT* ds_tile = do_tile + mma_block * VS;            // [Maps][64 keys][SS]: dS^T, scaled
  float* lse_tile = reinterpret_cast<float*>(ds_tile + Maps * mma_block * SS);  // [Maps][64]
  float* rowsum_tile = lse_tile + Maps * mma_block;                              // [Maps][64]

  const int b = blockIdx.z, j = blockIdx.y, t0 = blockIdx.x * mma_block;
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const int r0 = warp % 4 * 16, slice = warp / 4;  // this warp's 16 keys and column slice
  const float coeff[2] = {1.0f, Maps == 2 ? -lambda[0] : 0.0f};

  #pragma unroll
  for (int m = 0; m < Maps; ++m)
    stage_tile(k_tile + m * mma_block * QS, QS, mma_block, D, s.N - t0, [&](int r) {
      return k + ((static_cast<long long>(b) * s.N + t0 + r) * s.G + j) * Maps * D + m * D;
    });
  stage_tile(v_tile, VS, mma_block, DV, s.N - t0,
             [&](int r) { return v + ((static_cast<long long>(b) * s.N + t0 + r) * s.G + j) * DV; });

  float dv_acc[NV][4] = {}, dk_acc[Maps][NK][4] = {};
  [[maybe_unused]] float second_dot = 0.0f;  // Σ P_2 ⊙ dP_2 over this thread's scores (slice 0's warps: the others repeat them)
  const int blocks = (s.N + mma_block - 1) / mma_block;
  for (int hl = 0; hl < s.group_size(); ++hl) {
    const int h = j * s.group_size() + hl;
    for (int qb = s.causal ? blockIdx.x : 0; qb < blocks; ++qb) {
      const int i0 = qb * mma_block;
      __syncthreads();  // the previous query tiles and dS^T are no longer read
      #pragma unroll
      for (int m = 0; m < Maps; ++m)
        stage_tile(q_tile + m * mma_block * QS, QS, mma_block, D, s.N - i0, [&](int r) {
          return q + ((static_cast<long long>(b) * s.N + i0 + r) * s.H + h) * Maps * D + m * D;
        });
      stage_tile(do_tile, VS, mma_block, DV, s.N - i0,
                 [&](int r) { return d_o + ((static_cast<long long>(b) * s.N + i0 + r) * s.H + h) * DV; });
      for (int e = threadIdx.x; e < Maps * mma_block; e += blockDim.x) {
        const int m = e / mma_block, i = i0 + e % mma_block;
        const long long at = ((static_cast<long long>(b) * s.H + h) * Maps + m) * s.N + i;
        lse_tile[e] = i < s.N ? lse[at] : 0.0f;
        rowsum_tile[e] = i < s.N ? rowsum[at] : 0.0f;
      }
      __syncthreads();

      // dP^T = V dO^T (16 keys x 64 queries), shared by both maps.
      float dpt[8][4] = {};
      #pragma unroll
      for (int k0 = 0; k0 < DV; k0 += 16) {
        uint32_t a[4];
        load_a(a, v_tile, VS, r0, k0);
        #pragma unroll
        for (int n = 0; n < 8; ++n) {
          uint32_t bf[2];
          load_b_rows(bf, do_tile, VS, k0, n * 8);
          mma_16816<DT>(dpt[n], a, bf);
        }
      }
      float weight[8][4] = {};  // Σ_m c_m P_m^T
      #pragma unroll
      for (int m = 0; m < Maps; ++m) {
        // S^T = K_m Q_m^T, then P^T = exp(S^T · scale - lse(query)), masked.
        float pt[8][4] = {};
        #pragma unroll
        for (int k0 = 0; k0 < D; k0 += 16) {
          uint32_t a[4];
          load_a(a, k_tile + m * mma_block * QS, QS, r0, k0);
          #pragma unroll
          for (int n = 0; n < 8; ++n) {
            uint32_t bf[2];
            load_b_rows(bf, q_tile + m * mma_block * QS, QS, k0, n * 8);
            mma_16816<DT>(pt[n], a, bf);
          }
        }
        #pragma unroll
        for (int n = 0; n < 8; ++n)
          #pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = t0 + r0 + g + (e / 2) * 8, column = n * 8 + 2 * t + e % 2, query = i0 + column;
            const float p = visible(query, key, s.N, s.causal)
                                ? expf(pt[n][e] * s.scale - lse_tile[m * mma_block + column])
                                : 0.0f;
            weight[n][e] += coeff[m] * p;
            if (m == 1 && slice == 0) second_dot += p * dpt[n][e];
            // dS^T = c_m P^T ⊙ (dP^T - rowsum(dO ⊙ O_m)), scaled for dQ and dK
            pt[n][e] = coeff[m] * p * (dpt[n][e] - rowsum_tile[m * mma_block + column]) * s.scale;
          }
        // dK_m += dS^T Q_m for this warp's slice of columns
        #pragma unroll
        for (int step = 0; step < 4; ++step) {
          uint32_t a[4];
          c_to_a<DT>(a, pt, step);
          #pragma unroll
          for (int n = 0; n < NK; ++n) {
            uint32_t bf[2];
            load_b_columns(bf, q_tile + m * mma_block * QS, QS, step * 16, slice * C::d_columns + n * 8);
            mma_16816<DT>(dk_acc[m][n], a, bf);
          }
        }
        // keep dS^T for dQ (the slice-0 warps own the 16 keys' rows)
        if (slice == 0)
          #pragma unroll
          for (int n = 0; n < 8; ++n)
            #pragma unroll
            for (int e = 0; e < 4; ++e)
              ds_tile[(m * mma_block + r0 + g + (e / 2) * 8) * SS + n * 8 + 2 * t + e % 2] = from_float<DT>(pt[n][e]);
      }
      // dV += weight^T... in key-major form: dV[key] += Σ_query weight(key, query) dO[query]
      #pragma unroll
      for (int step = 0; step < 4; ++step) {
        uint32_t a[4];
        c_to_a<DT>(a, weight, step);
        #pragma unroll
        for (int n = 0; n < NV; ++n) {
          uint32_t bf[2];
          load_b_columns(bf, do_tile, VS, step * 16, slice * C::columns + n * 8);
          mma_16816<DT>(dv_acc[n], a, bf);
        }
      }
      __syncthreads();  // dS^T complete
      // dQ_m = dS_m K_m: warps take 16 queries and a slice of columns, atomically added.
      #pragma unroll
      for (int m = 0; m < Maps; ++m) {
        float dq_part[NK][4] = {};
        #pragma unroll
        for (int step = 0; step < 4; ++step) {
          uint32_t a[4];
          load_a_transposed(a, ds_tile + m * mma_block * SS, SS, r0, step * 16);
          #pragma unroll
          for (int n = 0; n < NK; ++n) {
            uint32_t bf[2];
            load_b_columns(bf, k_tile + m * mma_block * QS, QS, step * 16, slice * C::d_columns + n * 8);
            mma_16816<DT>(dq_part[n], a, bf);
          }
        }
        #pragma unroll
        for (int n = 0; n < NK; ++n)
          #pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int query = i0 + r0 + g + (e / 2) * 8, col = slice * C::d_columns + n * 8 + 2 * t + e % 2;
            if (query < s.N)
              atomicAdd(dq_accum + ((static_cast<long long>(b) * s.N + query) * s.H + h) * Maps * D + m * D + col,
                        dq_part[n][e]);
          }
      }
    }
  }

  if constexpr (Maps == 2) {
    const float warp_total = warp_sum(second_dot);
    if (slice == 0 && threadIdx.x % 32 == 0) atomicAdd(dlambda, -warp_total);
  }
  #pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = t0 + r0 + g + half * 8;
    if (key >= s.N) continue;
    #pragma unroll
    for (int n = 0; n < NV; ++n)
      #pragma unroll
      for (int e = 0; e < 2; ++e)
        dv[((static_cast<long long>(b) * s.N + key) * s.G + j) * DV + slice * C::columns + n * 8 + 2 * t + e] =
            from_float<DT>(dv_acc[n][half * 2 + e]);
    #pragma unroll
    for (int m = 0; m < Maps; ++m)
      #pragma unroll
      for (int n = 0; n < NK; ++n)
        #pragma unroll
        for (int e = 0; e < 2; ++e)
          dk[((static_cast<long long>(b) * s.N + key) * s.G + j) * Maps * D + m * D + slice * C::d_columns + n * 8 +
             2 * t + e] = from_float<DT>(dk_acc[m][n][half * 2 + e]);
  }
}

template <int Maps, int D>
constexpr std::size_t forward_mma_shared_bytes() {
  using C = mma_config<Maps, D>;
  return (2 * Maps * mma_block * C::QS + mma_block * C::VS) * 2;
}
template <int Maps, int D>
constexpr std::size_t backward_mma_shared_bytes() {
  using C = mma_config<Maps, D>;
  return (2 * Maps * mma_block * C::QS + 2 * mma_block * C::VS + Maps * mma_block * (mma_block + mma_pad)) * 2 +
         2 * Maps * mma_block * sizeof(float);
}

}  // namespace difftx::cuda_detail
