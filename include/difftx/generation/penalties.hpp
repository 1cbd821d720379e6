// The penalties of a sampler chain (generation/sampling_step.hpp), applied to
// the raw logits before the temperature, as transformers and OpenAI define
// them. Tokens of the history outside the row's vocabulary are ignored, as
// transformers ignores them.
#pragma once

#include "difftx/generation/sampling_step.hpp"

namespace difftx {

// transformers' RepetitionPenaltyLogitsProcessor: every token of the prompt
// or generated so far, once however often it came: x / penalty if x > 0,
// else x · penalty (a penalty > 1 makes it less likely either way).
class repetition_penalty_step final : public sampling_step {
 public:
  explicit repetition_penalty_step(double penalty) : penalty_(penalty) {}
  void apply(candidate_set& c, const token_history& history) const override {
    auto scores = c.scores();
    for (const token_t t : history.seen())
      if (t >= 0 && t < c.vocab_size()) {
        double& x = scores[static_cast<std::size_t>(t)];
        x = x < 0 ? x * penalty_ : x / penalty_;
      }
  }

 private:
  double penalty_;
};

// OpenAI's presence and frequency penalties, by the formula of its API
// reference: a token generated c > 0 times so far (the prompt's do not count)
// gets x - c · frequency - presence.
class presence_frequency_penalty_step final : public sampling_step {
 public:
  presence_frequency_penalty_step(double presence, double frequency) : presence_(presence), frequency_(frequency) {}
  void apply(candidate_set& c, const token_history& history) const override {
    auto scores = c.scores();
    for (const auto& [t, count] : history.generated_counts())
      if (t >= 0 && t < c.vocab_size()) {
        double& x = scores[static_cast<std::size_t>(t)];
        x = x - static_cast<double>(count) * frequency_ - presence_;
      }
  }

 private:
  double presence_, frequency_;
};

}  // namespace difftx
