// Embedding<T, Policy>: token ids [B, N] -> vectors [B, N, C], a lookup in a
// learnable table (nn.Embedding). Parameter: "weight" [V, C].
#pragma once

#include <string>
#include <vector>

#include "difftx/core/checks.hpp"
#include "difftx/modules/parameter.hpp"
#include "difftx/ops/embedding.hpp"
#include "difftx/policy/reference.hpp"

namespace difftx {

template <Scalar T, class Policy = policy::reference>
  requires supported_by<Policy, T>
class Embedding {
 public:
  using value_type = T;
  using policy_type = Policy;
  // The token ids are all the backward needs, and the caller passes them again.
  struct saved_type {
    shape_t<2> input_shape{};
  };

  Embedding(index_t vocab_size, index_t dim, Policy policy = {})
      : policy_(std::move(policy)), vocab_(vocab_size), dim_(dim), weight_(checked_shape(vocab_, dim_), policy_.memory()) {
    random_stream rng(0);
    reset_parameters(rng);
  }

  index_t vocab_size() const noexcept { return vocab_; }
  index_t dim() const noexcept { return dim_; }
  shape_t<3> output_shape(const shape_t<2>& tokens) const noexcept { return {tokens[0], tokens[1], dim_}; }

  // tokens [B, N] (each in [0, V)) -> y [B, N, C]
  void forward(cview<token_t, 2> tokens, TensorView<T, 3> y, saved_type& saved) const {
    constexpr std::string_view where = "Embedding::forward";
    require_nonempty(where, "tokens", tokens);
    require_space(where, "tokens", tokens, policy_.memory().space());
    require_shape(where, "y", y, output_shape(tokens.shape()));
    embedding_forward(policy_, flat(tokens), weight_.value.view(), flatten_rows(y));
    saved.input_shape = tokens.shape();
  }

  // dy [B, N, C] -> weight.grad += scatter-add of dy's rows at the token ids (no dx: ids are discrete)
  void backward(cview<token_t, 2> tokens, cview<T, 3> dy, const saved_type& saved) {
    constexpr std::string_view where = "Embedding::backward";
    require_nonempty(where, "tokens", tokens);
    require_saved(where, saved.input_shape, tokens.shape(), "tokens");
    require_shape(where, "dy", dy, output_shape(tokens.shape()));
    embedding_backward(policy_, flat(tokens), flatten_rows(dy), weight_.grad.view());
  }

  std::vector<parameter_ref<T>> parameters(const std::string& prefix = "") { return {weight_.ref(prefix + "weight")}; }
  // The table [V, C] and its gradient, for an output head tied to it (LanguageModel).
  cview<T, 2> table() const noexcept { return weight_.value.view(); }
  TensorView<T, 2> table_grad() noexcept { return weight_.grad.view(); }

  // nn.Embedding's default: N(0, 1).
  void reset_parameters(random_stream& rng) { weight_.init_normal(rng, 1.0); }

  const Policy& policy() const noexcept { return policy_; }

 private:
  static shape_t<2> checked_shape(index_t vocab, index_t dim) {
    require(vocab > 0, "Embedding", "vocab_size", "a positive size", std::to_string(vocab));
    require(dim > 0, "Embedding", "dim", "a positive size", std::to_string(dim));
    return {vocab, dim};
  }
  static cview<token_t, 1> flat(const cview<token_t, 2>& tokens) { return tokens.template reshape<1>({tokens.size()}); }

  Policy policy_;
  index_t vocab_, dim_;
  Parameter<T, 2> weight_;
};

}  // namespace difftx
