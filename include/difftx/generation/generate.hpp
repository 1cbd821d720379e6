// Text generation with a LanguageModel (modules/language_model.hpp) and its KV
// cache: the prompt in one prefill that computes the head at its last token
// only, then one decode step per new token, each chosen by token_sampler.
// Generation stops after max_new_tokens, or after a stop token (end of
// sequence), which is returned as the last token, as transformers' generate does.
//
//   difftx::generation_options o{.max_new_tokens = 32, .stop_tokens = {eos},
//                                .sampling = {.temperature = 0.7, .top_p = 0.9, .seed = 1}};
//   auto tokens = difftx::generate(model, prompt, o, [](difftx::token_t t) { /* stream it */ });
#pragma once

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "difftx/core/checks.hpp"
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
struct ignore_token {
  void operator()(token_t) const noexcept {}
};
}  // namespace detail

// prompt (ids in [0, V)) -> the new tokens; on_token(t) is called with each as
// soon as it is chosen. Works on every policy: token ids go to the model's
// memory and each row of logits comes back to the host for the sampler.
template <class Model, class OnToken = detail::ignore_token>
std::vector<token_t> generate(const Model& model, std::span<const token_t> prompt, const generation_options& o,
                              OnToken&& on_token = {}) {
  using T = typename Model::value_type;
  constexpr std::string_view where = "generate";
  const index_t V = model.config().vocab_size;
  require(!prompt.empty(), where, "prompt", "at least one token", "none");
  require(o.max_new_tokens >= 1, where, "max_new_tokens", "at least 1", std::to_string(o.max_new_tokens));
  const auto outside = [V](token_t t) { return t < 0 || t >= V; };
  if (const auto bad = std::ranges::find_if(prompt, outside); bad != prompt.end())
    require(false, where, "prompt", "token ids in [0, " + std::to_string(V) + ")",
            std::to_string(*bad) + " at position " + std::to_string(bad - prompt.begin()));
  if (const auto bad = std::ranges::find_if(o.stop_tokens, outside); bad != o.stop_tokens.end())
    require(false, where, "stop_tokens", "token ids in [0, " + std::to_string(V) + ")", std::to_string(*bad));
  token_sampler sampler(o.sampling);

  auto& memory = model.policy().memory();
  const auto to_model = [&](std::span<const token_t> ids) {
    Tensor<token_t, 2> tokens({1, static_cast<index_t>(ids.size())}, memory);
    memory.upload(tokens.data(), ids.data(), ids.size_bytes());
    return tokens;
  };
  std::vector<T> row(static_cast<std::size_t>(V));
  const auto choose = [&](const T* logits) {
    memory.download(row.data(), logits, row.size() * sizeof(T));
    return sampler.next(std::span<const T>(row));
  };
  const auto stops = [&](token_t t) { return std::ranges::find(o.stop_tokens, t) != o.stop_tokens.end(); };

  // The last new token is never fed back, so the cache holds one token fewer than the whole sequence.
  const auto prompt_tokens = static_cast<index_t>(prompt.size());
  auto cache = model.make_cache(1, prompt_tokens + o.max_new_tokens - 1, o.kv_cache);
  Tensor<T, 2> last({1, V}, memory);
  model.prefill(to_model(prompt).const_view(), cache, last.view());
  std::vector<token_t> out{choose(last.data())};
  on_token(out.back());
  Tensor<T, 3> logits({1, 1, V}, memory);
  while (static_cast<index_t>(out.size()) < o.max_new_tokens && !stops(out.back())) {
    const token_t previous = out.back();
    model.decode(to_model(std::span(&previous, 1)).const_view(), cache, logits.view());
    out.push_back(choose(logits.data()));
    on_token(out.back());
  }
  return out;
}

}  // namespace difftx
