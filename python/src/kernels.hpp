// The extension's compiled entries, one set per number type and device:
// declared here without difftx or nanobind (module.cpp dispatches on dtype and
// device and knows only these), defined in kernels_impl.hpp and instantiated
// once per type in cpu_<type>.cpp and cuda_<type>.cu, so the types compile in
// parallel and the CUDA units need no Python header.
//
// Every tensor arrives as a tensor_ref: module.cpp has checked that it is
// contiguous, of the entry's type and on its device, and that its shape is the
// one named in the comments; the difftx op behind each entry checks the shapes
// against each other again (difftx::input_error, a ValueError in Python).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace difftx_python {

// A contiguous tensor: its first element and its shape.
struct tensor_ref {
  void* data = nullptr;
  std::vector<std::int64_t> shape;
};

// Where a call runs: `threads` OpenMP threads on the CPU, or after the work
// already queued on `stream` (PyTorch's current stream) on CUDA device `device`.
struct execution {
  int threads = 0;
  int device = 0;
  std::uintptr_t stream = 0;
};

// MultiHead's configuration as the reference repo's MultiheadDiffAttn holds it.
struct multihead_config {
  std::int64_t embed_dim = 0, heads = 0, kv_heads = 0, head_dim = 0, layer_index = 0;
  double subln_eps = 1e-5;
  bool causal = true;
  friend bool operator==(const multihead_config&, const multihead_config&) = default;
};

// What a MultiHead forward keeps for its backward (the module with the
// weights it ran on, and its saved state); module.cpp hands it to PyTorch as
// a one-byte tensor whose storage it owns, `token` (handles.hpp).
struct saved_state {
  virtual ~saved_state() = default;
  std::uint8_t token = 0;
};

struct cpu {};
struct cuda {};

// Per device: its policy (`policy`), where its memory is (`space`), what a
// call holds while it runs (`session`, with the policy as `p`) and which
// device a call names (`device_of`): cpu_device.hpp, cuda_device.cuh.
template <class Device>
struct device_traits;

// Differential attention in FlashAttention's layout (lambda and lse in the
// accumulation type: float, or double for float64):
//   q [B, N, 2H, d], k [B, M, 2G, d], v [B, M, G, dv], lambda [1] or [H]
//   -> o [B, N, H, dv], o2 [B, N, H, dv], lse [B, H, 2, N]
// packed: q [Tq, 2H, d], k [Tk, 2G, d], v [Tk, G, dv], o, o2 [Tq, H, dv],
// lse [H, 2, Tq] in per-sequence blocks, with the sequences' offsets.
struct attention_tensors {
  tensor_ref q, k, v, lambda, o, o2, lse;
};
// The backward's: dO (o's shape) -> dq, dk, dv (the inputs' shapes) and
// dlambda (lambda's), all assigned.
struct attention_gradients {
  tensor_ref d_o, dq, dk, dv, dlambda;
};
// A packed batch's offsets (host, cu_seqlens): sequence s holds the query rows
// [queries[s], queries[s + 1]) and the key rows [keys[s], keys[s + 1]).
struct sequence_offsets {
  std::vector<std::int64_t> queries, keys;
};

template <class T, class Device>
struct kernels {
  static void attention_forward(const execution&, const attention_tensors&, bool causal);
  static void attention_backward(const execution&, const attention_tensors&, const attention_gradients&,
                                 bool causal);
  static void attention_varlen_forward(const execution&, const attention_tensors&, const sequence_offsets&,
                                       bool causal);
  static void attention_varlen_backward(const execution&, const attention_tensors&, const attention_gradients&,
                                        const sequence_offsets&, bool causal);

  // difftx's MultiHead on x [B, N, C] with the weights `parameters` (in
  // multihead_parameter_names' order) and RoPE tables cos, sin [P, d/2]
  // (accumulation type) -> y [B, N, C], and the state its backward needs.
  static std::unique_ptr<saved_state> multihead_forward(const execution&, const multihead_config&,
                                                        const tensor_ref& x, const std::vector<tensor_ref>& parameters,
                                                        const tensor_ref& cos, const tensor_ref& sin,
                                                        const tensor_ref& y);
  // dy [B, N, C] -> dx [B, N, C] and each parameter's gradient (assigned), from
  // a forward's state (false: the state is not this entry's, nothing written).
  static bool multihead_backward(const execution&, saved_state& state, const tensor_ref& x, const tensor_ref& dy,
                                 const tensor_ref& cos, const tensor_ref& sin, const tensor_ref& dx,
                                 const std::vector<tensor_ref>& gradients);
};

// The order in which multihead_forward takes the weights and multihead_backward
// gives their gradients: difftx's (and the reference repo's) parameter names.
inline constexpr const char* multihead_parameter_names[] = {
    "q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight", "lambda_q1",
    "lambda_k1",     "lambda_q2",     "lambda_k2",     "subln.weight"};

}  // namespace difftx_python
