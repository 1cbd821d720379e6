// LanguageModel<Layer>: a small decoder-only language model around a stack of
// layers (DecoderLayer, BaselineLayer, or any [B, N, C] -> [B, N, C] module):
//   x      = Embedding(tokens)              tokens [B, N] -> [B, N, C]
//   hidden = Stack<Layer>(x)                [B, N, C]
//   normed = RMSNorm(hidden; w_norm)        [B, N, C]
//   logits = normed W_headᵀ                 [B, N, V]   (W_head: lm_head, or the embedding table when tied)
// The loss is separate (cross_entropy_forward/backward on the logits), so the
// same model serves any objective. Parameters: "embed_tokens.weight" [V, C],
// "layers.<i>.<Layer names>", "norm.weight" [C], "lm_head.weight" [V, C]
// (absent when tied: the head then reads the table and adds its gradient into
// the table's, as PyTorch's tied nn.Linear and nn.Embedding do).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "difftx/core/checks.hpp"
#include "difftx/modules/architecture.hpp"
#include "difftx/modules/embedding.hpp"
#include "difftx/modules/linear.hpp"
#include "difftx/modules/linear_weight_forms.hpp"
#include "difftx/modules/parameter.hpp"
#include "difftx/modules/rmsnorm.hpp"
#include "difftx/ops/decode_step.hpp"
#include "difftx/modules/sequences.hpp"
#include "difftx/modules/stack.hpp"

namespace difftx {

struct LanguageModelConfig {
  index_t vocab_size = 0;  // V
  index_t d_model = 0;     // C, the width of every layer
  double eps = 1e-5;       // of the final RMSNorm
  bool tie_word_embeddings = false;  // the output head is the embedding table (no lm_head.weight)
};

// modules/architecture.hpp: a LanguageModel's, from the configs of its layers
// (the keys describe(model) gives: the tie, the layer count, each layer's, the final norm's eps).
template <class LayerConfig>
void describe_architecture(architecture& a, const std::string& prefix, const LanguageModelConfig& c,
                           std::span<const LayerConfig> layers) {
  a[prefix + "tie_word_embeddings"] = architecture_value(c.tie_word_embeddings);
  a[prefix + "layers"] = architecture_value(static_cast<index_t>(layers.size()));
  for (std::size_t i = 0; i < layers.size(); ++i)
    describe_architecture(a, prefix + "layers." + std::to_string(i) + ".", layers[i]);
  a[prefix + "norm.eps"] = architecture_value(c.eps);
}

template <class Layer>
class LanguageModel : public detail::linear_weight_forms<LanguageModel<Layer>> {
 public:
  using value_type = typename Layer::value_type;
  using policy_type = typename Layer::policy_type;
  using layer_type = Layer;

 private:
  using T = value_type;
  using Policy = policy_type;

 public:
  struct saved_type {
    shape_t<2> input_shape{};
    typename Embedding<T, Policy>::saved_type embed;
    Tensor<T, 3> x;  // [B, N, C] the embeddings, the stack's input
    typename Stack<Layer>::saved_type stack;
    Tensor<T, 3> hidden;  // [B, N, C] the last layer's output
    typename RMSNorm<T, Policy>::saved_type norm;
    Tensor<T, 3> normed;  // [B, N, C] the head's input
  };

  // layers: built by the caller (layer indices, heads, ...), each C wide.
  LanguageModel(const LanguageModelConfig& config, std::vector<Layer> layers)
      : config_(checked(config, layers)),
        embed_(config.vocab_size, config.d_model, first_policy(layers)),
        layers_(std::move(layers)),
        norm_(config.d_model, config.eps, 1.0, layers_.policy()) {
    if (!config.tie_word_embeddings) head_.emplace(config.d_model, config.vocab_size, layers_.policy());
  }

  const LanguageModelConfig& config() const noexcept { return config_; }
  const Stack<Layer>& layers() const noexcept { return layers_; }
  shape_t<3> output_shape(const shape_t<2>& tokens) const noexcept { return {tokens[0], tokens[1], config_.vocab_size}; }

  // The output of layer i (0-based) in a forward's saved state, [B, N, C].
  const Tensor<T, 3>& layer_output(const saved_type& s, std::size_t i) const {
    require(i < layers_.size(), "LanguageModel::layer_output", "i", "a layer index < " + std::to_string(layers_.size()),
            std::to_string(i));
    require(s.input_shape != shape_t<2>{}, "LanguageModel::layer_output", "saved", "the state of a forward",
            "a state no forward has filled");
    return i + 1 == layers_.size() ? s.hidden : s.stack.inputs[i];
  }

  // tokens [B, N] -> logits [B, N, V]; or a packed batch tokens [1, total]
  // with its cu_seqlens (modules/sequences.hpp), each sequence on its own.
  void forward(cview<token_t, 2> tokens, TensorView<T, 3> logits, saved_type& s, sequence_offsets sequences = {}) const {
    constexpr std::string_view where = "LanguageModel::forward";
    require_nonempty(where, "tokens", tokens);
    require_shape(where, "logits", logits, output_shape(tokens.shape()));
    if (!sequences.empty()) detail::check_sequence_offsets(where, "tokens", tokens, sequences);
    const shape_t<3> shape = embed_.output_shape(tokens.shape());
    auto& memory = layers_.policy().memory();
    for (auto* t : {&s.x, &s.hidden, &s.normed}) t->resize(shape, memory);
    embed_.forward(tokens, s.x.view(), s.embed);
    layers_.forward(s.x.view(), s.hidden.view(), s.stack, sequences);
    norm_.forward(s.hidden.view(), s.normed.view(), s.norm);
    head_forward(s.normed.view(), logits);
    s.input_shape = tokens.shape();
  }

  // Inference, keeping no state: one layer's scratch at a time.
  void forward(cview<token_t, 2> tokens, TensorView<T, 3> logits, sequence_offsets sequences = {}) const {
    infer("LanguageModel::forward", tokens, logits, sequences,
          [&](cview<T, 3> x, TensorView<T, 3> hidden) { layers_.forward(x, hidden, sequences); });
  }
  // With KV caches, one per layer (modules/kv_cache.hpp).
  using cache_type = typename Stack<Layer>::cache_type;
  cache_type make_cache(index_t batch, index_t capacity, inference_dtype storage = inference_dtype::same) const {
    return layers_.make_cache(batch, capacity, storage);
  }
  // Prompts tokens [B, N] (or packed [1, total] with cu_seqlens) -> logits
  // [B, N, V]; the caches restart with them.
  void prefill(cview<token_t, 2> tokens, cache_type& cache, TensorView<T, 3> logits,
               sequence_offsets sequences = {}) const {
    infer("LanguageModel::prefill", tokens, logits, sequences,
          [&](cview<T, 3> x, TensorView<T, 3> hidden) { layers_.prefill(x, cache, hidden, sequences); });
  }
  // The same, with the logits of each prompt's last token only: last [B, V],
  // or [S, V] for a packed batch of S sequences. Generation reads no other
  // row, and the head (V·C per row) is the largest product of a large vocabulary.
  void prefill(cview<token_t, 2> tokens, cache_type& cache, TensorView<T, 2> last,
               sequence_offsets sequences = {}) const {
    constexpr std::string_view where = "LanguageModel::prefill";
    check_tokens(where, tokens, sequences);
    const index_t rows = sequences.empty() ? tokens.extent(0) : static_cast<index_t>(sequences.size()) - 1;
    require_shape(where, "last", last, shape_t<2>{rows, config_.vocab_size});
    const auto normed = final_states(tokens, [&](cview<T, 3> x, TensorView<T, 3> hidden) {
      layers_.prefill(x, cache, hidden, sequences);
    });
    // Row r of picked: the last token of sequence r.
    const index_t C = config_.d_model, N = tokens.extent(1);
    auto& memory = layers_.policy().memory();
    Tensor<T, 3> picked({1, rows, C}, memory);
    for (index_t r = 0; r < rows; ++r) {
      const index_t row = sequences.empty() ? r * N + N - 1 : sequences[static_cast<std::size_t>(r) + 1] - 1;
      memory.copy(picked.data() + r * C, normed.data() + row * C, static_cast<std::size_t>(C) * sizeof(T));
    }
    head_forward(picked.const_view(), last.template reshape<3>({1, rows, config_.vocab_size}));
  }
  // New tokens [B, T] -> logits [B, T, V]; they join the caches.
  // The whole step, head included, as one unit of the policy's work (ops/decode_step.hpp).
  void decode(cview<token_t, 2> tokens, cache_type& cache, TensorView<T, 3> logits) const {
    run_decode_step(policy(), tokens.size(), [&] {
      infer("LanguageModel::decode", tokens, logits, {},
            [&](cview<T, 3> x, TensorView<T, 3> hidden) { layers_.decode(x, cache, hidden); });
    });
  }

  // dlogits [B, N, V] -> every parameter gradient accumulates (no input gradient: tokens are discrete)
  void backward(cview<token_t, 2> tokens, cview<T, 3> dlogits, const saved_type& s) {
    constexpr std::string_view where = "LanguageModel::backward";
    require_nonempty(where, "tokens", tokens);
    require_saved(where, s.input_shape, tokens.shape(), "tokens");
    require_shape(where, "dlogits", dlogits, output_shape(tokens.shape()));
    require_trainable(where);
    auto& memory = layers_.policy().memory();
    Tensor<T, 3> a(s.x.shape(), memory), b(s.x.shape(), memory);
    head_backward(s.normed.view(), dlogits, a.view());                  // a = d normed
    norm_.backward(s.hidden.view(), a.view(), s.norm, b.view());        // b = d hidden
    layers_.backward(s.x.view(), b.view(), s.stack, a.view());          // a = d x
    embed_.backward(tokens, a.view(), s.embed);
  }

  std::vector<parameter_ref<T>> parameters(const std::string& prefix = "") {
    std::vector<parameter_ref<T>> all;
    append_parameters(all, embed_.parameters(prefix + "embed_tokens."));
    append_parameters(all, layers_.parameters(prefix));
    append_parameters(all, norm_.parameters(prefix + "norm."));
    if (head_) append_parameters(all, head_->parameters(prefix + "lm_head."));
    return all;
  }
  // Draws every parameter from rng in order (embedding, layers 0..L-1, norm, head),
  // so layers built with the same default initialisation become distinct.
  void reset_parameters(random_stream& rng) {
    embed_.reset_parameters(rng);
    layers_.reset_parameters(rng);
    norm_.reset_parameters(rng);
    if (head_) head_->reset_parameters(rng);
  }
  const Policy& policy() const noexcept { return layers_.policy(); }
  // modules/architecture.hpp: the tie, every layer's constants, the final norm's eps.
  void describe_architecture(architecture& a, const std::string& prefix) const {
    a[prefix + "tie_word_embeddings"] = architecture_value(config_.tie_word_embeddings);
    layers_.describe_architecture(a, prefix);
    norm_.describe_architecture(a, prefix + "norm.");
  }

  // Inference with int8 weights (modules/linear.hpp): every layer's
  // projections and the LM head (the embedding is a lookup: it stays; a head
  // tied to it gets an int8 copy of the table).
  void quantize_weights() {
    detail::linear_weight_forms<LanguageModel>::quantize_weights();
    if (!head_)
      tied_int8_ = detail::int8_weights<Policy>("LanguageModel::quantize_weights", embed_.table().data(),
                                                config_.vocab_size, config_.d_model);
  }
  // What a decoded token's logits read where the head is tied to the
  // embedding: its int8 table once quantized, else the table; none untied.
  std::vector<std::span<const std::byte>> tied_head_reads() const {
    if (head_) return {};
    if (tied_int8_) return tied_int8_->regions();
    return {std::as_bytes(std::span(embed_.table().data(), static_cast<std::size_t>(embed_.table().size())))};
  }
  // The layers' weights also packed (modules/linear.hpp). Not the head's, the
  // largest weight: prefill asks it for one row a sequence, and a forward
  // over whole sequences (scoring) multiplies it as it lies.
  void add_packed_weights() { layers_.add_packed_weights(); }
  void require_trainable(std::string_view where) const {
    layers_.require_trainable(where);
    if (head_) head_->require_trainable(where);
    require(!tied_int8_, where, "weights", "float weights (a backward; int8 weights are for inference)",
            "int8 weights");
  }

 private:
  friend detail::linear_weight_forms<LanguageModel>;
  // Every layer's projection and the head (none when tied), for
  // linear_weight_forms: decoding panels beside them (a head tied to the
  // embedding reads the table as it is), and int8 weights.
  template <class Self, class F>
  static void visit_linears(Self& self, F& f) {
    self.layers_.for_each_linear(f);
    if (self.head_) f(*self.head_);
  }
  void check_tokens(std::string_view where, cview<token_t, 2> tokens, sequence_offsets sequences) const {
    require_nonempty(where, "tokens", tokens);
    if (!sequences.empty()) detail::check_sequence_offsets(where, "tokens", tokens, sequences);
  }
  // embedding -> layers(x, hidden) -> norm -> head, with this call's scratch only.
  template <class Layers>
  void infer(std::string_view where, cview<token_t, 2> tokens, TensorView<T, 3> logits, sequence_offsets sequences,
             Layers&& layers) const {
    check_tokens(where, tokens, sequences);
    require_shape(where, "logits", logits, output_shape(tokens.shape()));
    head_forward(final_states(tokens, layers).const_view(), logits);
  }
  // embedding -> layers(x, hidden) -> norm: the head's input [B, N, C].
  template <class Layers>
  Tensor<T, 3> final_states(cview<token_t, 2> tokens, Layers&& layers) const {
    const shape_t<3> shape = embed_.output_shape(tokens.shape());
    auto& memory = layers_.policy().memory();
    Tensor<T, 3> x(shape, memory), hidden(shape, memory);
    {
      typename Embedding<T, Policy>::saved_type embed_state;
      embed_.forward(tokens, x.view(), embed_state);
    }
    layers(x.const_view(), hidden.view());
    typename RMSNorm<T, Policy>::saved_type norm_state;
    norm_.forward(hidden.view(), x.view(), norm_state);
    return x;
  }

  // normed [B, N, C] -> logits [B, N, V], through lm_head or the embedding table.
  void head_forward(cview<T, 3> normed, TensorView<T, 3> logits) const {
    if (head_) {
      typename Linear<T, Policy>::saved_type unused;  // a Linear's backward needs only its input again
      return head_->forward(normed, logits, unused);
    }
    if constexpr (low_bit_policy<Policy>)
      if (tied_int8_) return linear_forward(policy(), flatten_rows(normed), *tied_int8_, flatten_rows(logits));
    linear_forward(policy(), flatten_rows(normed), embed_.table(), flatten_rows(logits));
  }
  // dlogits -> d_normed (assign); the head's (or the table's) gradient accumulates.
  void head_backward(cview<T, 3> normed, cview<T, 3> dlogits, TensorView<T, 3> d_normed) {
    if (head_) return head_->backward(normed, dlogits, {normed.shape()}, d_normed);
    linear_backward(policy(), flatten_rows(normed), embed_.table(), flatten_rows(dlogits), flatten_rows(d_normed),
                    embed_.table_grad());
  }

  static const LanguageModelConfig& checked(const LanguageModelConfig& config, const std::vector<Layer>& layers) {
    if constexpr (requires(const Layer& l) { l.d_model(); })
      for (std::size_t i = 0; i < layers.size(); ++i)
        require(layers[i].d_model() == config.d_model, "LanguageModel", "config.d_model",
                "the width of every layer (layer " + std::to_string(i) + ": " + std::to_string(layers[i].d_model()) +
                    ")",
                std::to_string(config.d_model));
    return config;
  }

  static const Policy& first_policy(const std::vector<Layer>& layers) {
    require(!layers.empty(), "LanguageModel", "layers", "at least one layer", "none");
    return layers.front().policy();
  }

  LanguageModelConfig config_;
  Embedding<T, Policy> embed_;
  Stack<Layer> layers_;
  RMSNorm<T, Policy> norm_;
  std::optional<Linear<T, Policy>> head_;  // none when tied to the embedding
  std::shared_ptr<const int8_rows<accum_t<T>>> tied_int8_;  // the tied head's int8 table, once quantized
};

}  // namespace difftx
