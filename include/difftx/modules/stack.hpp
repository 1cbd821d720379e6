// Stack<Module>: layers applied one after another, x -> layer 0 -> ... -> out,
// each [B, N, C] -> [B, N, C]. Parameters are named "layers.<i>.<layer name>".
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "difftx/core/checks.hpp"
#include "difftx/modules/architecture.hpp"
#include "difftx/modules/kv_cache.hpp"
#include "difftx/modules/linear_weight_forms.hpp"
#include "difftx/modules/parameter.hpp"
#include "difftx/modules/sequences.hpp"
#include "difftx/ops/decode_step.hpp"

namespace difftx {

template <class Module>
class Stack : public detail::linear_weight_forms<Stack<Module>> {
 public:
  using value_type = typename Module::value_type;
  using policy_type = typename Module::policy_type;
  using T = value_type;
  struct saved_type {
    shape_t<3> input_shape{};
    std::vector<typename Module::saved_type> layers;
    std::vector<Tensor<T, 3>> inputs;  // the input of layers 1..L-1 (layer 0's is x)

    template <class F>
    void for_each_intermediate(const std::string& prefix, F&& f) const {
      for (std::size_t i = 0; i < layers.size(); ++i) {
        const std::string layer = prefix + "layers." + std::to_string(i);
        if (i > 0 && i - 1 < inputs.size()) f(layer + ".input", "the layer's input", inputs[i - 1]);
        layers[i].for_each_intermediate(layer + ".", f);
      }
    }
  };

  explicit Stack(std::vector<Module> layers) : layers_(std::move(layers)) {
    require(!layers_.empty(), "Stack", "layers", "at least one layer", "none");
  }

  std::size_t size() const noexcept { return layers_.size(); }
  Module& operator[](std::size_t i) noexcept { return layers_[i]; }
  const Module& operator[](std::size_t i) const noexcept { return layers_[i]; }
  shape_t<3> output_shape(const shape_t<3>& input) const { return layers_.back().output_shape(input); }

  // x [B, N, C] -> out [B, N, C]; or a packed batch [1, total, C] with its cu_seqlens.
  void forward(cview<T, 3> x, TensorView<T, 3> out, saved_type& s, sequence_offsets sequences = {}) const {
    require_shape("Stack::forward", "out", out, output_shape(x.shape()));
    s.layers.resize(layers_.size());
    s.inputs.resize(layers_.size() - 1);
    auto& memory = layers_.front().policy().memory();
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const bool last = i + 1 == layers_.size();
      if (!last) s.inputs[i].resize(layers_[i].output_shape(x.shape()), memory);
      layers_[i].forward(i == 0 ? x : s.inputs[i - 1].const_view(), last ? out : s.inputs[i].view(), s.layers[i],
                         sequences);
    }
    s.input_shape = x.shape();
  }

  // Inference, keeping no state: one layer's scratch at a time.
  void forward(cview<T, 3> x, TensorView<T, 3> out, sequence_offsets sequences = {}) const {
    chain("Stack::forward", x, out, [&](std::size_t i, cview<T, 3> in, TensorView<T, 3> y) {
      layers_[i].forward(in, y, sequences);
    });
  }
  // With KV caches, one per layer (modules/kv_cache.hpp).
  using cache_type = std::vector<typename Module::cache_type>;
  cache_type make_cache(index_t batch, index_t capacity, inference_dtype storage = inference_dtype::same) const {
    cache_type caches;
    for (const auto& layer : layers_) caches.push_back(layer.make_cache(batch, capacity, storage));
    return caches;
  }
  // Prompts x [B, N, C] (or packed with cu_seqlens) -> out; every layer's cache restarts with them.
  void prefill(cview<T, 3> x, cache_type& cache, TensorView<T, 3> out, sequence_offsets sequences = {}) const {
    constexpr std::string_view where = "Stack::prefill";
    require_caches(where, cache);
    for (std::size_t i = 0; i < layers_.size(); ++i)
      detail::check_prefill(where, cache[i], layers_[i].cache_shape(0, 0), x, sequences, policy().memory().space());
    chain("Stack::prefill", x, out, [&](std::size_t i, cview<T, 3> in, TensorView<T, 3> y) {
      layers_[i].prefill(in, cache[i], y, sequences);
    });
  }
  // New tokens x [B, T, C] -> out [B, T, C]; they join every layer's cache.
  void decode(cview<T, 3> x, cache_type& cache, TensorView<T, 3> out) const {
    constexpr std::string_view where = "Stack::decode";
    require_caches(where, cache);
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      cache[i].require_layout(where, layers_[i].cache_shape(x.extent(0), 0), x.extent(0), policy().memory().space());
      cache[i].require_decodable(where, x.extent(1));
    }
    run_decode_step(policy(), x.extent(0) * x.extent(1), [&] {
      chain("Stack::decode", x, out, [&](std::size_t i, cview<T, 3> in, TensorView<T, 3> y) {
        layers_[i].decode(in, cache[i], y);
      });
    });
  }

  // dout [B, N, C] -> dx [B, N, C] (assign); every layer's gradients accumulate
  void backward(cview<T, 3> x, cview<T, 3> dout, const saved_type& s, TensorView<T, 3> dx) {
    constexpr std::string_view where = "Stack::backward";
    require_saved(where, s.input_shape, x.shape());
    require_shape(where, "dout", dout, output_shape(x.shape()));
    require_shape(where, "dx", dx, x.shape());
    require_trainable(where);
    auto& memory = layers_.front().policy().memory();
    Tensor<T, 3> grad(dout.shape(), memory), next(dout.shape(), memory);
    for (std::size_t i = layers_.size(); i-- > 0;) {
      const bool last = i + 1 == layers_.size();
      layers_[i].backward(i == 0 ? x : s.inputs[i - 1].const_view(), last ? dout : grad.const_view(), s.layers[i],
                          i == 0 ? dx : next.view());
      grad.swap(next);
    }
  }

  // Throws input_error where a layer computes for inference only (low-bit paths).
  void require_trainable(std::string_view where) const {
    for (const auto& layer : layers_) detail::require_trainable(layer, where);
  }

  std::vector<parameter_ref<T>> parameters(const std::string& prefix = "") {
    std::vector<parameter_ref<T>> all;
    for (std::size_t i = 0; i < layers_.size(); ++i)
      append_parameters(all, layers_[i].parameters(prefix + "layers." + std::to_string(i) + "."));
    return all;
  }
  void reset_parameters(random_stream& rng) {
    for (auto& layer : layers_) layer.reset_parameters(rng);
  }
  const policy_type& policy() const noexcept { return layers_.front().policy(); }
  // modules/architecture.hpp: the layer count and each layer's constants.
  void describe_architecture(architecture& a, const std::string& prefix) const {
    a[prefix + "layers"] = architecture_value(static_cast<index_t>(layers_.size()));
    for (std::size_t i = 0; i < layers_.size(); ++i)
      a.merge(describe(layers_[i], prefix + "layers." + std::to_string(i) + "."));
  }

 private:
  friend detail::linear_weight_forms<Stack>;
  // Every layer's projections, for linear_weight_forms (int8 weights, panels, packed copies).
  template <class Self, class F>
  static void visit_linears(Self& self, F& f) {
    for (auto& layer : self.layers_) layer.for_each_linear(f);
  }
  // x -> step(0) -> ... -> step(L - 1) -> out, through two scratch buffers.
  template <class Step>
  void chain(std::string_view where, cview<T, 3> x, TensorView<T, 3> out, Step&& step) const {
    require_shape(where, "out", out, output_shape(x.shape()));
    auto& memory = layers_.front().policy().memory();
    Tensor<T, 3> a, b;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const bool last = i + 1 == layers_.size();
      if (!last) b.resize(layers_[i].output_shape(x.shape()), memory);
      step(i, i == 0 ? x : a.const_view(), last ? out : b.view());
      a.swap(b);
    }
  }
  void require_caches(std::string_view where, const cache_type& cache) const {
    require(cache.size() == layers_.size(), where, "cache",
            [&] { return "one cache per layer (" + std::to_string(layers_.size()) + ")"; },
            [&] { return std::to_string(cache.size()) + " caches"; });
  }

  std::vector<Module> layers_;
};

}  // namespace difftx
