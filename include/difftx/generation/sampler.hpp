// The next token from a row of logits: greedy, or drawn after temperature,
// top-k and top-p (nucleus) truncation, applied in that order as transformers'
// generate applies them (docs/semantics.md, "Generation"). Everything runs in
// double on the host from the row's values with difftx's portable random
// stream, so a seed gives the same tokens wherever the logits are the same.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "difftx/core/checks.hpp"
#include "difftx/core/random.hpp"
#include "difftx/ops/common.hpp"

namespace difftx {

struct sampling_options {
  double temperature = 0.0;  // 0: greedy, the largest logit (the first of equal ones)
  index_t top_k = 0;         // keep the k largest logits (and any equal to the k-th); 0: no limit
  double top_p = 1.0;        // keep the most likely tokens until their probability passes p; 1: no limit
  std::uint64_t seed = 0;
};

// One candidate of a sampling step: a token and its probability after truncation.
struct token_probability {
  token_t token;
  double probability;
};

class token_sampler {
 public:
  explicit token_sampler(const sampling_options& o) : options_(checked(o)), rng_(o.seed) {}

  const sampling_options& options() const noexcept { return options_; }
  bool greedy() const noexcept { return options_.temperature == 0.0; }

  // The tokens a draw chooses among, in increasing id, with probabilities summing to 1.
  template <class T>
  std::vector<token_probability> distribution(std::span<const T> logits) const {
    const auto z = scaled(logits);
    std::vector<token_t> kept(z.size());
    std::iota(kept.begin(), kept.end(), token_t{0});
    if (options_.top_k > 0 && options_.top_k < static_cast<index_t>(z.size())) keep_top_k(z, kept);
    if (options_.top_p < 1.0) keep_top_p(z, kept);
    std::ranges::sort(kept);
    double largest = z[index(kept.front())];
    for (const token_t t : kept) largest = std::max(largest, z[index(t)]);
    std::vector<token_probability> out;
    out.reserve(kept.size());
    double total = 0;
    for (const token_t t : kept) {
      out.push_back({t, std::exp(z[index(t)] - largest)});
      total += out.back().probability;
    }
    for (auto& c : out) c.probability /= total;
    return out;
  }

  // The next token: the argmax when greedy, else one draw from distribution().
  template <class T>
  token_t next(std::span<const T> logits) {
    if (greedy()) return argmax(logits);
    const auto candidates = distribution(logits);
    const double u = rng_.uniform();
    double cumulative = 0;
    for (const auto& c : candidates) {
      cumulative += c.probability;
      if (u < cumulative) return c.token;
    }
    return candidates.back().token;  // u within rounding of 1
  }

 private:
  static std::size_t index(token_t t) { return static_cast<std::size_t>(t); }

  static const sampling_options& checked(const sampling_options& o) {
    constexpr std::string_view where = "token_sampler";
    require(o.temperature >= 0 && std::isfinite(o.temperature), where, "temperature",
            "a finite temperature >= 0 (0: greedy)", std::to_string(o.temperature));
    require(o.top_k >= 0, where, "top_k", "a count >= 0 (0: no limit)", std::to_string(o.top_k));
    require(o.top_p > 0 && o.top_p <= 1, where, "top_p", "a probability in (0, 1] (1: no limit)",
            std::to_string(o.top_p));
    return o;
  }

  template <class T>
  static double finite_logit(std::span<const T> logits, std::size_t v) {
    const double x = scalar_traits<T>::to_double(logits[v]);
    require(std::isfinite(x), "token_sampler", "logits", "finite values",
            [&] { return std::to_string(x) + " for token " + std::to_string(v); });
    return x;
  }

  template <class T>
  static token_t argmax(std::span<const T> logits) {
    require(!logits.empty(), "token_sampler", "logits", "a row of at least one logit", "an empty row");
    std::size_t best = 0;
    double best_value = finite_logit(logits, 0);
    for (std::size_t v = 1; v < logits.size(); ++v)
      if (const double x = finite_logit(logits, v); x > best_value) {
        best = v;
        best_value = x;
      }
    return static_cast<token_t>(best);
  }

  template <class T>
  std::vector<double> scaled(std::span<const T> logits) const {
    require(!logits.empty(), "token_sampler", "logits", "a row of at least one logit", "an empty row");
    std::vector<double> z(logits.size());
    for (std::size_t v = 0; v < z.size(); ++v) z[v] = finite_logit(logits, v) / options_.temperature;
    return z;
  }

  // Every token whose scaled logit is at least the k-th largest.
  void keep_top_k(const std::vector<double>& z, std::vector<token_t>& kept) const {
    std::vector<double> values;
    values.reserve(kept.size());
    for (const token_t t : kept) values.push_back(z[index(t)]);
    const auto k = static_cast<std::ptrdiff_t>(options_.top_k);
    std::nth_element(values.begin(), values.begin() + (k - 1), values.end(), std::greater<>());
    const double kth = values[static_cast<std::size_t>(k - 1)];
    std::erase_if(kept, [&](token_t t) { return z[index(t)] < kth; });
  }

  // transformers' rule: in increasing probability, drop each token while the
  // probability of it and all below it is at most 1 - p; the most likely stays.
  void keep_top_p(const std::vector<double>& z, std::vector<token_t>& kept) const {
    // Increasing logit; of equal ones the larger id first, so the smaller id is dropped last.
    std::ranges::sort(kept, [&](token_t a, token_t b) {
      return z[index(a)] < z[index(b)] || (z[index(a)] == z[index(b)] && a > b);
    });
    const double largest = z[index(kept.back())];
    std::vector<double> weights(kept.size());
    double total = 0;
    for (std::size_t i = 0; i < kept.size(); ++i) total += weights[i] = std::exp(z[index(kept[i])] - largest);
    double below = 0;
    std::size_t dropped = 0;
    while (dropped + 1 < kept.size() && (below + weights[dropped]) / total <= 1.0 - options_.top_p)
      below += weights[dropped++];
    kept.erase(kept.begin(), kept.begin() + static_cast<std::ptrdiff_t>(dropped));
  }

  sampling_options options_;
  random_stream rng_;
};

}  // namespace difftx
