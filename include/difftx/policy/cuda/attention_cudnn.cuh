// cuDNN's fused scaled-dot-product attention as policy::cuda's attention for
// float16/bfloat16 (attention_path.hpp says when it is chosen), through the
// graph API of cuDNN's header-only C++ frontend. Formulas and shapes are
// difftx/ops/attention.hpp's; this file only maps them onto cuDNN's.
//
// Each map m of a differential head is one attention problem, Q_m K_m^T with
// query/key width d against V of width dv = 2d, the same V for both maps:
//   O_m = softmax(Q_m K_m^T / sqrt(d)) V,   Stats_m = log-sum-exp of each row,
// so one graph per shape serves both maps (map m's views differ only in
// where they start). The forward writes O_2 into o2 and Stats_m into lse
// (the same natural-log log-sum-exp the difftx kernels save), O_1 into o,
// then o = O_1 - lambda O_2 in one elementwise pass.
// The backward is linear in dO: map 1 gets dO against O_1 = o + lambda o2,
// map 2 gets dO_2 = -lambda dO against O_2, each through cuDNN's backward,
// which writes dq and dk of its map in place (grouped query heads summed
// into their key head by cuDNN) and dV of its map; dv = dV_1 + dV_2. O_1,
// dO_2 and dlambda = -sum(dO ⊙ O_2) come from one pass over o, o2 and dO
// (differential_backward_operands).
//
// Where the heads are not grouped (G = H) and the batch is dense, both maps
// go in one call instead (maps_as_heads in the graph's key): Q and K as
// [B, H·Maps, N, d] (head j is map j % 2 of head j / 2: a head stride of d),
// V's H heads each serving its two, O of both maps into a scratch
// [B, N, H, Maps, dv] and Stats into lse [B, H·Maps, N] as it is. One launch
// each way instead of two, and the backward needs no copy of the statistics
// and no dV sum of ours: cuDNN sums dV over the query heads that share a
// value head (docs/benchmarks.md has the op's kernels under Nsight Compute).
// Grouped heads keep the call per map: their maps cannot be laid out as heads
// whose key head is cuDNN's head j / (H/G).
//
// Views, as [batch, head, token, width] with strides in elements (map m's
// offset m·d on q and k, m·N on lse, goes on the pointer):
//   Q_m  in q [B, N, H, Maps, d]:  (N·H·Maps·d, Maps·d, H·Maps·d, 1)
//   K_m  in k [B, N, G, Maps, d]:  (N·G·Maps·d, Maps·d, G·Maps·d, 1)
//   V    in v [B, N, G, dv]:       (N·G·dv,     dv,     G·dv,     1)
//   O    in o [B, N, H, dv]:       (N·H·dv,     dv,     H·dv,     1)
//   Stats_m in lse [B, H, Maps, N] as [B, H, N, 1]: (H·Maps·N, Maps·N, 1, 1) forward,
//           packed (H·N, N, 1, 1) in the backward (a copy per map where Maps = 2)
//
// A packed batch (policy.cudnn_ragged) goes in one call per map through
// cuDNN's ragged layout: its sequences are cuDNN's batch, each padded to one
// length L that is never stored (the longest rounded up to a power of two,
// ragged_layout.hpp): sequence b's rows start offsets[b] elements into each
// tensor (the same offsets for map 2's views, which start d further) and the
// padding mask holds each to its own length. The statistics go through a
// scratch of one [total, H] block per map (offsets cu_seqlens[b]·H), copied
// from and to the per-sequence blocks of lse [1, H, Maps, total] that
// per-sequence calls use (modules/sequences.hpp), so either path's saved
// state serves the other.
//
// Graphs are built once per shape and kept in the policy's context with the
// workspace size they need (plan_cache.hpp); attention_cudnn_graph.hpp
// declares them, and attention_cudnn_graph_build.hpp builds and runs them.
// This file feeds them: the packed batch's lengths and offsets, the
// statistics' copies, and the forward and backward of both maps.
// Compiled only where CMake found cuDNN and the frontend (DIFFTX_CUDNN,
// target difftx::cudnn).
#pragma once

#if defined(DIFFTX_CUDNN)

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>

#include "difftx/core/tensor.hpp"
#include "difftx/policy/cuda/attention_cudnn_graph.hpp"
#include "difftx/policy/cuda/attention_simt.cuh"
#include "difftx/policy/cuda/device_types.cuh"
#include "difftx/policy/cuda/elementwise.cuh"
#include "difftx/policy/cuda/ragged_layout.hpp"
#include "difftx/policy/cuda/tag.cuh"

namespace difftx::cuda_detail {

// A packed batch as cuDNN's ragged layout reads it: its graph's sizes (host)
// and, in device memory once the graph exists (write_ragged_batch), each
// sequence's length and, per tensor, the element offset of each sequence's
// first row (sequences + 1 offsets; row `ragged_rows` counts rows: cu_seqlens).
struct cudnn_ragged_batch {
  std::int64_t sequences = 0, padded_length = 0, token_capacity = 0, total = 0;
  Tensor<std::int32_t, 1> lengths;  // [sequences]
  Tensor<std::int64_t, 2> offsets;  // [ragged_tensor_count, ragged_offsets_stride(sequences)]
  std::int64_t* offsets_of(ragged_tensor t) { return offsets.data() + t * offsets.extent(1); }
};

// A packed batch's graph sizes: cu_seqlens checked by the caller.
inline cudnn_ragged_batch cudnn_ragged_sizes(sequence_offsets cu_seqlens) {
  cudnn_ragged_batch r;
  r.sequences = static_cast<std::int64_t>(cu_seqlens.size()) - 1;
  r.total = cu_seqlens.back();
  index_t longest = 0;
  for (std::size_t b = 0; b + 1 < cu_seqlens.size(); ++b) longest = std::max(longest, cu_seqlens[b + 1] - cu_seqlens[b]);
  r.padded_length = ragged_bucket(longest);
  r.token_capacity = ragged_bucket(r.total);
  return r;
}

constexpr int ragged_chunk = 64;  // sequences per launch: their row offsets travel as a kernel parameter
struct ragged_chunk_args {
  int first = 0, count = 0, stride = 0;  // stride: offsets per tensor in the table
  long long begin[ragged_chunk + 1] = {};  // cu_seqlens[first .. first + count]
  long long row_elements[ragged_tensor_count] = {};
};
// Thread i writes sequence first + i's offsets (i = count: the next one's, or the end) and length.
// A template (of the offset type) so that the header defines no non-inline
// kernel: two units that include it would each define it.
template <class Offset>
__global__ void write_ragged_offsets(ragged_chunk_args a, std::int32_t* lengths, Offset* offsets) {
  const int i = static_cast<int>(threadIdx.x);
  if (i > a.count) return;
  const int b = a.first + i;
  for (int t = 0; t < ragged_tensor_count; ++t) offsets[t * a.stride + b] = a.begin[i] * a.row_elements[t];
  if (i < a.count) lengths[b] = static_cast<std::int32_t>(a.begin[i + 1] - a.begin[i]);
}

// Runs a graph on `pointers`, plus a ragged graph's lengths and offsets.
inline void run_cudnn_graph(const policy::cuda& p, const cudnn_attention_graph& built, cudnn_ragged_batch* ragged,
                            std::unordered_map<std::int64_t, void*> pointers) {
  if (ragged) {
    pointers.insert({{seq_len_q_uid, ragged->lengths.data()},
                     {seq_len_kv_uid, ragged->lengths.data()},
                     {q_offsets_uid, ragged->offsets_of(ragged_q)},
                     {k_offsets_uid, ragged->offsets_of(ragged_k)},
                     {v_offsets_uid, ragged->offsets_of(ragged_v)},
                     {o_offsets_uid, ragged->offsets_of(ragged_o)},
                     {stats_offsets_uid, ragged->offsets_of(ragged_stats)}});
  }
  run_cudnn_graph(p, built, pointers);
}

// s: the call's shape (for a packed batch, the whole batch as one sequence:
// B = 1, N = total); ragged: the packed batch's sequences, or none.
// maps_as_heads: both maps in one graph (dense only).
template <class T>
cudnn_attention_key cudnn_key_of(const attention_shape& s, int maps, bool backward, const cudnn_ragged_batch* ragged,
                                 bool maps_as_heads = false) {
  const bool bfloat16 = std::is_same_v<T, Eigen::bfloat16>;
  if (ragged)
    return {bfloat16, s.causal, backward, true, ragged->sequences, ragged->padded_length, s.H, s.G, maps, s.d, s.dv,
            ragged->token_capacity};
  return {bfloat16, s.causal, backward, false, s.B, s.N, s.H, s.G, maps, s.d, s.dv, 0, maps_as_heads};
}

// Writes a packed batch's lengths and offsets on the device, for a call of
// shape s (q [1, total, H, Maps, d]), by kernels whose parameters carry
// cu_seqlens: no host synchronisation.
inline void write_ragged_batch(const policy::cuda& p, const attention_shape& s, int maps, sequence_offsets cu_seqlens,
                               cudnn_ragged_batch& r) {
  r.lengths = Tensor<std::int32_t, 1>({r.sequences}, p.memory());
  r.offsets = Tensor<std::int64_t, 2>({ragged_tensor_count, ragged_offsets_stride(r.sequences)}, p.memory());
  ragged_chunk_args a;
  a.stride = static_cast<int>(r.offsets.extent(1));
  for (int t = 0; t < ragged_tensor_count; ++t)
    a.row_elements[t] = ragged_row_elements(static_cast<ragged_tensor>(t), s.H, s.G, maps, s.d, s.dv);
  const int sequences = static_cast<int>(r.sequences);
  for (int first = 0; first < sequences; first += ragged_chunk) {
    a.first = first;
    a.count = std::min(ragged_chunk, sequences - first);
    for (int i = 0; i <= a.count; ++i) a.begin[i] = cu_seqlens[static_cast<std::size_t>(first + i)];
    write_ragged_offsets<<<1, ragged_chunk + 1, 0, p.stream()>>>(a, r.lengths.data(), r.offsets.data());
    DIFFTX_CUDA_CHECK(cudaGetLastError());
  }
}

// A call's graph and, for a packed batch (cu_seqlens not empty), its ragged
// layout, written on the device only once cuDNN has taken the graph; no graph
// where cuDNN refuses the shape.
struct cudnn_call {
  std::shared_ptr<const cudnn_attention_graph> graph;
  std::optional<cudnn_ragged_batch> ragged;
  cudnn_ragged_batch* ragged_batch() { return ragged ? &*ragged : nullptr; }
};
template <class T>
cudnn_call prepare_cudnn_call(const policy::cuda& p, const attention_shape& s, int maps, bool backward,
                              sequence_offsets cu_seqlens) {
  cudnn_call call;
  if (!cu_seqlens.empty()) call.ragged = cudnn_ragged_sizes(cu_seqlens);
  call.graph = cudnn_attention_graph_for(p, cudnn_key_of<T>(s, maps, backward, call.ragged_batch()));
  if (cudnn_took(*call.graph) && call.ragged) write_ragged_batch(p, s, maps, cu_seqlens, *call.ragged);
  return call;
}

// Each map's statistics in its own block of a scratch, `map_stride` apart:
// rows [B, H, N] (dense backward) or [total, H] (ragged), each block
// 16-byte aligned.
inline long long stats_map_stride(long long rows) { return (rows + 3) / 4 * 4; }

// A packed batch's statistics between lse [1, H, Maps, total], held as
// per-sequence blocks [H, Maps, length], and cuDNN's ragged rows, map m's
// [total, H] block at m·map_stride of a scratch: f(stats index, lse index)
// for every (map, row, head), on the device.
template <class F>
void for_each_ragged_statistic(const policy::cuda& p, cudnn_ragged_batch& ragged, int H, int maps, F f) {
  const std::int64_t* rows = ragged.offsets_of(ragged_rows);
  const int sequences = static_cast<int>(ragged.sequences);
  const long long total = ragged.total, map_stride = stats_map_stride(total * H);
  launch_for_each(p, maps * total * H, [=] __device__(long long i) {
    const int m = static_cast<int>(i / (total * H)), h = static_cast<int>(i % H);
    const long long row_and_head = i % (total * H);
    f(m * map_stride + row_and_head, packed_lse_index(rows, sequences, H, maps, h, m, row_and_head / H));
  });
}

constexpr int operand_warps = 8;  // rows a block of the passes below
// 16 bytes of a row, the unit those passes read and write (dv % 8 == 0 and
// 16-byte starts: cudnn_applies).
template <class DT>
struct alignas(16) row_pack {
  DT v[16 / sizeof(DT)];
};

// The one call's outputs maps_out [rows, 2, dv] (O_1, O_2 of each head) ->
// o = O_1 - λ O_2 and o2 = O_2 [rows, dv], a warp a row, 16 bytes at a time.
template <class DT>
__global__ void __launch_bounds__(operand_warps * 32)
    differential_forward_outputs(const DT* maps_out, const float* lambda, long long rows, int dv, DT* o, DT* o2) {
  constexpr int width = 16 / sizeof(DT);
  using pack = row_pack<DT>;
  const long long row = blockIdx.x * static_cast<long long>(operand_warps) + threadIdx.x / 32;
  if (row >= rows) return;
  const float lam = *lambda;
  const DT* maps = maps_out + 2 * row * dv;
  for (int c = static_cast<int>(threadIdx.x % 32) * width; c < dv; c += 32 * width) {
    const pack first = *reinterpret_cast<const pack*>(maps + c);
    const pack second = *reinterpret_cast<const pack*>(maps + dv + c);
    pack out;
#pragma unroll
    for (int e = 0; e < width; ++e) out.v[e] = from_accum<DT>(to_accum(first.v[e]) - lam * to_accum(second.v[e]));
    *reinterpret_cast<pack*>(o + row * dv + c) = out;
    *reinterpret_cast<pack*>(o2 + row * dv + c) = second;
  }
}

// Whether a differential call can put both maps in one graph (maps_as_heads).
inline bool cudnn_maps_fit_as_heads(const attention_shape& s, sequence_offsets cu_seqlens) {
  return cu_seqlens.empty() && s.G == s.H;
}

// The differential forward as one call of 2H heads (cudnn_maps_fit_as_heads):
// q [B,N,H,2,d], k [B,N,H,2,d], v [B,N,H,dv] -> o [B,N,H,dv], o2, lse [B,H,2,N].
// false where cuDNN refuses the graph (nothing written).
template <class T>
bool cudnn_maps_as_heads_forward(const policy::cuda& p, const attention_shape& s, const T* q, const T* k, const T* v,
                                 const accum_t<T>* lambda, T* o, T* o2, accum_t<T>* lse) {
  using DT = device_t<T>;
  const auto graph = cudnn_attention_graph_for(p, cudnn_key_of<T>(s, 2, false, nullptr, true));
  if (!cudnn_took(*graph)) return false;
  const long long rows = static_cast<long long>(s.B) * s.N * s.H;
  Tensor<T, 1> maps_out({2 * rows * s.dv}, p.memory());  // [B, N, H, 2, dv]: O_1 then O_2 of each head
  run_cudnn_graph(p, *graph, nullptr,
                  {{q_uid, const_cast<T*>(q)},  // the variant pack takes void*; cuDNN only reads its inputs
                   {k_uid, const_cast<T*>(k)},
                   {v_uid, const_cast<T*>(v)},
                   {o_uid, maps_out.data()},
                   {stats_uid, lse}});
  differential_forward_outputs<DT><<<blocks_for(rows, operand_warps), operand_warps * 32, 0, p.stream()>>>(
      device_pointer(maps_out.data()), lambda, rows, s.dv, device_pointer(o), device_pointer(o2));
  DIFFTX_CUDA_CHECK(cudaGetLastError());
  return true;
}

// q [B,N,H,Maps,d], k [B,N,G,Maps,d], v [B,N,G,dv] -> o [B,N,H,dv]; saved o2 (Maps = 2), lse [B,H,Maps,N].
// A packed batch: B = 1, N = total, cu_seqlens its offsets (checked by the
// caller; empty for a dense batch), lse in per-sequence blocks. false where
// cuDNN refuses the shape (nothing written).
template <int Maps, class T>
bool cudnn_attention_forward(const policy::cuda& p, const attention_shape& s, sequence_offsets cu_seqlens, const T* q,
                             const T* k, const T* v, const accum_t<T>* lambda, T* o, T* o2, accum_t<T>* lse) {
  using A = accum_t<T>;
  if constexpr (Maps == 2)
    if (cudnn_maps_fit_as_heads(s, cu_seqlens) && cudnn_maps_as_heads_forward(p, s, q, k, v, lambda, o, o2, lse))
      return true;
  auto call = prepare_cudnn_call<T>(p, s, Maps, false, cu_seqlens);
  if (!cudnn_took(*call.graph)) return false;
  const auto& graph = call.graph;
  cudnn_ragged_batch* ragged = call.ragged_batch();
  const long long rows = static_cast<long long>(s.B) * s.N * s.H, map_stride = stats_map_stride(rows);
  Tensor<A, 1> stats;  // ragged: each map's [total, H] rows
  if (ragged) stats = Tensor<A, 1>({Maps * map_stride}, p.memory());
  auto* mutable_q = const_cast<T*>(q);  // the variant pack takes void*; cuDNN only reads its inputs
  auto* mutable_k = const_cast<T*>(k);
  auto* mutable_v = const_cast<T*>(v);
  for (int m = Maps - 1; m >= 0; --m)  // map 2 first: o then holds O_1 for the combination
    run_cudnn_graph(p, *graph, ragged,
                    {{q_uid, mutable_q + m * s.d},
                     {k_uid, mutable_k + m * s.d},
                     {v_uid, mutable_v},
                     {o_uid, m == 0 ? o : o2},
                     {stats_uid, ragged ? stats.data() + m * map_stride : lse + static_cast<std::int64_t>(m) * s.N}});
  if (ragged) {
    const A* from = stats.data();
    for_each_ragged_statistic(p, *ragged, s.H, Maps, [=] __device__(long long in_stats, long long in_lse) {
      lse[in_lse] = from[in_stats];
    });
  }
  if constexpr (Maps == 2) {
    using DT = device_t<T>;
    DT* op = device_pointer(o);
    const DT* o2p = device_pointer(o2);
    launch_for_each(p, rows * s.dv, [=] __device__(long long i) { op[i] = from_accum<DT>(to_accum(op[i]) - *lambda * to_accum(o2p[i])); });
  }
  return true;
}

// A differential backward's inputs to cuDNN, in one pass over the rows of o,
// o2 and dO [rows, dv], a warp a row, 16 bytes at a time: map 1's output
// O_1 = o + λ o2, map 2's upstream gradient dO_2 = -λ dO, and
// dλ = -Σ dO ⊙ O_2, added into *dlambda.
// For the call per map, O_1 into o1 and dO_2 into d_o2 [rows, dv]; for the
// one call of both maps (MapsAsHeads), each map's output and upstream
// gradient as that call's heads: o1 = (O_1, O_2), d_o2 = (dO, dO_2) [rows, 2, dv].
template <class DT, bool MapsAsHeads>
__global__ void __launch_bounds__(operand_warps * 32)
    differential_backward_operands(const DT* o, const DT* o2, const DT* d_o, const float* lambda, long long rows,
                                   int dv, DT* o1, DT* d_o2, float* dlambda) {
  constexpr int width = 16 / sizeof(DT);
  using pack = row_pack<DT>;
  const long long row = blockIdx.x * static_cast<long long>(operand_warps) + threadIdx.x / 32;
  const bool in_range = row < rows;  // the same for a whole warp
  const float lam = *lambda;
  float dot = 0;
  if (in_range) {
    const long long start = row * dv, out_start = MapsAsHeads ? 2 * start : start;
    for (int c = static_cast<int>(threadIdx.x % 32) * width; c < dv; c += 32 * width) {
      const pack out = *reinterpret_cast<const pack*>(o + start + c);
      const pack second = *reinterpret_cast<const pack*>(o2 + start + c);
      const pack grad = *reinterpret_cast<const pack*>(d_o + start + c);
      pack first, grad_second;
#pragma unroll
      for (int e = 0; e < width; ++e) {
        const float o2_value = to_accum(second.v[e]), g = to_accum(grad.v[e]);
        dot += g * o2_value;
        first.v[e] = from_accum<DT>(to_accum(out.v[e]) + lam * o2_value);
        grad_second.v[e] = from_accum<DT>(-lam * g);
      }
      *reinterpret_cast<pack*>(o1 + out_start + c) = first;
      if constexpr (MapsAsHeads) {
        *reinterpret_cast<pack*>(o1 + out_start + dv + c) = second;
        *reinterpret_cast<pack*>(d_o2 + out_start + c) = grad;
        *reinterpret_cast<pack*>(d_o2 + out_start + dv + c) = grad_second;
      } else {
        *reinterpret_cast<pack*>(d_o2 + out_start + c) = grad_second;
      }
    }
    dot = warp_sum(dot);
  }
  block_atomic_add(dlambda, -dot, in_range);
}

// The differential backward as one call of 2H heads (cudnn_maps_fit_as_heads):
// do [B,N,H,dv] -> dq [B,N,H,2,d], dk [B,N,H,2,d], dv [B,N,H,dv], dlambda, all
// assigned. false where cuDNN refuses the graph (nothing written).
template <class T>
bool cudnn_maps_as_heads_backward(const policy::cuda& p, const attention_shape& s, const T* q, const T* k, const T* v,
                                  const accum_t<T>* lambda, const T* o, const T* o2, const accum_t<T>* lse,
                                  const T* d_o, T* dq, T* dk, T* dv, accum_t<T>* dlambda) {
  using DT = device_t<T>;
  const auto graph = cudnn_attention_graph_for(p, cudnn_key_of<T>(s, 2, true, nullptr, true));
  if (!cudnn_took(*graph)) return false;
  const long long rows = static_cast<long long>(s.B) * s.N * s.H;
  Tensor<T, 1> maps_out({2 * rows * s.dv}, p.memory()), maps_grad({2 * rows * s.dv}, p.memory());  // [B,N,H,2,dv]
  DIFFTX_CUDA_CHECK(cudaMemsetAsync(dlambda, 0, sizeof(accum_t<T>), p.stream()));
  differential_backward_operands<DT, true><<<blocks_for(rows, operand_warps), operand_warps * 32, 0, p.stream()>>>(
      device_pointer(o), device_pointer(o2), device_pointer(d_o), lambda, rows, s.dv, device_pointer(maps_out.data()),
      device_pointer(maps_grad.data()), dlambda);
  DIFFTX_CUDA_CHECK(cudaGetLastError());
  run_cudnn_graph(p, *graph, nullptr,
                  {{q_uid, const_cast<T*>(q)},  // the variant pack takes void*; cuDNN only reads its inputs
                   {k_uid, const_cast<T*>(k)},
                   {v_uid, const_cast<T*>(v)},
                   {o_uid, maps_out.data()},
                   {stats_uid, const_cast<accum_t<T>*>(lse)},
                   {d_o_uid, maps_grad.data()},
                   {dq_uid, dq},
                   {dk_uid, dk},
                   {dv_uid, dv}});
  return true;
}

// do [B,N,H,dv] -> dq, dk, dv assigned; dlambda assigned (Maps = 2); a packed
// batch as in the forward. false where cuDNN refuses the shape (nothing written).
template <int Maps, class T>
bool cudnn_attention_backward(const policy::cuda& p, const attention_shape& s, sequence_offsets cu_seqlens, const T* q,
                              const T* k, const T* v, const accum_t<T>* lambda, const T* o, const T* o2,
                              const accum_t<T>* lse, const T* d_o, T* dq, T* dk, T* dv, accum_t<T>* dlambda) {
  using DT = device_t<T>;
  using A = accum_t<T>;
  if constexpr (Maps == 2)
    if (cudnn_maps_fit_as_heads(s, cu_seqlens) &&
        cudnn_maps_as_heads_backward(p, s, q, k, v, lambda, o, o2, lse, d_o, dq, dk, dv, dlambda))
      return true;
  auto call = prepare_cudnn_call<T>(p, s, Maps, true, cu_seqlens);
  if (!cudnn_took(*call.graph)) return false;
  const auto& graph = call.graph;
  cudnn_ragged_batch* ragged = call.ragged_batch();
  const long long rows = static_cast<long long>(s.B) * s.N * s.H, n = rows * s.dv, map_stride = stats_map_stride(rows);
  auto* mutable_q = const_cast<T*>(q);  // the variant pack takes void*; cuDNN only reads its inputs
  auto* mutable_k = const_cast<T*>(k);
  auto* mutable_v = const_cast<T*>(v);
  // Each map's statistics as the graph reads them, map_stride apart: [total, H]
  // rows (ragged), or packed [B, H, N] (dense; lse [B, H, 1, N] already is for one map).
  Tensor<A, 1> stats;
  A* stats_of[Maps] = {const_cast<A*>(lse)};
  if (ragged || Maps == 2) {
    stats = Tensor<A, 1>({Maps * map_stride}, p.memory());
    for (int m = 0; m < Maps; ++m) stats_of[m] = stats.data() + m * map_stride;
  }
  if (ragged) {
    A* to = stats.data();
    for_each_ragged_statistic(p, *ragged, s.H, Maps, [=] __device__(long long in_stats, long long in_lse) {
      to[in_stats] = lse[in_lse];
    });
  } else if (Maps == 2) {
    for (int m = 0; m < Maps; ++m)
      DIFFTX_CUDA_CHECK(cudaMemcpy2DAsync(stats_of[m], s.N * sizeof(A), lse + m * s.N, Maps * s.N * sizeof(A),
                                          s.N * sizeof(A), static_cast<std::size_t>(s.B) * s.H, cudaMemcpyDeviceToDevice,
                                          p.stream()));
  }
  if constexpr (Maps == 1) {
    run_cudnn_graph(p, *graph, ragged,
                    {{q_uid, mutable_q}, {k_uid, mutable_k}, {v_uid, mutable_v}, {o_uid, const_cast<T*>(o)},
                     {stats_uid, stats_of[0]}, {d_o_uid, const_cast<T*>(d_o)}, {dq_uid, dq}, {dk_uid, dk}, {dv_uid, dv}});
  } else {
    Tensor<T, 1> o1({n}, p.memory()), d_o2({n}, p.memory());
    Tensor<T, 1> dv2({static_cast<index_t>(s.B) * s.N * s.G * s.dv}, p.memory());
    DIFFTX_CUDA_CHECK(cudaMemsetAsync(dlambda, 0, sizeof(A), p.stream()));
    differential_backward_operands<DT, false><<<blocks_for(rows, operand_warps), operand_warps * 32, 0, p.stream()>>>(
        device_pointer(o), device_pointer(o2), device_pointer(d_o), lambda, rows, s.dv, device_pointer(o1.data()),
        device_pointer(d_o2.data()), dlambda);
    DIFFTX_CUDA_CHECK(cudaGetLastError());
    run_cudnn_graph(p, *graph, ragged,
                    {{q_uid, mutable_q}, {k_uid, mutable_k}, {v_uid, mutable_v}, {o_uid, o1.data()},
                     {stats_uid, stats_of[0]}, {d_o_uid, const_cast<T*>(d_o)}, {dq_uid, dq}, {dk_uid, dk}, {dv_uid, dv}});
    run_cudnn_graph(p, *graph, ragged,
                    {{q_uid, mutable_q + s.d}, {k_uid, mutable_k + s.d}, {v_uid, mutable_v}, {o_uid, const_cast<T*>(o2)},
                     {stats_uid, stats_of[1]}, {d_o_uid, d_o2.data()}, {dq_uid, dq + s.d}, {dk_uid, dk + s.d},
                     {dv_uid, dv2.data()}});
    DT* dvp = device_pointer(dv);
    const DT* dv2p = device_pointer(dv2.data());
    launch_for_each(p, dv2.size(), [=] __device__(long long i) { dvp[i] = from_accum<DT>(to_accum(dvp[i]) + to_accum(dv2p[i])); });
  }
  return true;
}

}  // namespace difftx::cuda_detail

#endif  // DIFFTX_CUDNN
