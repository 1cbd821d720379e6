// What a step of a sampler chain (generation/sampler.hpp) works on, and the
// interface every step implements. A step sees the candidates of one row of
// logits (every token's score, as the steps before left it, and the tokens
// still in the running) and the history of the sequence (its prompt, and the
// tokens generated so far); it changes scores (a penalty, the temperature) or
// drops candidates (top-k, top-p, min-p). Steps hold no state of their own,
// so one step object serves any number of samplers.
//
// The buffers here are sized once per sampler and reused at every row: a step
// costs the passes over the candidates it makes, with no allocation of the
// vocabulary's size.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "difftx/core/checks.hpp"
#include "difftx/core/scalar_traits.hpp"
#include "difftx/ops/common.hpp"

namespace difftx {

// The tokens of one sequence so far: its prompt and the tokens generated
// after it, as penalties read them.
class token_history {
 public:
  // A new sequence: history = the prompt, nothing generated.
  void start(std::span<const token_t> prompt) {
    seen_.clear();
    seen_set_.clear();
    generated_.clear();
    for (const token_t t : prompt) see(t);
  }
  // t was generated (chosen) next.
  void add(token_t t) {
    see(t);
    ++generated_[t];
  }
  // Every token of the prompt and of the generated ones, each once, in the order they first came.
  std::span<const token_t> seen() const noexcept { return seen_; }
  // How often each generated token was generated (the prompt's do not count).
  const std::unordered_map<token_t, index_t>& generated_counts() const noexcept { return generated_; }

 private:
  void see(token_t t) {
    if (seen_set_.insert(t).second) seen_.push_back(t);
  }
  std::vector<token_t> seen_;
  std::unordered_set<token_t> seen_set_;
  std::unordered_map<token_t, index_t> generated_;
};

// A token with its score and, where a step computed it, its weight exp(score - largest kept score).
struct scored_token {
  token_t token;
  double score;
  double weight;
};

// One row's candidates: scores()[t] is token t's score (its logit in double,
// then as the steps changed it); kept() the tokens still candidates, always in
// increasing id.
class candidate_set {
 public:
  // Every token of the row a candidate, scored by its logit; input_error
  // ("token_sampler", "logits", ...) for an empty row or a value that is not finite.
  template <class T>
  void assign(std::span<const T> logits) {
    require_row(logits);
    scores_.resize(logits.size());
    kept_.resize(logits.size());
    for (std::size_t v = 0; v < logits.size(); ++v) {
      scores_[v] = finite_logit(logits, v);
      kept_[v] = static_cast<token_t>(v);
    }
  }
  // The most likely token of the row (the smallest id of equal logits), read
  // once and checked as assign checks it, keeping no candidates: greedy
  // decoding with no step, where copying a large vocabulary's row cost a
  // decode step a few percent. Block by block: a block's largest logit is
  // kept in lanes (a loop compilers vectorize, where a running index and a
  // check per logit took 1% of a 375M int8 decode step), the first block
  // holding the row's largest wins, and that block is read again for its
  // first index.
  template <class T>
  static token_t most_likely_of(std::span<const T> logits) {
    require_row(logits);
    constexpr std::size_t block = 256, lanes = 16;
    double largest = -std::numeric_limits<double>::infinity();
    std::size_t best_block = 0;
    for (std::size_t b0 = 0; b0 < logits.size(); b0 += block) {
      const std::size_t width = std::min(block, logits.size() - b0);
      std::array<double, lanes> lane_largest, lane_check{};  // lane_check: a sum of x - x, NaN after a non-finite x
      lane_largest.fill(-std::numeric_limits<double>::infinity());
      const auto take = [&](std::size_t l, std::size_t v) {
        const double x = scalar_traits<T>::to_double(logits[v]);
        lane_check[l] += x - x;
        lane_largest[l] = x > lane_largest[l] ? x : lane_largest[l];
      };
      const std::size_t whole = width / lanes * lanes;
      for (std::size_t i = 0; i < whole; i += lanes)
        for (std::size_t l = 0; l < lanes; ++l) take(l, b0 + i + l);
      for (std::size_t l = 0; l < width - whole; ++l) take(l, b0 + whole + l);
      if (std::any_of(lane_check.begin(), lane_check.end(), [](double c) { return c != 0; }))
        for (std::size_t v = b0; v < b0 + width; ++v) finite_logit(logits, v);  // the first non-finite's error
      if (const double in_block = *std::max_element(lane_largest.begin(), lane_largest.end()); in_block > largest) {
        largest = in_block;
        best_block = b0;
      }
    }
    std::size_t best = best_block;
    while (scalar_traits<T>::to_double(logits[best]) != largest) ++best;
    return static_cast<token_t>(best);
  }

  index_t vocab_size() const noexcept { return static_cast<index_t>(scores_.size()); }
  std::span<double> scores() noexcept { return scores_; }
  std::span<const double> scores() const noexcept { return scores_; }
  double score(token_t t) const noexcept { return scores_[static_cast<std::size_t>(t)]; }
  std::span<const token_t> kept() const noexcept { return kept_; }

  // Drops every candidate t for which keep(t) is false; the order stays.
  template <class Keep>
  void keep_if(Keep&& keep) {
    std::erase_if(kept_, [&](token_t t) { return !keep(t); });
  }
  // The largest score of a candidate (there is always at least one).
  double largest_score() const noexcept {
    double largest = score(kept_.front());
    for (const token_t t : kept_) largest = std::max(largest, score(t));
    return largest;
  }
  // The kept candidate with the largest score, the smallest id of equal ones.
  token_t most_likely() const noexcept {
    token_t best = kept_.front();
    for (const token_t t : kept_)
      if (score(t) > score(best)) best = t;
    return best;
  }
  // A buffer a step may use for the length of its apply(), reused between rows.
  std::vector<scored_token>& scratch() noexcept { return scratch_; }

 private:
  template <class T>
  static void require_row(std::span<const T> logits) {
    require(!logits.empty(), "token_sampler", "logits", "a row of at least one logit", "an empty row");
  }
  template <class T>
  static double finite_logit(std::span<const T> logits, std::size_t v) {
    const double x = scalar_traits<T>::to_double(logits[v]);
    require(std::isfinite(x), "token_sampler", "logits", "finite values",
            [&] { return std::to_string(x) + " for token " + std::to_string(v); });
    return x;
  }

  std::vector<double> scores_;
  std::vector<token_t> kept_;
  std::vector<scored_token> scratch_;
};

// A step of a sampler chain. apply() must leave at least one candidate.
class sampling_step {
 public:
  virtual ~sampling_step() = default;
  virtual void apply(candidate_set& candidates, const token_history& history) const = 0;
};

}  // namespace difftx
