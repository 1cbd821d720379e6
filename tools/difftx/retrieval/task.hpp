// The multi-needle retrieval task, after the paper's Section 3.4 protocol on a
// synthetic vocabulary. One sequence of `context` tokens:
//
//   BOS | haystack: filler tokens with N needles "NEEDLE key v_1..v_L" | R queries "QUERY key v_1..v_L"
//
// Keys are distinct within a sequence; each query asks for one needle's key and
// the model must emit that needle's value tokens after it. The loss and the
// accuracy count only those answer tokens: the target at position p is the token
// at p + 1 where p is a query key (the answer-producing position) or a value
// token before the last; every other target is -1 (ignored).
//
// Placement: generate() draws every needle uniformly among non-overlapping
// places in the haystack. With depths given, query r's needle starts at
// round(depth_r · (H − ℓ)) in the haystack (H its length, ℓ = 2 + L the needle's),
// and the distractors take uniform free places.
// Everything comes from a seeded difftx::random_stream, so a seed gives the same
// sequences on every platform.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <difftx/core/checks.hpp>
#include <difftx/core/random.hpp>
#include <difftx/core/tensor.hpp>
#include <difftx/ops/common.hpp>

namespace difftx::retrieval {

// The defaults are sized so that retrieval (not only copying some value from
// the context) can be learned in 2000 steps of 16 sequences on the reference
// policy: with 16 keys neither model bound keys to values in that budget, with
// 8 it depended on the seed, with 6 DIFF did on seeds 1 and 2 (docs/guide/training.md).
struct task_config {
  index_t context = 48;      // tokens per sequence (48 holds 6 needles and 2 queries with room to move)
  index_t keys = 6;          // distinct key tokens (the fewest that 6 needles need)
  index_t values = 16;       // distinct value tokens (chance: 1/16)
  index_t filler = 8;        // distinct haystack filler tokens
  index_t value_length = 1;  // tokens per value (L)
};

// The paper's needle depths, as fractions of the haystack.
inline constexpr double depths[] = {0.0, 0.25, 0.5, 0.75, 1.0};
inline constexpr index_t depth_count = 5;
// The (N, R) pairs the task is trained and evaluated on: N in {1, 2, 4, 6}, R in {1, 2}, R <= N.
struct needles_queries {
  index_t needles, queries;
};
inline constexpr needles_queries task_mix[] = {{1, 1}, {2, 1}, {2, 2}, {4, 1}, {4, 2}, {6, 1}, {6, 2}};

// Token ids: 3 specials, then filler, keys, values.
struct vocabulary {
  static constexpr token_t bos = 0, needle = 1, query = 2;
  token_t filler_begin, key_begin, value_begin;
  index_t size;
  explicit vocabulary(const task_config& c)
      : filler_begin(3),
        key_begin(static_cast<token_t>(3 + c.filler)),
        value_begin(static_cast<token_t>(3 + c.filler + c.keys)),
        size(3 + c.filler + c.keys + c.values) {}
};

struct needle_info {
  token_t key;
  std::vector<token_t> value;
  index_t start;  // position of its NEEDLE token in the sequence
  index_t length() const { return 2 + static_cast<index_t>(value.size()); }
};

struct query_info {
  index_t needle;           // which needle it asks for (index into example::needles)
  index_t answer_position;  // the query's key: the position whose logits give value[0]
  index_t depth = -1;       // index into depths[] when placed at one, else -1
};

struct example {
  std::vector<token_t> tokens, targets;  // [context]; targets -1 where nothing is scored
  std::vector<needle_info> needles;
  std::vector<query_info> queries;
};

inline index_t needle_length(const task_config& c) { return 2 + c.value_length; }
inline index_t haystack_length(const task_config& c, index_t queries) {
  return c.context - 1 - queries * needle_length(c);
}

// Throws input_error unless the configuration can hold N needles and R queries.
inline void check_task(const task_config& c, index_t needles, index_t queries) {
  constexpr std::string_view where = "retrieval task";
  require(c.keys >= 1 && c.values >= 1 && c.filler >= 1 && c.value_length >= 1, where, "vocabulary",
          "at least one key, value and filler token and value_length >= 1",
          std::to_string(c.keys) + " keys, " + std::to_string(c.values) + " values, " + std::to_string(c.filler) +
              " filler, value_length " + std::to_string(c.value_length));
  require(needles >= 1 && needles <= c.keys, where, "needles", "1 <= N <= keys = " + std::to_string(c.keys),
          std::to_string(needles));
  require(queries >= 1 && queries <= needles, where, "queries", "1 <= R <= N = " + std::to_string(needles),
          std::to_string(queries));
  // Room for the queried needles at five distinct depths (offsets (H - l)/4 >= l
  // apart), and for every needle placed one after another at random free
  // offsets: N placed needles cut the haystack into at most N + 1 gaps, each
  // wasting fewer than l tokens, so N·l + (N + 1)(l - 1) always fits.
  const index_t H = haystack_length(c, queries), l = needle_length(c);
  const index_t need = std::max(5 * l, needles * l + (needles + 1) * (l - 1));
  require(H >= need, where, "context",
          "room for " + std::to_string(needles) + " needles of " + std::to_string(l) + " tokens at any depth, after BOS and " +
              std::to_string(queries) + " queries: context >= " + std::to_string(1 + queries * l + need),
          std::to_string(c.context));
}

// One sequence with N needles and R queries. placed_depths: empty (every needle
// uniform), or R indices into depths[] for the queried needles.
inline example generate(const task_config& c, random_stream& rng, index_t needles, index_t queries,
                        std::span<const index_t> placed_depths = {}) {
  check_task(c, needles, queries);
  require(placed_depths.empty() || static_cast<index_t>(placed_depths.size()) == queries, "retrieval task", "depths",
          "none or one per query", std::to_string(placed_depths.size()));
  const vocabulary vocab(c);
  auto draw = [&](index_t n) { return std::min<index_t>(n - 1, static_cast<index_t>(rng.uniform() * static_cast<double>(n))); };
  const index_t H = haystack_length(c, queries), l = needle_length(c);

  example ex;
  ex.tokens.assign(static_cast<std::size_t>(c.context), 0);
  ex.targets.assign(static_cast<std::size_t>(c.context), -1);
  ex.tokens[0] = vocabulary::bos;
  for (index_t p = 1; p <= H; ++p) ex.tokens[static_cast<std::size_t>(p)] = static_cast<token_t>(vocab.filler_begin + draw(c.filler));

  // Distinct keys (a partial Fisher-Yates shuffle), values uniform.
  std::vector<token_t> keys(static_cast<std::size_t>(c.keys));
  for (index_t i = 0; i < c.keys; ++i) keys[static_cast<std::size_t>(i)] = static_cast<token_t>(vocab.key_begin + i);
  for (index_t i = 0; i < needles; ++i) std::swap(keys[static_cast<std::size_t>(i)], keys[static_cast<std::size_t>(i + draw(c.keys - i))]);
  for (index_t i = 0; i < needles; ++i) {
    needle_info n{keys[static_cast<std::size_t>(i)], {}, -1};
    for (index_t v = 0; v < c.value_length; ++v) n.value.push_back(static_cast<token_t>(vocab.value_begin + draw(c.values)));
    ex.needles.push_back(std::move(n));
  }

  // Needles 0..R-1 are the queried ones. A needle at haystack offset o in [0, H - l] covers o..o+l-1.
  std::vector<bool> used(static_cast<std::size_t>(H), false);
  auto fits = [&](index_t o) {
    for (index_t t = o; t < o + l; ++t)
      if (used[static_cast<std::size_t>(t)]) return false;
    return true;
  };
  auto put = [&](needle_info& n, index_t o) {
    n.start = 1 + o;
    for (index_t t = o; t < o + l; ++t) used[static_cast<std::size_t>(t)] = true;
  };
  if (!placed_depths.empty())
    for (index_t r = 0; r < queries; ++r) {
      const index_t d = placed_depths[static_cast<std::size_t>(r)];
      require(d >= 0 && d < depth_count, "retrieval task", "depths", "indices in [0, 5)", std::to_string(d));
      const auto o = static_cast<index_t>(std::lround(depths[d] * static_cast<double>(H - l)));
      require(fits(o), "retrieval task", "depths", "distinct depths for the queried needles", "two at depth " + std::to_string(d));
      put(ex.needles[static_cast<std::size_t>(r)], o);
    }
  for (auto& n : ex.needles) {
    if (n.start >= 0) continue;
    std::vector<index_t> free;
    for (index_t o = 0; o + l <= H; ++o)
      if (fits(o)) free.push_back(o);
    // check_task leaves room for every needle (see there).
    put(n, free[static_cast<std::size_t>(draw(static_cast<index_t>(free.size())))]);
  }
  for (const auto& n : ex.needles) {
    ex.tokens[static_cast<std::size_t>(n.start)] = vocabulary::needle;
    ex.tokens[static_cast<std::size_t>(n.start + 1)] = n.key;
    std::copy(n.value.begin(), n.value.end(), ex.tokens.begin() + n.start + 2);
  }

  // Queries in a random order of the queried needles.
  std::vector<index_t> order(static_cast<std::size_t>(queries));
  for (index_t r = 0; r < queries; ++r) order[static_cast<std::size_t>(r)] = r;
  for (index_t r = queries - 1; r > 0; --r) std::swap(order[static_cast<std::size_t>(r)], order[static_cast<std::size_t>(draw(r + 1))]);
  index_t p = 1 + H;
  for (index_t r = 0; r < queries; ++r) {
    const index_t which = order[static_cast<std::size_t>(r)];
    const auto& n = ex.needles[static_cast<std::size_t>(which)];
    ex.tokens[static_cast<std::size_t>(p)] = vocabulary::query;
    ex.tokens[static_cast<std::size_t>(p + 1)] = n.key;
    std::copy(n.value.begin(), n.value.end(), ex.tokens.begin() + p + 2);
    for (index_t v = 0; v < c.value_length; ++v) ex.targets[static_cast<std::size_t>(p + 1 + v)] = n.value[static_cast<std::size_t>(v)];
    ex.queries.push_back({which, p + 1, placed_depths.empty() ? -1 : placed_depths[static_cast<std::size_t>(which)]});
    p += l;
  }
  return ex;
}

// A training example: (N, R) uniform over task_mix, every needle placed uniformly.
inline example generate_training(const task_config& c, random_stream& rng) {
  const auto i = std::min<std::size_t>(std::size(task_mix) - 1, static_cast<std::size_t>(rng.uniform() * std::size(task_mix)));
  return generate(c, rng, task_mix[i].needles, task_mix[i].queries);
}

// Throws input_error unless every (N, R) of task_mix fits the configuration.
inline void check_task(const task_config& c) {
  for (const auto& m : task_mix) check_task(c, m.needles, m.queries);
}

// Examples as a batch: tokens and targets [B, context].
struct batch {
  Tensor<token_t, 2> tokens, targets;
  std::vector<example> examples;
};
inline batch make_batch(std::vector<example> examples) {
  const auto B = static_cast<index_t>(examples.size());
  const auto N = static_cast<index_t>(examples.front().tokens.size());
  batch b{Tensor<token_t, 2>({B, N}), Tensor<token_t, 2>({B, N}), std::move(examples)};
  for (index_t i = 0; i < B; ++i) {
    std::copy_n(b.examples[static_cast<std::size_t>(i)].tokens.data(), N, b.tokens.data() + i * N);
    std::copy_n(b.examples[static_cast<std::size_t>(i)].targets.data(), N, b.targets.data() + i * N);
  }
  return b;
}

}  // namespace difftx::retrieval
