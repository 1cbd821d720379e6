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
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "difftx/core/checks.hpp"
#include "difftx/core/scalar_traits.hpp"
#include "difftx/generation/exp_nonpositive.hpp"
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
  // ("token_sampler", "logits", ...) for an empty row or a value that is not
  // finite. One pass compilers vectorize: a sum of x - x in lanes is NaN
  // after a non-finite x, and only then is the row read again for its first.
  template <class T>
  void assign(std::span<const T> logits) {
    require_row(logits);
    const std::size_t n = logits.size();
    scores_.resize(n);
    kept_.resize(n);
    std::array<double, lanes> check{};
    in_lanes(check, 0, n, [](double& c, double x) { c += x - x; },
             [&](std::size_t v) { return scores_[v] = scalar_traits<T>::to_double(logits[v]); });
    if (std::any_of(check.begin(), check.end(), [](double c) { return c != 0; }))
      for (std::size_t v = 0; v < n; ++v) finite_logit(logits, v);  // the first non-finite's error
    for (std::size_t v = 0; v < n; ++v) kept_[v] = static_cast<token_t>(v);
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
    constexpr std::size_t block = 256;
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
  // Every candidate is written and the end moves by keep(t), where a branch
  // on it would be mispredicted at each change between kept and dropped.
  template <class Keep>
  void keep_if(Keep&& keep) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < kept_.size(); ++i) {
      const token_t t = kept_[i];
      kept_[n] = t;
      n += keep(t) ? 1 : 0;
    }
    kept_.resize(n);
  }
  // The largest score of a candidate (there is always at least one), kept in lanes.
  double largest_score() const noexcept {
    std::array<double, lanes> lane;
    lane.fill(score(kept_.front()));
    const auto larger = [](double& l, double x) { l = std::max(l, x); };
    if (all_kept())
      in_lanes(lane, 0, scores_.size(), larger, [&](std::size_t t) { return scores_[t]; });
    else
      in_lanes(lane, 0, kept_.size(), larger, [&](std::size_t i) { return score(kept_[i]); });
    return *std::max_element(lane.begin(), lane.end());
  }
  // f(i, kept()[i]) for every i, in increasing id: a loop over the whole
  // row, which compilers vectorize, while every token is still a candidate.
  template <class F>
  void for_each_kept_index(F&& f) const {
    if (all_kept())
      for (std::size_t t = 0; t < scores_.size(); ++t) f(t, t);
    else
      for (std::size_t i = 0; i < kept_.size(); ++i) f(i, static_cast<std::size_t>(kept_[i]));
  }

  // The kept candidates' weights exp(score - largest) (exp_nonpositive.hpp),
  // in the order of kept(), summed block by block: the draw and top-p add
  // whole blocks until the one where their sum crosses what they look for.
  struct weighed {
    double largest;                       // the largest kept score (weight 1)
    std::span<const double> weights;      // weights[i]: kept()[i]'s
    std::span<const double> block_sums;   // block_sums[b]: weights[b·weight_block, (b + 1)·weight_block), in lanes
    double total;                         // block_sums added in order
  };
  static constexpr std::size_t weight_block = 128;
  weighed weigh() {
    const double largest = largest_score();
    const std::size_t n = kept_.size();
    weights_.resize(n);
    for_each_kept_index([&](std::size_t i, std::size_t t) { weights_[i] = exp_nonpositive(scores_[t] - largest); });
    block_sums_.resize((n + weight_block - 1) / weight_block);
    double total = 0;
    for (std::size_t b = 0; b < block_sums_.size(); ++b) {
      std::array<double, lanes> lane{};
      const std::size_t first = b * weight_block;
      in_lanes(lane, first, std::min(first + weight_block, n), [](double& l, double w) { l += w; },
               [&](std::size_t i) { return weights_[i]; });
      for (std::size_t width = lanes / 2; width > 0; width /= 2)
        for (std::size_t l = 0; l < width; ++l) lane[l] += lane[l + width];
      total += block_sums_[b] = lane[0];
    }
    return {largest, weights_, block_sums_, total};
  }
  // The kept candidate with the largest score, the smallest id of equal ones.
  token_t most_likely() const noexcept {
    token_t best = kept_.front();
    for (const token_t t : kept_)
      if (score(t) > score(best)) best = t;
    return best;
  }
  // Buffers a step may use for the length of its apply(), reused between
  // rows: candidates, and a small label (a band, a bucket) for each.
  std::vector<scored_token>& scratch() noexcept { return scratch_; }
  std::vector<std::uint16_t>& label_scratch() noexcept { return labels_; }

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

  static constexpr std::size_t lanes = 16;
  bool all_kept() const noexcept { return kept_.size() == scores_.size(); }
  // op(lane[(i - begin) % lanes], value(i)) for i in [begin, end), as a loop compilers vectorize.
  template <class Op, class Value>
  static void in_lanes(std::array<double, lanes>& lane, std::size_t begin, std::size_t end, Op op, Value value) {
    std::size_t i = begin;
    for (; i + lanes <= end; i += lanes)
      for (std::size_t l = 0; l < lanes; ++l) op(lane[l], value(i + l));
    for (std::size_t l = 0; i < end; ++i, ++l) op(lane[l], value(i));
  }

  std::vector<double> scores_;
  std::vector<token_t> kept_;
  std::vector<double> weights_, block_sums_;
  std::vector<scored_token> scratch_;
  std::vector<std::uint16_t> labels_;
};

// A step of a sampler chain. apply() must leave at least one candidate.
class sampling_step {
 public:
  virtual ~sampling_step() = default;
  virtual void apply(candidate_set& candidates, const token_history& history) const = 0;
};

}  // namespace difftx
