// Generation for several prompts at once (generate.hpp's engine, one prompt
// being a batch of one): the prompts in one packed prefill
// (modules/sequences.hpp), then decode steps of one token for every prompt
// still going, over one KV cache. A decode step reads every weight once
// whatever the batch, so B prompts cost about one prompt's weight reads per
// step. Each prompt has its own sampler (history and random stream), stop
// tokens and length; a prompt that has ended leaves the cache
// (KVCache::keep_sequences), so the steps after it compute only the others.
#pragma once

#include <algorithm>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "difftx/core/checks.hpp"
#include "difftx/core/tensor.hpp"
#include "difftx/generation/sampler.hpp"
#include "difftx/ops/common.hpp"
#include "difftx/ops/int8.hpp"

namespace difftx {

struct generation_options {
  index_t max_new_tokens = 16;
  std::vector<token_t> stop_tokens = {};  // end-of-sequence ids; empty: never stop early
  sampling_options sampling = {};
  inference_dtype kv_cache = inference_dtype::same;  // int8: keys and values stored in int8 (docs/semantics.md)
};

namespace detail {

// Every sequence of a model's cache but `kept` leaves it: a layer's KVCache, or a stack's one per layer.
template <class Cache>
void keep_sequences(Cache& cache, std::span<const index_t> kept) {
  if constexpr (requires { cache.keep_sequences(kept); })
    cache.keep_sequences(kept);
  else
    for (auto& layer : cache) keep_sequences(layer, kept);
}

// The prompts' new tokens, generated together. Checks everything before the
// model computes: names are "prompt", "max_new_tokens", ... for a single
// prompt, "prompts[i]", "options[i].max_new_tokens", ... for a batch.
// on_token(i, t): prompt i's new token t, as soon as it is chosen (each step
// in the prompts' order).
template <class Model, class OnToken>
std::vector<std::vector<token_t>> generate_batch(const Model& model, std::span<const std::span<const token_t>> prompts,
                                                 std::span<const generation_options> options, OnToken&& on_token) {
  using T = typename Model::value_type;
  constexpr std::string_view where = "generate";
  const index_t V = model.config().vocab_size;
  const bool single = prompts.size() == 1;
  const auto prompt_name = [&](std::size_t i) {
    return single ? std::string("prompt") : "prompts[" + std::to_string(i) + "]";
  };
  const auto option_name = [&](std::size_t i, const char* field) {
    return (single ? std::string() : "options[" + std::to_string(i) + "].") + field;
  };
  require(!prompts.empty(), where, "prompts", "at least one prompt", "none");
  require(options.size() == prompts.size(), where, "options", "one per prompt (" + std::to_string(prompts.size()) + ")",
          std::to_string(options.size()));
  const auto outside = [V](token_t t) { return t < 0 || t >= V; };
  std::vector<token_sampler> samplers;
  samplers.reserve(prompts.size());
  index_t capacity = 0;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const auto& prompt = prompts[i];
    const auto& o = options[i];
    require(!prompt.empty(), where, prompt_name(i), "at least one token", "none");
    if (const auto bad = std::ranges::find_if(prompt, outside); bad != prompt.end())
      require(false, where, prompt_name(i), "token ids in [0, " + std::to_string(V) + ")",
              std::to_string(*bad) + " at position " + std::to_string(bad - prompt.begin()));
    require(o.max_new_tokens >= 1, where, option_name(i, "max_new_tokens"), "at least 1",
            std::to_string(o.max_new_tokens));
    if (const auto bad = std::ranges::find_if(o.stop_tokens, outside); bad != o.stop_tokens.end())
      require(false, where, option_name(i, "stop_tokens"), "token ids in [0, " + std::to_string(V) + ")",
              std::to_string(*bad));
    require(o.kv_cache == options[0].kv_cache, where, option_name(i, "kv_cache"),
            "options[0]'s (one cache holds every prompt)", "another");
    samplers.emplace_back(o.sampling);
    samplers.back().start(prompt);
    // The last new token is never fed back: a prompt's cache holds one token fewer than its whole sequence.
    capacity = std::max(capacity, static_cast<index_t>(prompt.size()) + o.max_new_tokens - 1);
  }

  // The prompts in one packed row, each its own sequence (one prompt: a dense [1, N]).
  const auto B = static_cast<index_t>(prompts.size());
  std::vector<token_t> packed;
  std::vector<index_t> offsets{0};
  for (const auto& prompt : prompts) {
    packed.insert(packed.end(), prompt.begin(), prompt.end());
    offsets.push_back(static_cast<index_t>(packed.size()));
  }
  if (single) offsets.clear();
  auto& memory = model.policy().memory();
  const auto to_model = [&](const std::vector<token_t>& ids, shape_t<2> shape) {
    Tensor<token_t, 2> tokens(shape, memory);
    memory.upload(tokens.data(), ids.data(), ids.size() * sizeof(token_t));
    return tokens;
  };
  auto cache = model.make_cache(B, capacity, options[0].kv_cache);
  Tensor<T, 2> last({B, V}, memory);
  model.prefill(to_model(packed, {1, static_cast<index_t>(packed.size())}).const_view(), cache, last.view(), offsets);

  // active[r]: the prompt in row r of the cache and of each step's logits.
  std::vector<std::size_t> active(prompts.size());
  std::iota(active.begin(), active.end(), std::size_t{0});
  std::vector<std::vector<token_t>> out(prompts.size());
  std::vector<T> rows(static_cast<std::size_t>(B * V));
  std::vector<index_t> kept_rows;
  std::vector<std::size_t> going;
  const auto ended = [&](std::size_t i) {
    const auto& o = options[i];
    return static_cast<index_t>(out[i].size()) == o.max_new_tokens ||
           std::ranges::find(o.stop_tokens, out[i].back()) != o.stop_tokens.end();
  };
  // Each active prompt's token from its row of logits; the prompts that end leave the cache.
  const auto choose = [&](const T* logits) {
    memory.download(rows.data(), logits, active.size() * static_cast<std::size_t>(V) * sizeof(T));
    kept_rows.clear();
    going.clear();
    for (std::size_t r = 0; r < active.size(); ++r) {
      const std::size_t i = active[r];
      out[i].push_back(samplers[i].next(std::span<const T>(rows.data() + r * static_cast<std::size_t>(V), V)));
      on_token(i, out[i].back());
      if (!ended(i)) {
        kept_rows.push_back(static_cast<index_t>(r));
        going.push_back(i);
      }
    }
    if (!going.empty() && going.size() < active.size()) keep_sequences(cache, kept_rows);
    active.swap(going);
  };
  choose(last.data());
  Tensor<T, 3> logits({B, 1, V}, memory);
  std::vector<token_t> previous;
  while (!active.empty()) {
    const auto A = static_cast<index_t>(active.size());
    previous.clear();
    for (const std::size_t i : active) previous.push_back(out[i].back());
    model.decode(to_model(previous, {A, 1}).const_view(), cache,
                 TensorView<T, 3>(logits.data(), {A, 1, V}, logits.space()));
    choose(logits.data());
  }
  return out;
}

}  // namespace detail

}  // namespace difftx
