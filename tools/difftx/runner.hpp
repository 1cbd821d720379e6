// A module of any kind, number type, policy and head size behind one virtual
// interface, so the commands choose all four at run time. Data crosses it as
// io::stored_tensor and io::tensor_file (typed host buffers, as files hold
// them): the runner converts to its number type and its policy's memory.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <difftx/io/tensor_file.hpp>
#include <difftx/policy/cuda/attention_path.hpp>
#include <difftx/ops/int8.hpp>

namespace difftx::cli {

// What a module is, as the command line gives it.
struct module_spec {
  std::string kind = {};    // rmsnorm, swiglu, multihead, attention, decoder_layer, decoder_stack, multihead_v2, decoder_layer_v2
  index_t d_model = 0;      // C
  index_t heads = 1;        // h differential heads (attention: H heads; V2: h output heads)
  index_t kv_heads = 0;     // g (attention: G); 0 means as many as heads
  index_t head_dim = 0;     // D: the half head size (attention and V2: the head size)
  index_t layer_index = 0;  // l; layer i of decoder_stack has l + i
  index_t ffn_dim = 0;      // F; 0 means the spec's default for C
  index_t layers = 2;       // decoder_stack only
  double rope_theta = 10000.0;
  double eps = 1e-5;
  bool causal = true;
  bool differential = true;  // V2 only: false is the authors' matched baseline (h query heads, no lambda_proj)
  int threads = 0;  // for a policy with threads; 0 means its default
  // simd: the path of bfloat16 matrix products, policy::simd::bf16_products
  // by name (automatic, converting, dot_instructions).
  std::string bf16_product = "automatic";
  // simd: who multiplies products of many rows, policy::simd::matmuls by
  // name (automatic, difftx, onednn).
  std::string matmuls = "automatic";
  // cuda: whose attention kernels run, policy::cuda::attention by name
  // (difftx, cudnn); the policy's default, cuDNN's where this tool was built with it.
  std::string cuda_attention{name_of(default_cuda_attention)};
  int logit_bits = 16;  // attention logits quantized to this many bits (16: not at all)
  inference_dtype qk_dtype = inference_dtype::same;  // int8: Q·Kᵀ on int8 queries and keys
};

// The module kinds `difftx run` and `difftx bench` take (decoder_stack is the check's).
inline const std::vector<std::string> module_kinds{"multihead", "decoder_layer", "attention",       "rmsnorm",
                                                   "swiglu",    "multihead_v2",  "decoder_layer_v2"};

bool uses_head_dim(const std::string& kind);  // every kind with attention
// multihead, decoder_layer, decoder_stack (V1): q_proj is [2hD, C] with D from lambda_q1.
bool is_differential(const std::string& kind);
// multihead_v2, decoder_layer_v2: differential attention V2 (MultiHeadV2), run with the
// difftx::dynamic head size only; spec.differential false is its baseline.
bool is_v2(const std::string& kind);

class runner {
 public:
  virtual ~runner() = default;

  // Parameters by the spec's names (io/parameters.hpp); every name and shape is
  // checked first, then every value as the module's type must be finite.
  virtual void load(const io::tensor_file& weights, const std::string& label) = 0;
  virtual io::tensor_file parameters(io::dtype type) = 0;
  virtual io::tensor_file gradients(io::dtype type) = 0;
  virtual void zero_grad() = 0;

  // x [B, N, C] and dy [B, N, C], any stored type; label names the file in errors.
  virtual void set_input(const io::stored_tensor& x, const std::string& label) = 0;
  virtual void set_grad_output(const io::stored_tensor& dy, const std::string& label) = 0;
  virtual void forward() = 0;   // y = module(x), saving what backward needs
  virtual void backward() = 0;  // dx from dy; parameter gradients accumulate
  // Decoding with a KV cache (modules with attention; input_error for others):
  // prefill the input x [B, N, C] into a fresh cache of N + 1 tokens per
  // sequence; then each decode_step() decodes one new token per sequence (a
  // copy of x's last) with the cache held at N tokens, so every step costs the same.
  // weights int8: every projection quantized first; cache int8: an int8 KV cache.
  virtual void prepare_decode(inference_dtype weights, inference_dtype cache) = 0;
  virtual void decode_step() = 0;
  // Throw input_error if y (after forward) or dx and a parameter gradient
  // (after backward) holds a NaN or an infinity, naming the tensor, the first
  // such element and, for y, the first intermediate where it began.
  virtual void require_finite_output() const = 0;
  virtual void require_finite_gradients() = 0;
  virtual io::stored_tensor output(io::dtype type) const = 0;
  virtual io::stored_tensor grad_input(io::dtype type) const = 0;
  // y or dx as an .npy of `type` (float32 or float64), converted a chunk at a time.
  virtual void write_output(std::ostream& out, io::dtype type, const std::string& label) const = 0;
  virtual void write_grad_input(std::ostream& out, io::dtype type, const std::string& label) const = 0;

  // Milliseconds `work` (calls of this runner) takes, measured as its policy
  // needs: the host clock, or device events read after the device is done.
  virtual double elapsed_ms(const std::function<void()>& work) const = 0;
  virtual int threads() const = 0;
  // What this runner's bfloat16 matrix products run on ("vdpbf16ps" or
  // "converting": to float while packed), or "" where that is not a choice
  // (other types and policies).
  virtual std::string bf16_product() const { return ""; }
  // What ran this runner's attention calls so far, "cudnn 4" or "difftx tensor
  // cores 2, cudnn 2", where the policy counts them (cuda); else "".
  virtual std::string attention_paths() const { return ""; }
};

// The registry (policies.hpp, and cuda where DIFFTX_CLI_CUDA is on), by name.
std::vector<std::string> built_policy_names();  // slowest first
std::string fastest_policy();                   // of those that run on the host: the default
// Why a built policy cannot run here ("no CUDA device was found: ..."), or "" when it can.
std::string unavailable_reason(std::string_view policy);
// Head sizes with an instantiation of their own; any other positive even D
// runs on the difftx::dynamic one (the same kernels).
std::vector<index_t> compiled_head_dims(std::string_view policy);
// "simd (avx512bw)" for a policy that reports its instruction set, "cuda
// (NVIDIA H100 80GB HBM3, sm_90)" for the device, else the name; a non-empty
// `detail` joins the parentheses ("simd (avx512bw, vdpbf16ps)").
std::string policy_description(std::string_view policy, const std::string& detail = "");
bool computes_in(std::string_view policy, io::dtype type);

// Throws input_error for a policy that is not built or a module config it
// rejects (an odd head size, say).
std::unique_ptr<runner> make_runner(const module_spec& spec, std::string_view policy, io::dtype type);

// f.template operator()<T>() for the number type of t.
template <class F>
decltype(auto) with_type(io::dtype t, F&& f) {
  switch (t) {
    case io::dtype::f64: return f.template operator()<double>();
    case io::dtype::f32: return f.template operator()<float>();
    case io::dtype::f16: return f.template operator()<Eigen::half>();
    case io::dtype::bf16: break;
  }
  return f.template operator()<Eigen::bfloat16>();
}

}  // namespace difftx::cli
