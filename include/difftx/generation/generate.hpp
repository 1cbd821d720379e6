// Text generation with a LanguageModel (modules/language_model.hpp) and its KV
// cache: the prompt in one prefill that computes the head at its last token
// only, then one decode step per new token, each chosen by token_sampler
// (sampler.hpp). Generation stops after max_new_tokens, or after a stop token
// (end of sequence), which is returned as the last token, as transformers'
// generate does. Several prompts generate together (batch_generator.hpp),
// each as it would alone.
//
//   auto settings = difftx::io::read_generation_settings(folder);   // io/generation_settings.hpp
//   difftx::generation_options o{.max_new_tokens = 32, .stop_tokens = settings.eos_token_ids,
//                                .sampling = settings.sampling(/*seed=*/1)};
//   auto tokens = difftx::generate(model, prompt, o, [](difftx::token_t t) { /* stream it */ });
//   auto each = difftx::generate(model, prompts, o);   // std::vector<std::vector<token_t>> prompts
#pragma once

#include <span>
#include <utility>
#include <vector>

#include "difftx/generation/batch_generator.hpp"

namespace difftx {

namespace detail {
struct ignore_token {
  void operator()(token_t) const noexcept {}
};
struct ignore_prompt_token {
  void operator()(std::size_t, token_t) const noexcept {}
};
}  // namespace detail

// prompt (ids in [0, V)) -> the new tokens; on_token(t) is called with each as
// soon as it is chosen. Works on every policy: token ids go to the model's
// memory and each row of logits comes back to the host for the sampler.
template <class Model, class OnToken = detail::ignore_token>
std::vector<token_t> generate(const Model& model, std::span<const token_t> prompt, const generation_options& o,
                              OnToken&& on_token = {}) {
  const std::span<const token_t> prompts[] = {prompt};
  auto out = detail::generate_batch(model, std::span(prompts), std::span(&o, 1),
                                    [&](std::size_t, token_t t) { on_token(t); });
  return std::move(out.front());
}

// Each prompt's new tokens, the prompts decoded together: the same tokens as
// generate(model, prompts[i], options[i]) one at a time (the same greedy
// tokens, the same draws for the same seeds), where the model computes a row
// alike in any batch. options: one per prompt; every kv_cache alike.
// on_token(i, t): prompt i's new token t, as soon as it is chosen.
template <class Model, class OnToken = detail::ignore_prompt_token>
std::vector<std::vector<token_t>> generate(const Model& model, std::span<const std::vector<token_t>> prompts,
                                           std::span<const generation_options> options, OnToken&& on_token = {}) {
  const std::vector<std::span<const token_t>> views(prompts.begin(), prompts.end());
  return detail::generate_batch(model, std::span(views), options, on_token);
}

// The same options for every prompt (each prompt's sampler starts from the same seed).
template <class Model, class OnToken = detail::ignore_prompt_token>
std::vector<std::vector<token_t>> generate(const Model& model, std::span<const std::vector<token_t>> prompts,
                                           const generation_options& o, OnToken&& on_token = {}) {
  const std::vector<generation_options> each(prompts.size(), o);
  return generate(model, prompts, std::span<const generation_options>(each), on_token);
}

}  // namespace difftx
