// The next token from a row of logits, through a chain of steps
// (generation/sampling_step.hpp): penalties (penalties.hpp), then the
// temperature and truncations (truncations.hpp), then greedy (the most
// likely candidate) or a seeded draw. token_sampler(options) builds the chain
// transformers' generate applies, in its order (docs/semantics.md,
// "Generation"); token_sampler(steps, seed) runs a chain of your own.
// Everything runs in double on the host from the row's values, with weights
// exp_nonpositive gives the same bits on every CPU and difftx's
// portable random stream, so a seed gives the same tokens wherever the
// logits are the same.
//
//   difftx::token_sampler sampler({.temperature = 0.7, .top_p = 0.9, .repetition_penalty = 1.1, .seed = 1});
//   sampler.start(prompt);                          // the history the penalties read
//   difftx::token_t t = sampler.next(std::span<const float>(row));  // chosen, and added to the history
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "difftx/core/random.hpp"
#include "difftx/generation/penalties.hpp"
#include "difftx/generation/sampling_options.hpp"
#include "difftx/generation/sampling_step.hpp"
#include "difftx/generation/truncations.hpp"

namespace difftx {

// One candidate of a sampling step: a token and its probability after the chain.
struct token_probability {
  token_t token;
  double probability;
};

class token_sampler {
 public:
  using step_list = std::vector<std::shared_ptr<const sampling_step>>;

  // transformers' chain for these options: the repetition penalty, OpenAI's
  // presence and frequency penalties, then greedy (temperature 0), or the
  // temperature, top-k, top-p and min-p and a draw from options.seed. A step
  // whose option is neutral is left out. input_error("token_sampler",
  // "<field>", ...) for an option out of its range.
  explicit token_sampler(const sampling_options& o)
      : options_(detail::checked_sampling(o)), steps_(steps_of(options_)), draws_(o.temperature > 0), rng_(o.seed) {}

  // A chain of your own: the steps in this order, then the most likely
  // candidate, or with a seed a draw among the candidates.
  token_sampler(step_list steps, std::optional<std::uint64_t> draw_seed)
      : steps_(std::move(steps)), draws_(draw_seed.has_value()), rng_(draw_seed.value_or(0)) {
    for (std::size_t i = 0; i < steps_.size(); ++i)
      require(steps_[i] != nullptr, "token_sampler", "steps[" + std::to_string(i) + "]", "a step", "null");
    options_.seed = draw_seed.value_or(0);
    options_.temperature = draws_ ? 1.0 : 0.0;
  }

  // The options the chain was made from (a chain of your own: temperature 1 if it draws, else 0, and its seed).
  const sampling_options& options() const noexcept { return options_; }
  bool greedy() const noexcept { return !draws_; }
  const token_history& history() const noexcept { return history_; }

  // A new sequence: the history (what the penalties read) becomes the prompt.
  void start(std::span<const token_t> prompt) { history_.start(prompt); }
  // t follows in the history; next() calls it with the token it chooses.
  void accept(token_t t) { history_.add(t); }

  // The next token after the chain: the most likely candidate when greedy,
  // else one draw; it joins the history.
  template <class T>
  token_t next(std::span<const T> logits) {
    const token_t t = [&] {
      if (!draws_ && steps_.empty()) return candidate_set::most_likely_of(logits);
      run_chain(logits);
      return draws_ ? draw() : candidates_.most_likely();
    }();
    accept(t);
    return t;
  }

  // The tokens the next draw chooses among, in increasing id, with
  // probabilities summing to 1 (greedy: the most likely alone). The history is not changed.
  template <class T>
  std::vector<token_probability> distribution(std::span<const T> logits) {
    run_chain(logits);
    if (!draws_) return {{candidates_.most_likely(), 1.0}};
    const auto w = candidates_.weigh();
    const auto kept = candidates_.kept();
    std::vector<token_probability> out;
    for (std::size_t i = 0; i < kept.size(); ++i) out.push_back({kept[i], w.weights[i] / w.total});
    return out;
  }

 private:
  static step_list steps_of(const sampling_options& o) {
    step_list steps;
    if (o.repetition_penalty != 1.0) steps.push_back(std::make_shared<repetition_penalty_step>(o.repetition_penalty));
    if (o.presence_penalty != 0.0 || o.frequency_penalty != 0.0)
      steps.push_back(std::make_shared<presence_frequency_penalty_step>(o.presence_penalty, o.frequency_penalty));
    if (o.temperature == 0.0) return steps;  // greedy: transformers' warpers apply to sampling only
    if (o.temperature != 1.0) steps.push_back(std::make_shared<temperature_step>(o.temperature));
    if (o.top_k > 0) steps.push_back(std::make_shared<top_k_step>(o.top_k));
    if (o.top_p < 1.0) steps.push_back(std::make_shared<top_p_step>(o.top_p));
    if (o.min_p > 0.0) steps.push_back(std::make_shared<min_p_step>(o.min_p));
    return steps;
  }

  template <class T>
  void run_chain(std::span<const T> logits) {
    candidates_.assign(logits);
    for (const auto& step : steps_) step->apply(candidates_, history_);
  }

  // u uniform in [0, 1) from the stream; the first candidate (in increasing
  // id) whose cumulative weight exceeds u times the total, the cumulative
  // weight added block by block (candidate_set::weigh): the blocks' sums up
  // to the block where it crosses, then that block's weights one by one.
  // Where rounding leaves the one-by-one sum short of the block's, the
  // block's last candidate of non-zero weight.
  token_t draw() {
    const auto w = candidates_.weigh();
    const auto kept = candidates_.kept();
    const double u = rng_.uniform() * w.total;
    double cumulative = 0;
    std::size_t b = 0;
    // The last block with weight: the largest candidate's weight is 1.
    std::size_t last = w.block_sums.size() - 1;
    while (w.block_sums[last] == 0) --last;
    while (b < last && !(u < cumulative + w.block_sums[b])) cumulative += w.block_sums[b++];
    const std::size_t first = b * candidate_set::weight_block, end = std::min(first + candidate_set::weight_block, kept.size());
    std::size_t chosen = first;
    for (std::size_t i = first; i < end; ++i)
      if (w.weights[i] > 0) {
        chosen = i;
        cumulative += w.weights[i];
        if (u < cumulative) break;
      }
    return kept[chosen];
  }

  sampling_options options_;
  step_list steps_;
  bool draws_;
  random_stream rng_;
  token_history history_;
  candidate_set candidates_;
};

}  // namespace difftx
