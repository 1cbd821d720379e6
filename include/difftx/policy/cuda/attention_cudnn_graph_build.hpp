// cuDNN's side of policy::cuda's cuDNN attention: the handle, and the graphs
// themselves, built as cudnn-frontend's SDPA samples build theirs, behind the
// three functions attention_cudnn_graph.hpp declares. One graph computes one
// map of every head, or both maps as heads of their own (the file's header
// comment in attention_cudnn.cuh has the views): a forward builder
// (declare_attention_forward) and a backward one (declare_attention_backward)
// over the same tensor declarations (cudnn_attention_layouts: Q, K, V, O and
// the statistics with their strides, dense or ragged;
// declare_attention_inputs) and one padding mask
// (cudnn_graph_builder::padding_mask). Host code only: a C++ compiler builds
// it. Compiled only where CMake found cuDNN and the frontend (DIFFTX_CUDNN,
// target difftx::cudnn).
#pragma once

#if defined(DIFFTX_CUDNN)

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <cudnn.h>
#include <cudnn_frontend.h>

#include "difftx/policy/cuda/attention_cudnn_graph.hpp"
#include "difftx/policy/cuda/context.cuh"
#include "difftx/policy/cuda/plan_cache.hpp"
#include "difftx/policy/cuda/ragged_layout.hpp"
#include "difftx/policy/cuda/tag.cuh"

namespace difftx::cuda_detail {

namespace fe = cudnn_frontend;

inline void check(cudnnStatus_t status, const char* what, const char* file, int line) {
  if (status != CUDNN_STATUS_SUCCESS)
    throw cuda_error(std::string(file) + ":" + std::to_string(line) + ": " + what + ": " + cudnnGetErrorString(status));
}
inline void check(fe::error_t status, const char* what, const char* file, int line) {
  if (status.is_bad())
    throw cuda_error(std::string(file) + ":" + std::to_string(line) + ": " + what + ": cuDNN frontend: " +
                     status.get_message());
}
// cuDNN has no engine for this graph (a shape or GPU it does not serve): the
// call falls back to difftx's kernels. Anything else is an error.
inline bool refused(fe::error_t status) {
  const auto code = status.get_code();
  return code == fe::error_code_t::GRAPH_NOT_SUPPORTED || code == fe::error_code_t::HEURISTIC_QUERY_FAILED ||
         code == fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED;
}

// A built graph, or none where cuDNN refused the shape (kept too, so that it
// is asked once).
struct cudnn_attention_graph {
  std::shared_ptr<fe::graph::Graph> graph;
  std::int64_t workspace_bytes = 0;
};

// The cuDNN handle (on the policy's stream) and the graphs built so far, one
// per context, made on first use.
struct cudnn_attention_state {
  cudnnHandle_t handle = nullptr;
  plan_cache<cudnn_attention_key, cudnn_attention_graph> graphs;
  explicit cudnn_attention_state(cudaStream_t stream) {
    DIFFTX_CUDA_CHECK(cudnnCreate(&handle));
    DIFFTX_CUDA_CHECK(cudnnSetStream(handle, stream));
  }
  cudnn_attention_state(const cudnn_attention_state&) = delete;
  cudnn_attention_state& operator=(const cudnn_attention_state&) = delete;
  ~cudnn_attention_state() { cudnnDestroy(handle); }
};

inline cudnn_attention_state& cudnn_state(const policy::cuda& p) {
  cuda_context& context = *p.context;
  std::lock_guard lock(context.extension_mutex);
  if (!context.cudnn_attention) context.cudnn_attention = std::make_shared<cudnn_attention_state>(context.stream);
  return *std::static_pointer_cast<cudnn_attention_state>(context.cudnn_attention);
}

// A tensor of a graph as cuDNN sees it: [batch, head, token, width], strides
// in elements (the file's header comment has them for each tensor).
struct cudnn_tensor_layout {
  std::vector<std::int64_t> dim, stride;
};

// The layouts of a graph's tensors for its key: one map's, or with
// maps_as_heads every map's as heads of their own.
struct cudnn_attention_layouts {
  cudnn_tensor_layout q, k, v, o, stats;
  explicit cudnn_attention_layouts(const cudnn_attention_key& key) {
    const std::int64_t B = key.B, N = key.N, H = key.H, G = key.G, M = key.maps, d = key.d, dv = key.dv;
    // The graph's heads per head of the layer, and the step from one to the next in q and k.
    const std::int64_t per_head = key.maps_as_heads ? M : 1, head_step = key.maps_as_heads ? d : M * d;
    const std::int64_t Hg = H * per_head;
    q = {{B, Hg, N, d}, {N * H * M * d, head_step, H * M * d, 1}};
    k = {{B, G * per_head, N, d}, {N * G * M * d, head_step, G * M * d, 1}};
    v = {{B, G, N, dv}, {N * G * dv, dv, G * dv, 1}};
    o = {{B, Hg, N, dv}, {N * Hg * dv, dv, Hg * dv, 1}};
    // The dense forward of one map writes its statistics into lse [B, H, Maps, N];
    // the dense backward of one map reads them packed [B, H, N] (cuDNN before
    // 9.26 takes no other layout there), copied out by cudnn_attention_backward;
    // with maps_as_heads lse [B, H, Maps, N] is [B, H·Maps, N] packed both
    // ways; a ragged graph reads and writes [total, H] rows.
    stats = {{B, Hg, N, 1}, key.ragged                            ? std::vector<std::int64_t>{N * H, 1, H, 1}
                            : key.backward || key.maps_as_heads ? std::vector<std::int64_t>{Hg * N, N, 1, 1}
                                                                : std::vector<std::int64_t>{H * M * N, M * N, 1, 1}};
  }
};

using cudnn_tensor = std::shared_ptr<fe::graph::Tensor_attributes>;

// A graph being built for one key: the graph with its types, the layouts,
// and for a ragged key the lengths and offsets (cudnn_ragged_batch) its
// tensors are placed by.
struct cudnn_graph_builder {
  const cudnn_attention_key& key;
  cudnn_attention_layouts layout;
  std::shared_ptr<fe::graph::Graph> graph = std::make_shared<fe::graph::Graph>();
  cudnn_tensor seq_len_q, seq_len_kv, offsets[ragged_tensor_count];  // ragged only

  explicit cudnn_graph_builder(const cudnn_attention_key& attention) : key(attention), layout(attention) {
    graph->set_io_data_type(key.bfloat16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
  }

  cudnn_tensor tensor(const char* name, cudnn_uid uid, const cudnn_tensor_layout& where) {
    return graph->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(where.dim).set_stride(where.stride));
  }
  // A [n] tensor of indices (lengths or offsets).
  cudnn_tensor index_tensor(const char* name, cudnn_uid uid, std::int64_t n, fe::DataType_t type) {
    auto t = tensor(name, uid, {{n, 1, 1, 1}, {1, 1, 1, 1}});
    t->set_data_type(type);
    return t;
  }
  // A ragged graph's lengths and offsets.
  void declare_ragged_batch() {
    seq_len_q = index_tensor("seq_len_q", seq_len_q_uid, key.B, fe::DataType_t::INT32);
    seq_len_kv = index_tensor("seq_len_kv", seq_len_kv_uid, key.B, fe::DataType_t::INT32);
    offsets[ragged_q] = index_tensor("q_offsets", q_offsets_uid, key.B + 1, fe::DataType_t::INT64);
    offsets[ragged_k] = index_tensor("k_offsets", k_offsets_uid, key.B + 1, fe::DataType_t::INT64);
    offsets[ragged_v] = index_tensor("v_offsets", v_offsets_uid, key.B + 1, fe::DataType_t::INT64);
    offsets[ragged_o] = index_tensor("o_offsets", o_offsets_uid, key.B + 1, fe::DataType_t::INT64);
    offsets[ragged_stats] = index_tensor("stats_offsets", stats_offsets_uid, key.B + 1, fe::DataType_t::INT64);
  }
  // t, which takes the offsets of `which` where the graph is ragged.
  cudnn_tensor place(cudnn_tensor t, ragged_tensor which) const {
    if (key.ragged) t->set_ragged_offset(offsets[which]);
    return t;
  }
  // An output of the graph: its id, layout and offsets.
  void output(const cudnn_tensor& t, cudnn_uid uid, const cudnn_tensor_layout& where, ragged_tensor which) const {
    place(t, which)->set_output(true).set_uid(uid).set_dim(where.dim).set_stride(where.stride);
  }
  // A ragged graph's padding mask (each sequence held to its own length) on
  // forward or backward SDPA options; the token capacity sizes cuDNN's
  // scratch by tokens, not sequences x padded length.
  template <class Options>
  void padding_mask(Options& options) const {
    if (key.ragged)
      options.set_padding_mask(true)
          .set_seq_len_q(seq_len_q)
          .set_seq_len_kv(seq_len_kv)
          .set_max_total_seq_len_q(key.token_capacity)
          .set_max_total_seq_len_kv(key.token_capacity);
  }
  float attn_scale() const { return 1.0f / std::sqrt(static_cast<float>(key.d)); }
};

// The query, key and value tensors every graph reads (after a ragged
// graph's lengths and offsets, which they are placed by).
struct cudnn_attention_inputs {
  cudnn_tensor q, k, v;
};
inline cudnn_attention_inputs declare_attention_inputs(cudnn_graph_builder& g) {
  cudnn_attention_inputs in{g.tensor("Q", q_uid, g.layout.q), g.tensor("K", k_uid, g.layout.k),
                            g.tensor("V", v_uid, g.layout.v)};
  if (g.key.ragged) {
    g.declare_ragged_batch();
    g.place(in.q, ragged_q);
    g.place(in.k, ragged_k);
    g.place(in.v, ragged_v);
  }
  return in;
}

// The forward graph of one map (or of both, as heads): O and its statistics (the natural-log
// log-sum-exp of each row) from Q, K and V.
inline void declare_attention_forward(cudnn_graph_builder& g) {
  const cudnn_attention_inputs in = declare_attention_inputs(g);
  auto options = fe::graph::SDPA_attributes()
                     .set_name("difftx attention map")
                     .set_generate_stats(true)
                     .set_attn_scale(g.attn_scale())
                     .set_causal_mask(g.key.causal);
  g.padding_mask(options);
  auto [o, stats] = g.graph->sdpa(in.q, in.k, in.v, options);
  g.output(o, o_uid, g.layout.o, ragged_o);
  g.output(stats, stats_uid, g.layout.stats, ragged_stats);
  stats->set_data_type(fe::DataType_t::FLOAT);
}

// The backward graph of one map (or of both, as heads): dQ, dK and dV from Q, K, V, O, dO and the
// forward's statistics.
inline void declare_attention_backward(cudnn_graph_builder& g) {
  const cudnn_attention_inputs in = declare_attention_inputs(g);
  const cudnn_tensor o = g.place(g.tensor("O", o_uid, g.layout.o), ragged_o);
  const cudnn_tensor d_o = g.place(g.tensor("dO", d_o_uid, g.layout.o), ragged_o);
  const cudnn_tensor stats = g.place(g.tensor("Stats", stats_uid, g.layout.stats), ragged_stats);
  stats->set_data_type(fe::DataType_t::FLOAT);
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("difftx attention map backward")
                     .set_attn_scale(g.attn_scale())
                     .set_causal_mask(g.key.causal);
  g.padding_mask(options);
  auto [dq, dk, dv] = g.graph->sdpa_backward(in.q, in.k, in.v, o, d_o, stats, options);
  g.output(dq, dq_uid, g.layout.q, ragged_q);
  g.output(dk, dk_uid, g.layout.k, ragged_k);
  g.output(dv, dv_uid, g.layout.v, ragged_v);
}

DIFFTX_CUDNN_GRAPH_API std::shared_ptr<const cudnn_attention_graph> cudnn_attention_graph_for(
    const policy::cuda& p, const cudnn_attention_key& key) {
  cudnn_attention_state& state = cudnn_state(p);
  return state.graphs.get(key, [&] {
    cudnn_graph_builder g(key);
    if (key.backward)
      declare_attention_backward(g);
    else
      declare_attention_forward(g);
    auto built = std::make_shared<cudnn_attention_graph>();
    if (const fe::error_t status = g.graph->build(state.handle, {fe::HeurMode_t::A}); !refused(status)) {
      DIFFTX_CUDA_CHECK(status);
      built->graph = std::move(g.graph);
      DIFFTX_CUDA_CHECK(built->graph->get_workspace_size(built->workspace_bytes));
    }
    return std::shared_ptr<const cudnn_attention_graph>(std::move(built));
  });
}

DIFFTX_CUDNN_GRAPH_API bool cudnn_took(const cudnn_attention_graph& built) { return built.graph != nullptr; }

DIFFTX_CUDNN_GRAPH_API void run_cudnn_graph(const policy::cuda& p, const cudnn_attention_graph& built,
                                            std::unordered_map<std::int64_t, void*>& pointers) {
  const auto bytes = static_cast<std::size_t>(built.workspace_bytes);
  void* workspace = bytes > 0 ? p.memory().allocate(bytes) : nullptr;  // stream-ordered: freed behind the call
  try {
    DIFFTX_CUDA_CHECK(built.graph->execute(cudnn_state(p).handle, pointers, workspace));
  } catch (...) {
    if (workspace) p.memory().deallocate(workspace, bytes);
    throw;
  }
  if (workspace) p.memory().deallocate(workspace, bytes);
}

}  // namespace difftx::cuda_detail

#endif  // DIFFTX_CUDNN
