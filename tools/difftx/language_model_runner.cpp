// make_language_model_runner: LanguageModel<DecoderLayer<T, dynamic, Policy>>
// for each host policy of the registry (policies.hpp) and each number type.
// Only the run-time head size is instantiated: a compiled D runs the same
// kernels (docs/benchmarks.md), and each instantiation lengthens the build.
#include "language_model_runner.hpp"

#include <algorithm>
#include <tuple>
#include <utility>
#include <vector>

#include <difftx/io/npy.hpp>

#include "policies.hpp"
#include "runner_impl.hpp"  // policy_threads, product_kernel_of, detail::make_policy

namespace difftx::cli {

namespace {

template <class Model>
class model_runner final : public language_model_runner {
  using T = typename Model::value_type;

 public:
  model_runner(Model model, const language_model_spec& spec)
      : model_(std::move(model)), weights_(spec.weights), kv_cache_(spec.kv_cache), decodes_(spec.decodes) {}

  void load(const io::diffllama_checkpoint& checkpoint) override { load_from(checkpoint); }
  void load(const io::mapped_safetensors& file) override { load_from(file); }

  void forward(const Tensor<token_t, 2>& tokens) override {
    logits_.resize(model_.output_shape(tokens.shape()), model_.policy().memory());
    model_.forward(tokens.const_view(), logits_.view());
    double value = 0;
    const index_t i = difftx::detail::first_non_finite_index(logits_.data(), logits_.size(), logits_.memory(), value);
    if (i >= 0)
      throw input_error("run", "logits", "finite values from finite weights",
                        std::to_string(value) + " at flat index " + std::to_string(i) + " as " +
                            std::string(scalar_traits<T>::name) + " (the model overflows its number type)");
  }
  void write_logits(std::ostream& out, io::dtype type, const std::string& label) const override {
    io::write_npy_to(out, type, logits_.const_view(), label);
  }

  std::vector<token_t> generate(std::span<const token_t> prompt, const generation_options& options,
                                const std::function<void(token_t)>& on_token) const override {
    auto with_kv = options;
    with_kv.kv_cache = kv_cache_;
    return difftx::generate(model_, prompt, with_kv, on_token);
  }

  token_t prefill(std::span<const token_t> prompt, index_t capacity) override {
    Tensor<token_t, 2> tokens({1, static_cast<index_t>(prompt.size())});
    std::copy(prompt.begin(), prompt.end(), tokens.data());
    cache_ = model_.make_cache(1, capacity, kv_cache_);
    logits_.resize({1, 1, model_.config().vocab_size}, model_.policy().memory());
    model_.prefill(tokens.const_view(), cache_, logits_.view().template reshape<2>({1, model_.config().vocab_size}));
    return most_likely();
  }

  token_t decode(token_t token) override {
    Tensor<token_t, 2> tokens({1, 1});
    tokens(0, 0) = token;
    logits_.resize(model_.output_shape(tokens.shape()), model_.policy().memory());
    model_.decode(tokens.const_view(), cache_, logits_.view());
    return most_likely();
  }

  std::vector<std::span<const std::byte>> weights_read_per_token() override {
    if (weights_ == inference_dtype::int8) return {};
    const bool tied = model_.config().tie_word_embeddings;
    std::vector<std::span<const std::byte>> read;
    for (const auto& p : model_.parameters())
      if (tied || p.name != "embed_tokens.weight")
        read.push_back(std::as_bytes(std::span<const T>(p.value, static_cast<std::size_t>(p.size()))));
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
  std::string product_kernel() const override { return product_kernel_of<T>(model_.policy()); }

 private:
  template <class Source>
  void load_from(const Source& source) {
    io::load_parameters(model_, source);
    // In T, so a float16 overflow shows too (as `difftx run` checks).
    for (const auto& p : model_.parameters())
      require_finite("load", source.label() + ": " + p.name + " as " + std::string(scalar_traits<T>::name),
                     p.value_view());
    if (weights_ == inference_dtype::int8)
      quantize(model_);
    else if (decodes_)
      model_.add_decoding_panels();
  }

  // The largest logit of the last step (the first of equal ones; logits_ holds one position).
  token_t most_likely() const {
    return greedy_.next(std::span<const T>(logits_.data(), static_cast<std::size_t>(logits_.size())));
  }

  Model model_;
  inference_dtype weights_, kv_cache_;
  bool decodes_;
  typename Model::cache_type cache_;
  Tensor<T, 3> logits_;  // [B, tokens of the last call, V]
  mutable token_sampler greedy_{sampling_options{}};
};

template <class T, class Policy>
std::unique_ptr<language_model_runner> make_model(const language_model_spec& spec) {
  using Layer = DecoderLayer<T, dynamic, Policy>;
  const auto policy = detail::make_policy<Policy>({.threads = spec.threads, .bf16_product = spec.bf16_product, .matmuls = spec.matmuls});
  const uninitialised_parameters loaded_next;  // load() sets every parameter
  std::vector<Layer> layers;
  layers.reserve(spec.layers.size());
  for (const auto& config : spec.layers) layers.emplace_back(config, policy);
  return std::make_unique<model_runner<LanguageModel<Layer>>>(LanguageModel<Layer>(spec.model, std::move(layers)), spec);
}

// f(entry) for each host registry entry, in order.
template <class F>
void for_each_policy(F&& f) {
  std::apply([&](auto... entries) { (f(entries), ...); }, built_policies{});
}

}  // namespace

bool runs_language_models(std::string_view policy) {
  bool found = false;
  for_each_policy([&](auto entry) { found = found || policy == decltype(entry)::policy_type::name; });
  return found;
}

std::unique_ptr<language_model_runner> make_language_model_runner(const language_model_spec& spec,
                                                                  std::string_view policy, io::dtype type) {
  return with_type(type, [&]<class T>() {
    std::unique_ptr<language_model_runner> made;
    for_each_policy([&](auto entry) {
      using Policy = typename decltype(entry)::policy_type;
      if constexpr (Policy::template supports<T>)
        if (policy == Policy::name) made = make_model<T, Policy>(spec);
    });
    require(made != nullptr, "make_language_model_runner", "policy",
            "a host policy built into difftx that computes in " + std::string(scalar_traits<T>::name),
            std::string(policy));
    return made;
  });
}

}  // namespace difftx::cli
