// A LanguageModel of DecoderLayers (modules/language_model.hpp) of any number
// type on any host policy behind one virtual interface, so `difftx generate`
// chooses both at run time, as runner.hpp does for single modules. It decodes
// one sequence greedily with the KV cache: prefill the prompt, then one token
// at a time.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include <difftx/io/tensor_file.hpp>
#include <difftx/ops/common.hpp>

#include "runner.hpp"

namespace difftx::cli {

struct language_model_spec {
  module_spec layer;       // layer 0's decoder_layer; layer i gets layer_index layer.layer_index + i
  index_t vocab_size = 0;  // V
  index_t layers = 0;      // L
};

class generator {
 public:
  virtual ~generator() = default;

  // Every parameter under the spec's names (embed_tokens.weight,
  // layers.<i>.<DecoderLayer names>, norm.weight, lm_head.weight): every name
  // and shape checked first (load_parameters), then every value as the
  // model's type must be finite.
  virtual void load(const io::tensor_file& weights, const std::string& label) = 0;
  // The cache restarts with prompt, with room for `capacity` tokens in all;
  // returns the most likely token after the prompt.
  virtual token_t prefill(std::span<const token_t> prompt, index_t capacity) = 0;
  // token joins the cache; returns the most likely token after it.
  virtual token_t decode(token_t token) = 0;
  virtual int threads() const = 0;
};

// Policies a generator runs on: the registry's host policies (policies.hpp).
bool generates_on(std::string_view policy);
// Throws input_error for a policy that is not one of them or a config the
// model rejects. Every head size runs on the difftx::dynamic instantiation.
std::unique_ptr<generator> make_generator(const language_model_spec& spec, std::string_view policy, io::dtype type);

}  // namespace difftx::cli
