// What policy::cuda's cuDNN attention (attention_cudnn.cuh) asks of cuDNN's
// graphs: the key a graph is kept by, the ids of its tensors, the graph for a
// key, and running it. cudnn-frontend's headers stay behind these three
// functions, in attention_cudnn_graph_build.hpp: they were most of nvcc's
// time in every CUDA unit that included them.
//
// By default this header includes that one, with the functions inline, so the
// library stays header-only. A program may instead compile them once: define
// DIFFTX_CUDNN_GRAPHS_COMPILED_ONCE in every unit, and include
// attention_cudnn_graph_build.hpp in one C++ unit (g++ will do; it holds no
// kernels). difftx's own programs do so (CMake target difftx_cudnn_graphs).
// Compiled only where CMake found cuDNN and the frontend (DIFFTX_CUDNN,
// target difftx::cudnn).
#pragma once

#if defined(DIFFTX_CUDNN)

#include <compare>
#include <cstdint>
#include <memory>
#include <unordered_map>

#include "difftx/policy/cuda/tag.cuh"

#if defined(DIFFTX_CUDNN_GRAPHS_COMPILED_ONCE)
#define DIFFTX_CUDNN_GRAPH_API
#else
#define DIFFTX_CUDNN_GRAPH_API inline
#endif

namespace difftx::cuda_detail {

// One attention problem as cuDNN sees it: a graph's key.
struct cudnn_attention_key {
  bool bfloat16 = false, causal = false, backward = false, ragged = false;
  std::int64_t B = 0, N = 0, H = 0, G = 0, maps = 0, d = 0, dv = 0;
  std::int64_t token_capacity = 0;  // ragged: B sequences padded to N, at most this many tokens in all
  // Both maps of every head in one graph of H·Maps heads (dense, G = H):
  // head j of the graph is map j % Maps of head j / Maps, all of them on the
  // one V of its head, so cuDNN's backward sums dV over the maps itself.
  bool maps_as_heads = false;
  auto operator<=>(const cudnn_attention_key&) const = default;
};

// The tensors' ids in a graph's variant pack.
enum cudnn_uid : std::int64_t {
  q_uid = 1, k_uid, v_uid, o_uid, stats_uid, d_o_uid, dq_uid, dk_uid, dv_uid,
  seq_len_q_uid, seq_len_kv_uid, q_offsets_uid, k_offsets_uid, v_offsets_uid, o_offsets_uid, stats_offsets_uid
};

// A built graph with the workspace it needs, or the record that cuDNN
// refused its key (attention_cudnn_graph_build.hpp).
struct cudnn_attention_graph;

// The key's graph, built on first use and kept in the policy's context, or
// kept as refused where cuDNN has no engine for it (asked once).
DIFFTX_CUDNN_GRAPH_API std::shared_ptr<const cudnn_attention_graph> cudnn_attention_graph_for(
    const policy::cuda& p, const cudnn_attention_key& key);

// Whether cuDNN took the graph's key: if not, the call falls back to
// difftx's kernels.
DIFFTX_CUDNN_GRAPH_API bool cudnn_took(const cudnn_attention_graph& built);

// Runs a graph that cuDNN took on the policy's stream, on the device pointers
// of its tensors by id, with a workspace from the policy's memory.
DIFFTX_CUDNN_GRAPH_API void run_cudnn_graph(const policy::cuda& p, const cudnn_attention_graph& built,
                                            std::unordered_map<std::int64_t, void*>& pointers);

}  // namespace difftx::cuda_detail

#if !defined(DIFFTX_CUDNN_GRAPHS_COMPILED_ONCE)
#include "difftx/policy/cuda/attention_cudnn_graph_build.hpp"
#endif

#endif  // DIFFTX_CUDNN
