// The temperature and the truncations of a sampler chain
// (generation/sampling_step.hpp), as transformers' TemperatureLogitsWarper,
// TopKLogitsWarper, TopPLogitsWarper and MinPLogitsWarper compute them, without
// sorting the vocabulary: top-k keeps a heap of k scores, top-p sorts only the
// tokens of the band of probability where it ends, min-p compares with the largest.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>

#include "difftx/generation/sampling_step.hpp"

namespace difftx {

// Every candidate's score divided by the temperature (> 0).
class temperature_step final : public sampling_step {
 public:
  explicit temperature_step(double temperature) : temperature_(temperature) {}
  void apply(candidate_set& c, const token_history&) const override {
    auto scores = c.scores();
    c.for_each_kept_index([&](std::size_t, std::size_t t) { scores[t] /= temperature_; });
  }

 private:
  double temperature_;
};

// The candidates whose score is at least the k-th largest (ties at the k-th place all stay).
class top_k_step final : public sampling_step {
 public:
  explicit top_k_step(index_t k) : k_(k) {}
  void apply(candidate_set& c, const token_history&) const override {
    const auto k = static_cast<std::size_t>(k_);
    if (k_ <= 0 || k >= c.kept().size()) return;
    // The k largest scores so far, smallest on top: most scores fail the first comparison.
    auto& heap = c.scratch();
    heap.clear();
    const auto greater = [](const scored_token& a, const scored_token& b) { return a.score > b.score; };
    for (const token_t t : c.kept()) {
      const double s = c.score(t);
      if (heap.size() < k) {
        heap.push_back({t, s, 0.0});
        std::push_heap(heap.begin(), heap.end(), greater);
      } else if (s > heap.front().score) {
        std::pop_heap(heap.begin(), heap.end(), greater);
        heap.back() = {t, s, 0.0};
        std::push_heap(heap.begin(), heap.end(), greater);
      }
    }
    const double kth = heap.front().score;
    c.keep_if([&](token_t t) { return c.score(t) >= kth; });
  }

 private:
  index_t k_;
};

// transformers' nucleus rule: in decreasing probability (of equal ones the
// smaller id first), a candidate stays while the probability of the
// candidates before it is < p; the most likely always stays.
class top_p_step final : public sampling_step {
 public:
  explicit top_p_step(double p) : p_(p) {}
  void apply(candidate_set& c, const token_history&) const override {
    if (p_ >= 1.0 || c.kept().size() == 1) return;
    // The weights (candidate_set::weigh) summed per band of score below the
    // largest: every band above the one where the bands' mass reaches p stays
    // whole, so only the tokens about that band are sorted, to find where
    // the rule ends among them.
    const auto w = c.weigh();
    const auto band_of = [largest = w.largest](double s) {
      return static_cast<std::size_t>(std::min(double(bands - 1), (largest - s) * bands_per_unit));
    };
    // Each candidate's band, in a loop compilers vectorize; then the bands'
    // sums, interleaved over four copies so that a run of candidates in one
    // band does not wait on each other's adds.
    const auto kept = c.kept();
    auto& band_of_kept = c.label_scratch();
    band_of_kept.resize(kept.size());
    const auto scores = c.scores();
    c.for_each_kept_index(
        [&](std::size_t i, std::size_t t) { band_of_kept[i] = static_cast<std::uint16_t>(band_of(scores[t])); });
    std::array<std::array<double, bands>, 4> copies{};
    for (std::size_t i = 0; i < kept.size(); ++i) copies[i % 4][band_of_kept[i]] += w.weights[i];
    std::array<double, bands> mass;
    for (std::size_t b = 0; b < bands; ++b) mass[b] = (copies[0][b] + copies[1][b]) + (copies[2][b] + copies[3][b]);
    std::size_t band = 0;
    for (double above = mass[0]; above < p_ * w.total && band + 1 < bands;) above += mass[++band];
    // A band either side: the bands' sums round otherwise than the sorted sum.
    const std::size_t first = band > 0 ? band - 1 : 0, last = std::min(band + 1, bands - 1);
    double before = 0;
    for (std::size_t b = 0; b < first; ++b) before += mass[b];
    auto boundary = ends_in(c, w, first, last, before);
    if (!boundary) boundary = ends_in(c, w, 0, bands - 1, 0.0);
    c.keep_if([&](token_t t) {
      const double s = c.score(t);
      // The comparisons as integers: no branch per candidate, and no warning
      // for bitwise operators on bool.
      return (int{s > boundary->score} | (int{s == boundary->score} & int{t <= boundary->token})) != 0;
    });
  }

 private:
  static constexpr std::size_t bands = 1024;
  static constexpr double bands_per_unit = 16;

  // The last candidate the rule keeps, sorting (decreasing score, then
  // increasing id) only the candidates of bands first..last, above which
  // weight `before` lies; none where the rule does not end among them (then
  // all bands are asked: it ends there).
  // Each candidate's band is in c.label_scratch().
  std::optional<scored_token> ends_in(candidate_set& c, const candidate_set::weighed& w, std::size_t first,
                                      std::size_t last, double before) const {
    auto& sorted = c.scratch();
    sorted.clear();
    const auto kept = c.kept();
    const std::span<const std::uint16_t> band_of_kept = c.label_scratch();
    const auto scores = std::as_const(c).scores();
    const std::size_t width = last - first;
    for (std::size_t i = 0; i < kept.size(); ++i)
      if (std::size_t(band_of_kept[i]) - first <= width)
        sorted.push_back({kept[i], scores[static_cast<std::size_t>(kept[i])], w.weights[i]});
    std::ranges::sort(sorted, [](const scored_token& a, const scored_token& b) {
      return a.score > b.score || (a.score == b.score && a.token < b.token);
    });
    if (sorted.empty() || (first > 0 && before / w.total >= p_)) return std::nullopt;
    for (std::size_t n = 0; n < sorted.size(); ++n) {
      before += sorted[n].weight;
      if (before / w.total >= p_) return sorted[n];
    }
    return last + 1 == bands ? std::optional<scored_token>(sorted.back()) : std::nullopt;
  }

  double p_;
};

// The candidates at least min_p times as likely as the most likely one:
// exp(score - largest) >= min_p.
class min_p_step final : public sampling_step {
 public:
  explicit min_p_step(double min_p) : min_p_(min_p) {}
  void apply(candidate_set& c, const token_history&) const override {
    if (min_p_ <= 0) return;
    const double largest = c.largest_score();
    // Scores below this are surely under min_p (exp is within an ulp): no exp for them.
    const double surely_below = largest + std::log(min_p_) - 1e-6;
    c.keep_if([&](token_t t) {
      const double s = c.score(t);
      return s >= surely_below && std::exp(s - largest) >= min_p_;
    });
  }

 private:
  double min_p_;
};

}  // namespace difftx
