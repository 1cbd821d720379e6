// What token_sampler (generation/sampler.hpp) does with each row of logits:
// the penalties, then greedy or a seeded draw after temperature, top-k, top-p
// and min-p, in the order transformers' generate applies them
// (docs/semantics.md, "Generation"). Every field's neutral value leaves its
// step out.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "difftx/core/checks.hpp"
#include "difftx/ops/common.hpp"

namespace difftx {

struct sampling_options {
  double temperature = 0.0;  // 0: greedy, the largest logit (the first of equal ones)
  index_t top_k = 0;         // keep the k largest logits (and any equal to the k-th); 0: no limit
  double top_p = 1.0;        // keep the most likely tokens until their probability reaches p; 1: no limit
  double min_p = 0.0;        // keep the tokens at least min_p times as likely as the most likely; 0: no limit
  // transformers' repetition penalty on every token of the prompt and of the
  // tokens generated so far: a logit x becomes x / r if x > 0, else x · r; 1: none.
  double repetition_penalty = 1.0;
  // OpenAI's penalties on the tokens generated so far: a token generated c > 0
  // times has its logit lowered by presence_penalty + c · frequency_penalty; 0: none.
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  std::uint64_t seed = 0;  // the draws' random stream (core/random.hpp)
};

namespace detail {

// o, or input_error(where, "<field>", ...) naming the first field out of its range.
inline const sampling_options& checked_sampling(const sampling_options& o, std::string_view where = "token_sampler") {
  require(o.temperature >= 0 && std::isfinite(o.temperature), where, "temperature",
          "a finite temperature >= 0 (0: greedy)", std::to_string(o.temperature));
  require(o.top_k >= 0, where, "top_k", "a count >= 0 (0: no limit)", std::to_string(o.top_k));
  require(o.top_p > 0 && o.top_p <= 1, where, "top_p", "a probability in (0, 1] (1: no limit)",
          std::to_string(o.top_p));
  require(o.min_p >= 0 && o.min_p <= 1, where, "min_p", "a fraction in [0, 1] (0: no limit)", std::to_string(o.min_p));
  require(o.repetition_penalty > 0 && std::isfinite(o.repetition_penalty), where, "repetition_penalty",
          "a finite penalty > 0 (1: none)", std::to_string(o.repetition_penalty));
  require(std::isfinite(o.presence_penalty), where, "presence_penalty", "a finite number (0: none)",
          std::to_string(o.presence_penalty));
  require(std::isfinite(o.frequency_penalty), where, "frequency_penalty", "a finite number (0: none)",
          std::to_string(o.frequency_penalty));
  return o;
}

}  // namespace detail

}  // namespace difftx
