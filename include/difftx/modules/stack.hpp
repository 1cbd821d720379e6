// Stack<Module>: layers applied one after another, x -> layer 0 -> ... -> out,
// each [B, N, C] -> [B, N, C]. Parameters are named "layers.<i>.<layer name>".
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "difftx/core/checks.hpp"
#include "difftx/modules/parameter.hpp"

namespace difftx {

template <class Module>
class Stack {
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

  // x [B, N, C] -> out [B, N, C]
  void forward(cview<T, 3> x, TensorView<T, 3> out, saved_type& s) const {
    require_shape("Stack::forward", "out", out, output_shape(x.shape()));
    s.layers.resize(layers_.size());
    s.inputs.resize(layers_.size() - 1);
    auto& memory = layers_.front().policy().memory();
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const bool last = i + 1 == layers_.size();
      if (!last) s.inputs[i].resize(layers_[i].output_shape(x.shape()), memory);
      layers_[i].forward(i == 0 ? x : s.inputs[i - 1].const_view(), last ? out : s.inputs[i].view(), s.layers[i]);
    }
    s.input_shape = x.shape();
  }

  // dout [B, N, C] -> dx [B, N, C] (assign); every layer's gradients accumulate
  void backward(cview<T, 3> x, cview<T, 3> dout, const saved_type& s, TensorView<T, 3> dx) {
    constexpr std::string_view where = "Stack::backward";
    require_saved(where, s.input_shape, x.shape());
    require_shape(where, "dout", dout, output_shape(x.shape()));
    require_shape(where, "dx", dx, x.shape());
    auto& memory = layers_.front().policy().memory();
    Tensor<T, 3> grad(dout.shape(), memory), next(dout.shape(), memory);
    for (std::size_t i = layers_.size(); i-- > 0;) {
      const bool last = i + 1 == layers_.size();
      layers_[i].backward(i == 0 ? x : s.inputs[i - 1].const_view(), last ? dout : grad.const_view(), s.layers[i],
                          i == 0 ? dx : next.view());
      grad.swap(next);
    }
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

 private:
  std::vector<Module> layers_;
};

}  // namespace difftx
