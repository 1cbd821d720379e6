// A LanguageModel of DecoderLayers (modules/language_model.hpp) of any number
// type on any policy built (the host's, and policy::cuda's in a CUDA build)
// behind one virtual interface, so `difftx run
// --model`, `generate` and `bench --model` choose both at run time, as
// runner.hpp does for single modules. It loads from a Hugging Face DiffLlama
// folder or a difftx file (model_source.hpp), computes logits for a batch of
// token ids, and generates from one prompt or several at once with the KV cache.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <difftx/generation/generate.hpp>
#include <difftx/io/diffllama.hpp>
#include <difftx/io/mapped_safetensors.hpp>
#include <difftx/modules/decoder_layer.hpp>
#include <difftx/modules/language_model.hpp>
#include <difftx/ops/common.hpp>

#include "runner.hpp"  // kernel_report, policy_options

namespace difftx::cli {

// Milliseconds since start on the steady clock: generate's and bench --model's timings.
inline double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// What a language model is: its own config and each layer's (how to compute
// it is policy_options.hpp's).
struct language_model_spec {
  LanguageModelConfig model;
  std::vector<DecoderLayerConfig> layers = {};
  // Low-bit inference (docs/semantics.md): int8 weights, quantized once as
  // they load; an int8 KV cache for prefill and decode.
  inference_dtype weights = inference_dtype::same, kv_cache = inference_dtype::same;
  // generate and bench decode: weights with a wide input then get decoding
  // panels (modules/linear.hpp), which a forward over whole prompts (run)
  // would never read and would hold as a second copy.
  bool decodes = false;

  const DecoderLayerConfig& first() const { return layers.front(); }
};

class language_model_runner {
 public:
  virtual ~language_model_runner() = default;

  // Every parameter, decoded from the file or folder into the model (every
  // name, dtype and shape checked first by load_parameters), then every value
  // as the model's type must be finite.
  virtual void load(const io::diffllama_checkpoint& checkpoint) = 0;
  virtual void load(const io::mapped_safetensors& file) = 0;

  // tokens [B, N] -> logits [B, N, V], kept for write_logits; input_error
  // naming the first NaN or infinity.
  virtual void forward(const Tensor<token_t, 2>& tokens) = 0;
  // The logits as an .npy of `type` (float32 or float64), converted a chunk at a time.
  virtual void write_logits(std::ostream& out, io::dtype type, const std::string& label) const = 0;

  // generation/generate.hpp: the new tokens, on_token called with each as it is chosen.
  virtual std::vector<token_t> generate(std::span<const token_t> prompt, const generation_options& options,
                                        const std::function<void(token_t)>& on_token) const = 0;
  // Several prompts decoded together, options one per prompt: each prompt's
  // new tokens, on_token(i, t) called with prompt i's as it is chosen.
  virtual std::vector<std::vector<token_t>> generate(
      std::span<const std::vector<token_t>> prompts, std::span<const generation_options> options,
      const std::function<void(std::size_t, token_t)>& on_token) const = 0;

  // bench --model's steps, greedy. The cache restarts with prompt, with room
  // for `capacity` tokens in all (the head runs at its last token only);
  // returns the most likely token after the prompt.
  virtual token_t prefill(std::span<const token_t> prompt, index_t capacity) = 0;
  // token joins the cache; returns the most likely token after it.
  virtual token_t decode(token_t token) = 0;
  // The memory one decode step reads weights from: every parameter but the
  // embedding table (one row of it is read), which is read whole where it is
  // also the output head; each projection as its products read it (its int8
  // rows with int8 weights, its decoding panels where it has them).
  virtual std::vector<std::span<const std::byte>> weights_read_per_token() = 0;
  // What the last decode step read of the cache: every layer's stored keys
  // and values (KVCache::stored_regions), its own token's row included.
  virtual std::vector<std::span<const std::byte>> cache_read_per_token() const = 0;
  virtual int threads() const = 0;
  // What its kernels run on (runner::kernels; the products of int8 weights where they are int8).
  virtual kernel_report kernels() const = 0;
};

// On every policy built (runner.hpp's built_policy_names): the registry's
// host policies, and policy::cuda where the tool is built with CUDA, computing
// as options say (options.packed_weights: the layers' weights also in
// oneDNN's packed layout, LanguageModel::add_packed_weights). Throws
// input_error for a policy that is not one of them or a config the model
// rejects (int8 weights or cache on the GPU). Every head size runs on the
// difftx::dynamic instantiation.
std::unique_ptr<language_model_runner> make_language_model_runner(const language_model_spec& spec,
                                                                  std::string_view policy, io::dtype type,
                                                                  const policy_options& options);

}  // namespace difftx::cli
