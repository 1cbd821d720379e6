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

#include <nlohmann/json_fwd.hpp>

#include <difftx/io/tensor_file.hpp>
#include <difftx/ops/int8.hpp>

#include "module_kinds.hpp"
#include "policy_options.hpp"

namespace difftx::cli {

// What a runner's kernels are on this CPU, as `bench --json` reports them
// (product_kernel, score_tile_kernel, amx_tiles) and the policy column
// describes them (detail()).
struct kernel_report {
  // Products of many rows (prefill, training): "onednn <its kernel>" where
  // oneDNN takes them, else difftx's: "vdpbf16ps" or "converting" for
  // bfloat16, "difftx" for the other types; "" for a policy without that choice.
  std::string products;
  // Decoding's products of a few rows, which resolve apart from those of
  // many rows: "vdpbf16ps" or "converting" for bfloat16, else "".
  std::string decoding_products;
  // The attention's Q·Kᵀ tiles: "amx bf16", "amx int8", "vdpbf16ps",
  // "avx512vnni" or "float" (simd; score_tile_kernel); "" for a policy without that choice.
  std::string score_tiles;
  bool amx_tiles = false;  // simd's AMX tiles asked for and granted (amx_tiles_used)

  // The policy column's words: the products (unless difftx's plain ones), decoding's where
  // they differ, then "amx tiles".
  std::string detail() const {
    std::string words = products == "difftx" ? "" : products;
    if (!decoding_products.empty() && decoding_products != products)
      words += (words.empty() ? "decoding " : ", decoding ") + decoding_products;
    if (amx_tiles) words += words.empty() ? "amx tiles" : ", amx tiles";
    return words;
  }
};
// The report as --json's fields: product_kernel, decode_product_kernel and
// score_tile_kernel (null where empty), amx_tiles.
void add_kernel_fields(nlohmann::json& j, const kernel_report& kernels);

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
  virtual kernel_report kernels() const = 0;
  // What ran this runner's attention calls so far, "cudnn 4" or "difftx tensor
  // cores 2, cudnn 2", where the policy counts them (cuda); else "".
  virtual std::string attention_paths() const { return ""; }
};

// The registry (policies.hpp, and cuda where DIFFTX_CLI_CUDA is on), by name.
std::vector<std::string> built_policy_names();  // slowest first
std::string fastest_policy();                   // of those that run on the host: the default
// Why a built policy cannot run here ("no CUDA device was found: ..."), or "" when it can.
std::string unavailable_reason(std::string_view policy);
// "simd (avx512bw)" for a policy that reports its instruction set, "cuda
// (NVIDIA H100 80GB HBM3, sm_90)" for the device, else the name; a non-empty
// `detail` joins the parentheses ("simd (avx512bw, vdpbf16ps)").
std::string policy_description(std::string_view policy, const std::string& detail = "");
bool computes_in(std::string_view policy, io::dtype type);

// The module spec makes, computing as options say on policy. Throws
// input_error for a policy that is not built or a module config it rejects
// (an odd head size, say).
std::unique_ptr<runner> make_runner(const module_spec& spec, std::string_view policy, io::dtype type,
                                    const policy_options& options);

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
