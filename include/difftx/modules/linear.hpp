// Linear<T, Policy>: y = x W^T with W [out, in] (nn.Linear without bias), the
// projection every other module is built from. Parameter: "weight".
// quantize_weights() (inference, low-bit CPU policies): W also as int8 with a
// step per output channel (ops/int8.hpp), and forward computes with it
// (ops/linear.hpp). The float weight stays what parameters() and files see; a
// new value written there needs quantize_weights() again.
// add_decoding_panels() (inference, host policies): W also as decoding panels
// (ops/decoding_panels.hpp) where a decoding product would hold more than
// wide_weight_row_bytes of x beside each row of W; forward reads them for x
// of at most 4 rows. Decoding reads each row of W against the whole x: once a
// row and x no longer fit in L1 side by side, every row reads x again from L2
// and W streams below the machine's read rate; the panels stream W once with
// y in L1 instead (float32's down_proj of a 1B model is such a product, and
// bfloat16's where the product widens x to float; the rates measured then
// are in docs/benchmarks.md's git history). They cost W's bytes once more; as with
// int8, W stays what parameters() and files see (and what a prompt
// multiplies), a new value there needs add_decoding_panels() again, and
// backward refuses.
// add_packed_weights() (inference; policy::simd with oneDNN): W (or its int8
// rows) also in the layout oneDNN's matmul reads, for the products of more
// rows than decoding's that it takes (a prompt). Without it oneDNN copies W
// into that layout on every such product, which costs most where the product
// has few rows (docs/design.md, "oneDNN's matmul", has the figures). It costs
// the bytes of what it packs once more; as with the panels, a new value in W
// needs add_packed_weights() again, and backward refuses.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "difftx/core/checks.hpp"
#include "difftx/modules/parameter.hpp"
#include "difftx/ops/int8.hpp"
#include "difftx/ops/linear.hpp"
#include "difftx/ops/logit_quantization.hpp"
#include "difftx/policy/reference.hpp"

namespace difftx {

// A decoding product holding more of x than this beside each row of W (x's
// in_features values as the product holds them: Linear::decoding_input_bytes)
// reads decoding panels once add_decoding_panels made them: half of a 32 KiB
// L1, the smallest of the CPUs we run on.
inline constexpr std::size_t wide_weight_row_bytes = 16 * 1024;

namespace detail {

// W [out, in] (row-major at w) as int8 with a step per output channel (ops/int8.hpp), for
// Linear and for a LanguageModel's head tied to its embedding table.
template <class Policy, class T>
std::shared_ptr<const int8_rows<accum_t<T>>> int8_weights(std::string_view where, const T* w, index_t out, index_t in) {
  using A = accum_t<T>;
  require(low_bit_policy<Policy>, where, "policy", "a policy with int8 weights (reference, simd)",
          std::string("policy::") + Policy::name);
  require_int8_arithmetic<A>(where, "T");
  require(in <= int8_max_depth, where, "in_features", "at most " + std::to_string(int8_max_depth) + " (exact int32 sums)",
          std::to_string(in));
  if constexpr (low_bit_policy<Policy> && std::is_floating_point_v<A>) {
    auto quantized = std::make_shared<int8_rows<A>>(out, in);
    std::vector<A> row(static_cast<std::size_t>(in));
    for (index_t n = 0; n < out; ++n) {
      for (index_t k = 0; k < in; ++k) row[static_cast<std::size_t>(k)] = load(w[n * in + k]);
      require(std::all_of(row.begin(), row.end(), [](A v) { return std::isfinite(v); }), where, "weight",
              "finite values", "a NaN or infinity in output channel " + std::to_string(n));
      quantized->set_row(n, row.data());
    }
    return quantized;
  }
  return nullptr;
}

// The type of a policy's packed weights (policy::simd::packed_weights), void
// for a policy without them.
template <class Policy>
struct packed_weights_of {
  using type = void;
};
template <class Policy>
  requires requires { typename Policy::packed_weights; }
struct packed_weights_of<Policy> {
  using type = typename Policy::packed_weights;
};

}  // namespace detail

template <Scalar T, class Policy = policy::reference>
  requires supported_by<Policy, T>
class Linear {

 public:
  using value_type = T;
  using policy_type = Policy;
  // x is all the backward needs, and the caller passes it again.
  struct saved_type {
    shape_t<3> input_shape{};
  };

  Linear(index_t in_features, index_t out_features, Policy policy = {})
      : policy_(std::move(policy)), in_(in_features), out_(out_features), weight_(checked_shape(in_, out_), policy_.memory()) {}

  index_t in_features() const noexcept { return in_; }
  index_t out_features() const noexcept { return out_; }
  shape_t<3> output_shape(const shape_t<3>& input) const noexcept { return {input[0], input[1], out_}; }

  // x [B, N, in] -> y [B, N, out]
  void forward(cview<T, 3> x, TensorView<T, 3> y, saved_type& saved) const {
    constexpr std::string_view where = "Linear::forward";
    require_tokens(where, "x", x, in_, policy_.memory().space());
    require_shape(where, "y", y, output_shape(x.shape()));
    [&] {
      if constexpr (low_bit_policy<Policy>)
        if (int8_) {
          if constexpr (packs_int8)
            if (packed_) return linear_forward(policy_, flatten_rows(x), *int8_, *packed_, flatten_rows(y));
          return linear_forward(policy_, flatten_rows(x), *int8_, flatten_rows(y));
        }
      if constexpr (panelled)
        if (panels_ && x.extent(0) * x.extent(1) <= decoding_panels<T>::max_rows)
          return linear_forward(policy_, flatten_rows(x), *panels_, flatten_rows(y));
      if constexpr (packs)
        if (packed_) return linear_forward(policy_, flatten_rows(x), weight_.value.view(), *packed_, flatten_rows(y));
      linear_forward(policy_, flatten_rows(x), weight_.value.view(), flatten_rows(y));
    }();
    saved.input_shape = x.shape();
  }

  // One Linear of forward_together: its output and saved state.
  struct call {
    const Linear& linear;
    TensorView<T, 3> y;
    saved_type& saved;
  };
  // Projections of one x (q, k and v; gate and up), each as forward gives it.
  // Decoding's few rows are one product over all their weights
  // (ops/linear.hpp's linear_part; policy::simd runs it as one parallel
  // region) where every one reads W, or every one int8 rows; otherwise
  // (prompts, decoding panels, mixed forms) one forward each.
  static void forward_together(cview<T, 3> x, std::initializer_list<call> calls) {
    constexpr std::string_view where = "Linear::forward";
    for (const auto& c : calls) {
      require_tokens(where, "x", x, c.linear.in_, c.linear.policy_.memory().space());
      require_shape(where, "y", c.y, c.linear.output_shape(x.shape()));
    }
    const index_t rows = x.extent(0) * x.extent(1);
    const bool together = calls.size() > 1 && rows <= decoding_panels<T>::max_rows;
    const auto all = [&](auto&& form) {
      return std::all_of(calls.begin(), calls.end(), [&](const call& c) { return form(c.linear); });
    };
    const auto reads_w = [](const Linear& l) {
      if constexpr (panelled)
        if (l.panels_) return false;
      return !l.int8_;
    };
    const auto reads_int8 = [](const Linear& l) { return low_bit_policy<Policy> && l.int8_; };
    const Policy& policy = calls.begin()->linear.policy_;
    if (together && all(reads_w)) {
      std::vector<cview<T, 2>> w;
      std::vector<linear_part<cview<T, 2>, T>> parts;
      w.reserve(calls.size());  // parts point into it
      for (const auto& c : calls) parts.push_back({&w.emplace_back(c.linear.weight_.value.const_view()), flatten_rows(c.y)});
      linear_forward(policy, flatten_rows(x), std::span<const linear_part<cview<T, 2>, T>>(parts));
    } else if (together && all(reads_int8)) {
      if constexpr (low_bit_policy<Policy>) {
        std::vector<linear_part<int8_rows<accum_t<T>>, T>> parts;
        for (const auto& c : calls) parts.push_back({c.linear.int8_.get(), flatten_rows(c.y)});
        linear_forward(policy, flatten_rows(x), std::span<const linear_part<int8_rows<accum_t<T>>, T>>(parts));
      }
    } else {
      for (const auto& c : calls) c.linear.forward(x, c.y, c.saved);
      return;
    }
    for (const auto& c : calls) c.saved.input_shape = x.shape();
  }

  // dy [B, N, out] -> dx [B, N, in] (assign, or add with write_mode::add); dW += dy^T x
  void backward(cview<T, 3> x, cview<T, 3> dy, const saved_type& saved, TensorView<T, 3> dx,
                write_mode dx_mode = write_mode::assign) {
    constexpr std::string_view where = "Linear::backward";
    require_tokens(where, "x", x, in_, policy_.memory().space());
    require_saved(where, saved.input_shape, x.shape());
    require_shape(where, "dy", dy, output_shape(x.shape()));
    require_shape(where, "dx", dx, x.shape());
    require_trainable(where);
    linear_backward(policy_, flatten_rows(x), weight_.value.view(), flatten_rows(dy), flatten_rows(dx), weight_.grad.view(), dx_mode);
  }

  std::vector<parameter_ref<T>> parameters(const std::string& prefix = "") { return {weight_.ref(prefix + "weight")}; }

  // nn.Linear's default: U(-1/sqrt(in), 1/sqrt(in)).
  void reset_parameters(random_stream& rng) { weight_.init_uniform(rng, 1.0 / std::sqrt(static_cast<double>(in_))); }

  const Policy& policy() const noexcept { return policy_; }

  // The weight as int8 from now on (see above); idempotent. The float weight
  // must be finite and in <= 133144 (exact int32 sums).
  // Weights asked to be packed are packed again, from the int8 rows.
  void quantize_weights() {
    int8_ = detail::int8_weights<Policy>("Linear::quantize_weights", weight_.value.data(), out_, in_);
    if (packing_asked_) add_packed_weights();
  }
  bool weights_quantized() const noexcept { return int8_ != nullptr; }
  // The int8 weights' bytes (values, steps, sums); 0 when not quantized.
  std::size_t int8_bytes() const noexcept { return int8_ ? int8_->bytes() : 0; }
  // W as parameters() names it.
  const T* weight_data() const noexcept { return weight_.value.data(); }
  // The memory a decoding product (at most 4 rows of x) reads for W: the int8
  // rows where quantized, else the decoding panels where there are some, else
  // W; decoding's read bound (`difftx bench --model`) streams the same bytes.
  std::vector<std::span<const std::byte>> decode_reads() const {
    if (int8_) return int8_->regions();
    const auto bytes = [](const T* p, index_t n) { return std::as_bytes(std::span(p, static_cast<std::size_t>(n))); };
    if (panels_) return {bytes(panels_->values.data(), panels_->values.size())};
    return {bytes(weight_.value.data(), weight_.value.size())};
  }
  // f(const Linear&): this one; the composite modules pass it every Linear they hold.
  template <class F>
  void for_each_linear(F&& f) const {
    f(*this);
  }
  // Decoding panels beside W when x is wide (see above); idempotent, and a
  // no-op for narrow x, user number types and policies without them.
  void add_decoding_panels() {
    if constexpr (panelled)
      if (decoding_input_bytes() > wide_weight_row_bytes)
        panels_ = std::make_shared<const decoding_panels<T>>(weight_.value.data(), out_, in_);
  }
  // The weights (int8 ones where quantized, then or later) also packed for
  // the policy's matrix library (see above); none for policies, number types
  // and settings (matmuls = difftx) whose products of many rows never read them.
  void add_packed_weights() {
    packing_asked_ = true;
    packed_ = nullptr;
    if (int8_) {
      if constexpr (packs_int8) packed_ = pack_weights(policy_, *int8_);
    } else if constexpr (packs) {
      packed_ = pack_weights(policy_, weight_.value.const_view());
    }
  }
  // The packed copy's bytes; 0 without one.
  std::size_t packed_bytes() const noexcept {
    if constexpr (packs || packs_int8) return packed_ ? packed_->bytes() : 0;
    return 0;
  }
  // Throws input_error once the weights are int8 or have decoding panels
  // (inference only: no gradient of the rounding; the panels would not follow an update).
  void require_trainable(std::string_view where) const {
    require(!int8_, where, "weights", "float weights (a backward; int8 weights are for inference)", "int8 weights");
    require(!panels_, where, "weights", "W alone (a backward; decoding panels are for inference)",
            "W and its decoding panels");
    require(!packed_, where, "weights", "W alone (a backward; packed weights are for inference)",
            "W and its packed copy");
  }

 private:
  // The bytes of x a decoding product holds beside each row of W: the
  // policy's figure where it has one (policy::simd widens float16 and
  // bfloat16 to float unless bfloat16 runs on the dot-product instruction).
  std::size_t decoding_input_bytes() const noexcept {
    if constexpr (requires { policy_.template decoding_input_bytes<T>(std::size_t{}); })
      return policy_.template decoding_input_bytes<T>(static_cast<std::size_t>(in_));
    else
      return static_cast<std::size_t>(in_) * sizeof(accum_t<T>);
  }
  static shape_t<2> checked_shape(index_t in, index_t out) {
    require(in > 0, "Linear", "in_features", "a positive size", std::to_string(in));
    require(out > 0, "Linear", "out_features", "a positive size", std::to_string(out));
    return {out, in};
  }

  // Panels for the number types they are built for (float, double and the
  // reduced types computed in float), on policies with their product.
  static constexpr bool panelled =
      std::is_floating_point_v<accum_t<T>> && requires(const Policy& p, cview<T, 2> a, TensorView<T, 2> b) {
        linear_forward(p, a, decoding_panels<T>{}, b);
      };

  // Packed weights for float weights and for int8 rows, on policies that make them.
  static constexpr bool packs = requires(const Policy& p, cview<T, 2> w) { pack_weights(p, w); };
  static constexpr bool packs_int8 =
      low_bit_policy<Policy> && requires(const Policy& p, const int8_rows<accum_t<T>>& w) { pack_weights(p, w); };

  Policy policy_;
  index_t in_, out_;
  Parameter<T, 2> weight_;
  // Shared, so copies of a quantized module (a layer vector growing) do not
  // copy it; quantize_weights replaces it rather than writing into it. The
  // same for the panels.
  std::shared_ptr<const int8_rows<accum_t<T>>> int8_;
  std::shared_ptr<const decoding_panels<T>> panels_;
  std::shared_ptr<const typename detail::packed_weights_of<Policy>::type> packed_;
  bool packing_asked_ = false;
};

// Every Linear of a module (projections, SwiGLU, the LM head) with int8
// weights from now on: model.quantize_weights().
template <class Module>
void quantize(Module& model) {
  model.quantize_weights();
}

}  // namespace difftx
