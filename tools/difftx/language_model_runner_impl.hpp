// model_runner<Model>, a LanguageModel behind language_model_runner, and
// detail::make_language_model<T, Policy>, which builds one with the run-time
// head size. Included by language_model_runner.cpp for the host policies and
// by the nvcc-compiled runners_cuda.cu for policy::cuda, so it works
// on host and device memory alike: token ids go to the model's memory, and
// logits come back to the host only where the host reads them (the npy file,
// the greedy pick of bench's steps, the finiteness checks).
#pragma once

#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <difftx/core/transfer.hpp>
#include <difftx/io/npy.hpp>
#include <difftx/modules/non_finite.hpp>

#include "language_model_runner.hpp"
#include "runner_impl.hpp"  // policy_threads, kernel_report_of, detail::make_policy

namespace difftx::cli {

template <class Model>
class model_runner final : public language_model_runner {
  using T = typename Model::value_type;

 public:
  model_runner(Model model, const language_model_spec& spec, bool packed_weights)
      : model_(std::move(model)), weights_(spec.weights), kv_cache_(spec.kv_cache), decodes_(spec.decodes),
        packed_weights_(packed_weights), logit_bits_(spec.first().attention.logit_bits),
        qk_(spec.first().attention.qk_dtype) {}

  void load(const io::diffllama_checkpoint& checkpoint) override { load_from(checkpoint); }
  void load(const io::mapped_safetensors& file) override { load_from(file); }

  void forward(const Tensor<token_t, 2>& tokens) override {
    logits_.resize(model_.output_shape(tokens.shape()), memory());
    model_.forward(to_memory(tokens, memory()).const_view(), logits_.view());
    double value = 0;
    const index_t i = difftx::detail::first_non_finite_index(logits_.data(), logits_.size(), memory(), value);
    if (i >= 0)
      throw input_error("run", "logits", "finite values from finite weights",
                        std::to_string(value) + " at flat index " + std::to_string(i) + " as " +
                            std::string(scalar_traits<T>::name) + " (the model overflows its number type)");
  }
  void write_logits(std::ostream& out, io::dtype type, const std::string& label) const override {
    if (memory().space() == memory_space::host) return io::write_npy_to(out, type, logits_.const_view(), label);
    io::write_npy_to(out, type, to_memory(logits_, host_memory()).const_view(), label);
  }

  std::vector<token_t> generate(std::span<const token_t> prompt, const generation_options& options,
                                const std::function<void(token_t)>& on_token) const override {
    auto with_kv = options;
    with_kv.kv_cache = kv_cache_;
    return difftx::generate(model_, prompt, with_kv, on_token);
  }
  std::vector<std::vector<token_t>> generate(std::span<const std::vector<token_t>> prompts,
                                             std::span<const generation_options> options,
                                             const std::function<void(std::size_t, token_t)>& on_token) const override {
    std::vector<generation_options> with_kv(options.begin(), options.end());
    for (auto& o : with_kv) o.kv_cache = kv_cache_;
    return difftx::generate(model_, prompts, std::span<const generation_options>(with_kv), on_token);
  }

  token_t prefill(std::span<const token_t> prompt, index_t capacity) override {
    const auto tokens = in_model_memory(prompt);
    cache_ = model_.make_cache(1, capacity, kv_cache_);
    logits_.resize({1, 1, model_.config().vocab_size}, memory());
    model_.prefill(tokens.const_view(), cache_, logits_.view().template reshape<2>({1, model_.config().vocab_size}));
    return most_likely();
  }

  token_t decode(token_t token) override {
    const auto tokens = in_model_memory(std::span(&token, 1));
    logits_.resize(model_.output_shape(tokens.shape()), memory());
    model_.decode(tokens.const_view(), cache_, logits_.view());
    return most_likely();
  }

  // Every parameter but the embedding (a token reads one row of it), each
  // Linear's weight as its products read it (int8 rows, decoding panels or W),
  // and a tied head's table.
  std::vector<std::span<const std::byte>> weights_read_per_token() override {
    std::unordered_map<const T*, std::vector<std::span<const std::byte>>> linear_reads;
    model_.for_each_linear([&](const auto& linear) { linear_reads.emplace(linear.weight_data(), linear.decode_reads()); });
    std::vector<std::span<const std::byte>> read;
    const auto append = [&](const std::vector<std::span<const std::byte>>& regions) {
      read.insert(read.end(), regions.begin(), regions.end());
    };
    for (const auto& p : model_.parameters()) {
      if (p.name == "embed_tokens.weight")
        append(model_.tied_head_reads());
      else if (const auto linear = linear_reads.find(p.value); linear != linear_reads.end())
        append(linear->second);
      else
        read.push_back(std::as_bytes(std::span<const T>(p.value, static_cast<std::size_t>(p.size()))));
    }
    return read;
  }
  std::vector<std::span<const std::byte>> cache_read_per_token() const override {
    std::vector<std::span<const std::byte>> read;
    for (const auto& layer : cache_) {
      const auto regions = layer.stored_regions();
      read.insert(read.end(), regions.begin(), regions.end());
    }
    return read;
  }
  int threads() const override { return policy_threads(model_.policy()); }
  kernel_report kernels() const override {
    return weights_ == inference_dtype::int8 ? kernel_report_of<T, std::int8_t>(model_.policy(), logit_bits_, qk_)
                                             : kernel_report_of<T>(model_.policy(), logit_bits_, qk_);
  }

 private:
  memory_resource& memory() const { return model_.policy().memory(); }

  // One sequence of ids [1, n] from the host, in the model's memory.
  Tensor<token_t, 2> in_model_memory(std::span<const token_t> ids) const {
    return to_memory(TensorView<const token_t, 2>(ids.data(), {1, static_cast<index_t>(ids.size())}), memory());
  }

  template <class Source>
  void load_from(const Source& source) {
    io::load_parameters(model_, source);
    // In T, so a float16 overflow shows too (as `difftx run` checks); a
    // parameter on the device is read back one at a time.
    for (const auto& p : model_.parameters()) {
      double value = 0;
      if (const index_t i = difftx::detail::first_non_finite_index(p.value, p.size(), *p.memory, value); i >= 0)
        throw input_error("load", source.label() + ": " + p.name + " as " + std::string(scalar_traits<T>::name),
                          "finite values", std::to_string(value) + " at flat index " + std::to_string(i));
    }
    if (weights_ == inference_dtype::int8)
      quantize(model_);
    else if (decodes_)
      model_.add_decoding_panels();
    if (packed_weights_) model_.add_packed_weights();
  }

  // The largest logit of the last step (the first of equal ones; logits_ holds one position).
  token_t most_likely() const {
    const auto count = static_cast<std::size_t>(logits_.size());
    if (memory().space() == memory_space::host) return greedy_.next(std::span<const T>(logits_.data(), count));
    std::vector<T> row(count);
    memory().download(row.data(), logits_.data(), count * sizeof(T));
    return greedy_.next(std::span<const T>(row));
  }

  Model model_;
  inference_dtype weights_, kv_cache_;
  bool decodes_, packed_weights_;
  int logit_bits_;
  inference_dtype qk_;
  typename Model::cache_type cache_;
  Tensor<T, 3> logits_;  // [B, tokens of the last call, V], in the model's memory
  mutable token_sampler greedy_{sampling_options{}};
};

namespace detail {

// LanguageModel<DecoderLayer<T, dynamic, Policy>> of spec, its parameters not yet set (load() sets them).
template <class T, class Policy>
std::unique_ptr<language_model_runner> make_language_model(const language_model_spec& spec,
                                                           const policy_options& options) {
  using Layer = DecoderLayer<T, dynamic, Policy>;
  const auto policy = make_policy<Policy>(options);
  const uninitialised_parameters loaded_next;  // load() sets every parameter
  std::vector<Layer> layers;
  layers.reserve(spec.layers.size());
  for (const auto& config : spec.layers) layers.emplace_back(config, policy);
  return std::make_unique<model_runner<LanguageModel<Layer>>>(LanguageModel<Layer>(spec.model, std::move(layers)), spec,
                                                              options.packed_weights);
}

}  // namespace detail

}  // namespace difftx::cli
