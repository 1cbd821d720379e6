// Generation (generation/: the sampler chain, generate() for one prompt and
// for many; io/generation_settings.hpp): the chain against transformers'
// logits processors and OpenAI's penalty formula (tests/data/sampling.json,
// tools/sampling_fixtures.py), its draws against the softmax, chains of your
// own; generate() on a LanguageModel: the prefill's last-token logits, stop
// tokens, the same tokens for a seed on every CPU policy and thread count,
// a batch equal to one prompt at a time, a finished prompt leaving the cache;
// a folder's generation settings, and the llama3 fixture folder stopping
// where transformers' generate stops.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <difftx/difftx.hpp>
#include <difftx/generation/generate.hpp>
#include <difftx/io/diffllama.hpp>
#include <difftx/io/generation_settings.hpp>
#include <difftx/policy/simd.hpp>
#include <difftx/testing/tolerance.hpp>

#include "support/helpers.hpp"
#include "support/temp_folder.hpp"

using namespace difftx;

namespace {

// tests/data/sampling.json (tools/sampling_fixtures.py).
const nlohmann::json& sampling_fixture() {
  static const auto j = [] {
    std::ifstream in(std::string(DIFFTX_TEST_DATA) + "/sampling.json");
    REQUIRE(in.good());
    return nlohmann::json::parse(in);
  }();
  return j;
}

sampling_options options_of(const nlohmann::json& c) {
  return {.temperature = c.at("temperature").get<double>(),
          .top_k = c.at("top_k").get<index_t>(),
          .top_p = c.at("top_p").get<double>(),
          .min_p = c.at("min_p").get<double>(),
          .repetition_penalty = c.at("repetition_penalty").get<double>(),
          .presence_penalty = c.at("presence_penalty").get<double>(),
          .frequency_penalty = c.at("frequency_penalty").get<double>()};
}

constexpr index_t C = 16, V = 23;

template <class T, class Policy>
auto small_model(const Policy& policy) {
  using Layer = DecoderLayer<T, 4, Policy>;
  std::vector<Layer> layers;
  for (index_t l = 0; l < 2; ++l)
    layers.emplace_back(DecoderLayerConfig{{.d_model = C, .heads = 2, .kv_heads = 1, .layer_index = l}, 32}, policy);
  LanguageModel<Layer> model({.vocab_size = V, .d_model = C}, std::move(layers));
  test_support::randomise_parameters(model, 31);
  return model;
}

// A step of a user's own: token `banned` is never a candidate.
class ban_token final : public sampling_step {
 public:
  explicit ban_token(token_t banned) : banned_(banned) {}
  void apply(candidate_set& c, const token_history&) const override {
    c.keep_if([&](token_t t) { return t != banned_; });
  }

 private:
  token_t banned_;
};

}  // namespace

TEST_CASE("sampler chain: each step and their chains keep what transformers' processors keep") {
  int sampled = 0, greedy = 0;
  for (const auto& c : sampling_fixture().at("cases")) {
    const auto logits = c.at("logits").get<std::vector<double>>();
    const auto prompt = c.at("prompt").get<std::vector<token_t>>();
    const auto generated = c.at("generated").get<std::vector<token_t>>();
    INFO("V " << logits.size() << " " << c.at("kind").get<std::string>() << ": temperature " << c.at("temperature")
              << " top_k " << c.at("top_k") << " top_p " << c.at("top_p") << " min_p " << c.at("min_p")
              << " repetition " << c.at("repetition_penalty") << " presence " << c.at("presence_penalty")
              << " frequency " << c.at("frequency_penalty"));
    token_sampler sampler(options_of(c));
    sampler.start(prompt);
    for (const token_t t : generated) sampler.accept(t);
    const auto got = sampler.distribution(std::span<const double>(logits));
    if (c.contains("greedy")) {
      ++greedy;
      REQUIRE(got.size() == 1);
      CHECK(got[0].token == c.at("greedy").get<token_t>());
      CHECK(sampler.next(std::span<const double>(logits)) == c.at("greedy").get<token_t>());
      continue;
    }
    ++sampled;
    const auto kept = c.at("kept").get<std::vector<token_t>>();
    const auto probabilities = c.at("probabilities").get<std::vector<double>>();
    REQUIRE(got.size() == kept.size());
    for (std::size_t i = 0; i < kept.size(); ++i) {
      CHECK(got[i].token == kept[i]);
      // Both sides exp and normalise in double: a few units in the last place.
      CHECK(std::abs(got[i].probability - probabilities[i]) <= 1e-14);
    }
  }
  CHECK(sampled >= 20);
  CHECK(greedy == 2);
}

TEST_CASE("sampler: draws follow the distribution (chi-square, fixed seed)") {
  // 8 tokens, temperature 0.7: 200,000 draws. With a fixed seed the statistic
  // is a fixed number; 40.5 is chi-square's 1 - 1e-6 quantile with 7 degrees
  // of freedom, so a correct sampler passes for all but one seed in a million
  // and a sampler off by 1% on one token (a shift of ~20 standard errors at
  // these counts) fails.
  const std::vector<float> logits{0.3f, -1.2f, 2.0f, 0.0f, 1.1f, -0.4f, 0.9f, 1.6f};
  token_sampler sampler({.temperature = 0.7, .seed = 12345});
  const auto expected = sampler.distribution(std::span<const float>(logits));
  std::vector<double> counts(logits.size());
  constexpr int draws = 200000;
  for (int i = 0; i < draws; ++i) counts[static_cast<std::size_t>(sampler.next(std::span<const float>(logits)))] += 1;
  double chi2 = 0;
  for (const auto& e : expected) {
    const double want = draws * e.probability, got = counts[static_cast<std::size_t>(e.token)];
    chi2 += (got - want) * (got - want) / want;
  }
  CHECK(chi2 < 40.5);
  // Truncated tokens are never drawn (no penalty here: the history does not change the candidates).
  token_sampler truncated({.temperature = 1.0, .top_k = 3, .top_p = 0.9, .min_p = 0.2, .seed = 7});
  const auto kept = truncated.distribution(std::span<const float>(logits));
  for (int i = 0; i < 20000; ++i) {
    const token_t t = truncated.next(std::span<const float>(logits));
    CHECK(std::ranges::any_of(kept, [t](const token_probability& c) { return c.token == t; }));
  }
}

TEST_CASE("sampler: draws over many blocks of weights follow the distribution (chi-square, fixed seed)") {
  // 1000 tokens (eight blocks of candidate_set::weight_block, the last
  // ragged), most of the mass in the last block and a bank of tokens of
  // weight 0 (below e^-708) between; 200,000 draws counted in ten groups of
  // 100 ids that straddle the blocks' edges. 44.8 is chi-square's 1 - 1e-6
  // quantile with 9 degrees of freedom; a draw that walked the blocks wrong
  // (a block skipped or counted twice) moves whole groups and fails.
  std::vector<double> logits(1000);
  random_stream rng(21);
  for (std::size_t v = 0; v < logits.size(); ++v) logits[v] = rng.normal() + (v >= 900 ? 3.0 : 0.0);
  for (std::size_t v = 330; v < 420; ++v) logits[v] = -800;
  token_sampler sampler({.temperature = 1.0, .seed = 4});
  const auto expected = sampler.distribution(std::span<const double>(logits));
  REQUIRE(expected.size() == logits.size());
  std::vector<double> want(10), got(10);
  for (const auto& e : expected) want[static_cast<std::size_t>(e.token) / 100] += e.probability;
  constexpr int draws = 200000;
  for (int i = 0; i < draws; ++i) {
    const token_t t = sampler.next(std::span<const double>(logits));
    CHECK_FALSE((t >= 330 && t < 420));  // weight 0: never drawn
    got[static_cast<std::size_t>(t) / 100] += 1;
  }
  double chi2 = 0;
  for (std::size_t g = 0; g < want.size(); ++g) chi2 += (got[g] - draws * want[g]) * (got[g] - draws * want[g]) / (draws * want[g]);
  CHECK(chi2 < 44.8);
}

TEST_CASE("exp_nonpositive: within an ulp of std::exp down to -708.39, 0 below, the same bits in a vectorized loop") {
  // A million points over [-708.39, 0] and the edges; std::exp is correctly
  // rounded to within an ulp itself, so 2 ulp bounds the two together.
  std::vector<double> x;
  for (int i = 0; i <= 1000000; ++i) x.push_back(-708.39 * i / 1000000.0);
  for (const double edge : {-0.0, -1e-300, -0x1p-60, -708.3899999}) x.push_back(edge);
  double worst = 0;
  for (const double v : x) {
    const double want = std::exp(v), got = exp_nonpositive(v);
    worst = std::max(worst, std::abs(got - want) / (std::nextafter(want, 2.0) - want));
  }
  CHECK(worst <= 2.0);
  CHECK(exp_nonpositive(0.0) == 1.0);  // the largest candidate's weight is exactly 1
  for (const double v : {-708.4, -745.0, -746.0, -1e300, -std::numeric_limits<double>::infinity()})
    CHECK(exp_nonpositive(v) == 0.0);
  // The loop below is vectorized where the compiler can; a call through a
  // pointer is not: every weight has the same bits either way.
  std::vector<double> looped(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) looped[i] = exp_nonpositive(x[i]);
  double (*volatile one_at_a_time)(double) = &exp_nonpositive;
  std::size_t differ = 0;
  for (std::size_t i = 0; i < x.size(); ++i) differ += looped[i] != one_at_a_time(x[i]);
  CHECK(differ == 0);
}

TEST_CASE("sampler: greedy is the first largest logit; the same seed draws the same tokens; bad options refused") {
  const std::vector<double> logits{0.5, 2.0, -1.0, 2.0};
  token_sampler greedy({});
  CHECK(greedy.greedy());
  CHECK(greedy.next(std::span<const double>(logits)) == 1);
  token_sampler a({.temperature = 1.0, .seed = 99}), b({.temperature = 1.0, .seed = 99});
  for (int i = 0; i < 100; ++i) CHECK(a.next(std::span<const double>(logits)) == b.next(std::span<const double>(logits)));

  test_support::expect_input_error([] { token_sampler({.temperature = -1.0}); }, "token_sampler", "temperature",
                                   ">= 0", "-1");
  test_support::expect_input_error([] { token_sampler({.top_k = -2}); }, "token_sampler", "top_k", ">= 0", "-2");
  test_support::expect_input_error([] { token_sampler({.top_p = 0.0}); }, "token_sampler", "top_p", "(0, 1]", "0");
  test_support::expect_input_error([] { token_sampler({.min_p = 1.5}); }, "token_sampler", "min_p", "[0, 1]", "1.5");
  test_support::expect_input_error([] { token_sampler({.repetition_penalty = 0.0}); }, "token_sampler",
                                   "repetition_penalty", "> 0", "0");
  test_support::expect_input_error([] { token_sampler({.presence_penalty = INFINITY}); }, "token_sampler",
                                   "presence_penalty", "finite", "inf");
  test_support::expect_input_error([] { token_sampler({.frequency_penalty = NAN}); }, "token_sampler",
                                   "frequency_penalty", "finite", "nan");
  const std::vector<double> bad{0.0, std::nan("")};
  test_support::expect_input_error([&] { greedy.next(std::span<const double>(bad)); }, "token_sampler", "logits",
                                   "finite", "token 1");
  test_support::expect_input_error([&] { greedy.next(std::span<const double>()); }, "token_sampler", "logits",
                                   "at least one", "empty");
}

TEST_CASE("sampler: greedy over a large vocabulary is the first largest logit wherever it lies, in every type") {
  // Rows of 1 to 2000 tokens (one or more blocks, ragged tails), with the
  // largest value repeated across and within blocks, at the tail, and rows of
  // signed zeros; against the first largest as std::max_element finds it.
  random_stream rng(11);
  auto check_rows = [&]<class T>(T) {
    for (const std::size_t n : {1, 7, 255, 256, 257, 600, 2000}) {
      for (int layout = 0; layout < 5; ++layout) {
        std::vector<T> logits(n);
        for (auto& x : logits) x = T(static_cast<float>(rng.normal()));
        const auto at = [&](double share) { return std::min(n - 1, static_cast<std::size_t>(share * double(n))); };
        if (layout == 1) logits[at(0.9)] = logits[at(0.3)] = T(9.0f);  // a tie in two blocks: the earlier
        if (layout == 2) logits[n - 1] = T(9.0f);                       // in the tail
        if (layout == 3) logits[at(0.5)] = logits[std::min(n - 1, at(0.5) + 3)] = T(9.0f);  // a tie in one block
        if (layout == 4)
          for (std::size_t v = 0; v < n; ++v) logits[v] = T(v % 2 ? 0.0f : -0.0f);
        const auto want = std::max_element(logits.begin(), logits.end(),
                                           [](T a, T b) { return static_cast<double>(a) < static_cast<double>(b); });
        INFO(scalar_traits<T>::name << ", " << n << " tokens, layout " << layout);
        token_sampler greedy({});
        CHECK(greedy.next(std::span<const T>(logits)) == static_cast<token_t>(want - logits.begin()));
      }
    }
    // A non-finite logit in a later block is named, as the first one is.
    std::vector<T> bad(1000, T(1.0f));
    bad[700] = T(std::numeric_limits<float>::infinity());
    bad[900] = T(std::numeric_limits<float>::quiet_NaN());
    token_sampler greedy({});
    test_support::expect_input_error([&] { greedy.next(std::span<const T>(bad)); }, "token_sampler", "logits",
                                     "finite", "token 700");
  };
  check_rows(float{});
  check_rows(double{});
  check_rows(Eigen::bfloat16{});
  check_rows(Eigen::half{});
}

TEST_CASE("sampler: the history is the prompt and the chosen tokens; penalties follow it step by step") {
  // Greedy with a repetition penalty walks the tokens down: each chosen token
  // is penalised at the next step, as transformers' greedy with the processor does.
  const std::vector<double> logits{3.0, 2.9, 2.8, 2.7, -1.0};
  token_sampler sampler({.repetition_penalty = 2.0});
  sampler.start(std::vector<token_t>{1});
  std::vector<token_t> got;
  for (int i = 0; i < 4; ++i) got.push_back(sampler.next(std::span<const double>(logits)));
  // step 1: 1 is penalised (2.9 -> 1.45): 0; then 0 and 1: 2; then 3; then all of 0..3 halved: 0 (1.5).
  CHECK(got == std::vector<token_t>{0, 2, 3, 0});
  CHECK(sampler.history().seen().size() == 4);
  CHECK(sampler.history().generated_counts().at(0) == 2);
  CHECK_FALSE(sampler.history().generated_counts().contains(1));  // the prompt's tokens are not generated ones
  // start() forgets the previous sequence; distribution() does not add to the history.
  sampler.start(std::vector<token_t>{});
  CHECK(sampler.distribution(std::span<const double>(logits)).front().token == 0);
  CHECK(sampler.history().seen().empty());
  // Ids outside the row are ignored, as transformers ignores them.
  sampler.start(std::vector<token_t>{0, 99, -3});
  CHECK(sampler.next(std::span<const double>(logits)) == 1);
}

TEST_CASE("sampler chain of your own: steps in your order, a step of your own, greedy or drawn") {
  const std::vector<double> logits{2.0, 1.0, 0.5, 0.0, -0.5, 3.0};
  // A ban, then top-2: the largest (5) is banned, so 0 and 1 remain.
  token_sampler chain({std::make_shared<ban_token>(5), std::make_shared<top_k_step>(2)}, std::uint64_t{3});
  CHECK_FALSE(chain.greedy());
  const auto d = chain.distribution(std::span<const double>(logits));
  REQUIRE(d.size() == 2);
  CHECK(d[0].token == 0);
  CHECK(d[1].token == 1);
  CHECK(std::abs(d[0].probability - 1 / (1 + std::exp(-1.0))) < 1e-15);
  // The same steps the other way round: top-2 keeps 5 and 0, the ban leaves 0.
  token_sampler reversed({std::make_shared<top_k_step>(2), std::make_shared<ban_token>(5)}, std::nullopt);
  CHECK(reversed.greedy());
  CHECK(reversed.next(std::span<const double>(logits)) == 0);
  // The options' chain is one such chain: the same steps give the same draws.
  token_sampler from_options({.temperature = 0.5, .top_k = 3, .seed = 11});
  token_sampler by_hand({std::make_shared<temperature_step>(0.5), std::make_shared<top_k_step>(3)}, std::uint64_t{11});
  for (int i = 0; i < 50; ++i)
    CHECK(from_options.next(std::span<const double>(logits)) == by_hand.next(std::span<const double>(logits)));
  test_support::expect_input_error([] { token_sampler({nullptr}, std::nullopt); }, "token_sampler", "steps[0]", "a step",
                                   "null");
}

TEST_CASE("sampler: top-p over a large vocabulary keeps exactly the smallest head whose probability reaches p") {
  // 50,000 tokens, logits from a fixed stream: the kept set from a full sort, written out here, is the chain's.
  const index_t n = 50000;
  random_stream rng(5);
  std::vector<float> logits(static_cast<std::size_t>(n));
  for (auto& x : logits) x = static_cast<float>(3 * rng.normal());
  for (const double p : {0.1, 0.5, 0.9, 0.99}) {
    INFO("top_p " << p);
    std::vector<token_t> order(logits.size());
    std::iota(order.begin(), order.end(), token_t{0});
    std::ranges::sort(order, [&](token_t a, token_t b) {
      return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)] ||
             (logits[static_cast<std::size_t>(a)] == logits[static_cast<std::size_t>(b)] && a < b);
    });
    const double largest = logits[static_cast<std::size_t>(order[0])];
    double total = 0;
    for (const float x : logits) total += std::exp(double(x) - largest);
    std::vector<token_t> want;
    double before = 0;
    for (const token_t t : order) {
      if (!want.empty() && before / total >= p) break;
      want.push_back(t);
      before += std::exp(double(logits[static_cast<std::size_t>(t)]) - largest);
    }
    std::ranges::sort(want);
    token_sampler sampler({.temperature = 1.0, .top_p = p});
    const auto got = sampler.distribution(std::span<const float>(logits));
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) CHECK(got[i].token == want[i]);
  }
  // Equal probabilities across the boundary: the smaller ids stay.
  const std::vector<double> equal{1.0, 0.0, 0.0, 0.0, 0.0, -3.0};
  token_sampler tie({.temperature = 1.0, .top_p = 0.6});
  const auto kept = tie.distribution(std::span<const double>(equal));
  REQUIRE(kept.size() == 3);
  CHECK(kept[1].token == 1);
  CHECK(kept[2].token == 2);
}

// The head over the last rows only, against the same rows of the full prefill:
// the reference policy computes each row alike whatever the row count (the
// same bits); simd may take its few-rows product for them (within float64's bar).
template <class Policy>
void check_last_rows(const Policy& policy, double bar) {
  auto model = small_model<double>(policy);
  Tensor<token_t, 2> tokens({2, 7});
  for (index_t i = 0; i < tokens.size(); ++i) tokens.data()[i] = static_cast<token_t>((i * 5 + 2) % V);
  auto cache = model.make_cache(2, 7);
  Tensor<double, 3> all({2, 7, V});
  model.prefill(tokens, cache, all.view());
  Tensor<double, 2> last({2, V});
  model.prefill(tokens, cache, last.view());
  double worst = 0;
  for (index_t b = 0; b < 2; ++b)
    for (index_t v = 0; v < V; ++v) worst = std::max(worst, std::abs(last(b, v) - all(b, 6, v)));

  // Packed: sequences of 3 and 11 tokens in one row; each one's last token.
  const std::vector<index_t> offsets{0, 3, 14};
  Tensor<token_t, 2> packed({1, 14});
  for (index_t i = 0; i < 14; ++i) packed(0, i) = static_cast<token_t>((i * 3 + 1) % V);
  auto packed_cache = model.make_cache(2, 11);
  Tensor<double, 3> packed_all({1, 14, V});
  model.prefill(packed, packed_cache, packed_all.view(), offsets);
  Tensor<double, 2> packed_last({2, V});
  model.prefill(packed, packed_cache, packed_last.view(), offsets);
  for (index_t v = 0; v < V; ++v)
    worst = std::max({worst, std::abs(packed_last(0, v) - packed_all(0, 2, v)),
                      std::abs(packed_last(1, v) - packed_all(0, 13, v))});
  INFO(Policy::name << ": worst difference " << worst);
  CHECK(worst <= bar);

  Tensor<double, 2> wrong({3, V});
  test_support::expect_input_error([&] { model.prefill(tokens, cache, wrong.view()); }, "LanguageModel::prefill",
                                   "last", "[2, 23]", "[3, 23]");
}

TEST_CASE("LanguageModel::prefill at the last tokens only: the full prefill's last rows, for dense and packed batches") {
  check_last_rows(policy::reference{}, 0.0);
  check_last_rows(policy::simd{2}, testing::tolerance<double>::forward);  // logits of order 1
}

TEST_CASE("generate: greedy is the argmax of full forwards; stop tokens end it; bad input changes nothing") {
  const auto model = small_model<double>(policy::reference{});
  const std::vector<token_t> prompt{3, 17, 5};
  const auto greedy = generate(model, prompt, {.max_new_tokens = 8});
  REQUIRE(greedy.size() == 8);
  // Each new token is the largest logit of a forward over everything before it.
  std::vector<token_t> sequence = prompt;
  for (const token_t t : greedy) {
    Tensor<token_t, 2> tokens({1, static_cast<index_t>(sequence.size())});
    std::copy(sequence.begin(), sequence.end(), tokens.data());
    Tensor<double, 3> logits(model.output_shape(tokens.shape()));
    model.forward(tokens, logits.view());
    const double* row = logits.data() + (tokens.extent(1) - 1) * V;
    CHECK(t == std::max_element(row, row + V) - row);
    sequence.push_back(t);
  }
  // A stop token ends generation after it is produced, and is returned.
  std::vector<token_t> streamed;
  const auto stopped = generate(model, prompt, {.max_new_tokens = 8, .stop_tokens = {greedy[2], V - 1}},
                                [&](token_t t) { streamed.push_back(t); });
  const auto first_stop = std::ranges::find(greedy, greedy[2]) - greedy.begin();
  CHECK(stopped == std::vector<token_t>(greedy.begin(), greedy.begin() + first_stop + 1));
  CHECK(streamed == stopped);

  test_support::expect_input_error([&] { generate(model, std::vector<token_t>{1, V}, {}); }, "generate", "prompt",
                                   "[0, 23)", "23 at position 1");
  test_support::expect_input_error([&] { generate(model, std::vector<token_t>{}, {}); }, "generate", "prompt",
                                   "at least one token", "none");
  test_support::expect_input_error([&] { generate(model, prompt, {.max_new_tokens = 0}); }, "generate",
                                   "max_new_tokens", "at least 1", "0");
  test_support::expect_input_error([&] { generate(model, prompt, {.stop_tokens = {-1}}); }, "generate", "stop_tokens",
                                   "[0, 23)", "-1");
  test_support::expect_input_error([&] { generate(model, prompt, {.sampling = {.top_p = 2.0}}); }, "token_sampler",
                                   "top_p", "(0, 1]", "2");
}

TEST_CASE("generate: a seed gives the same sampled tokens on every CPU policy and thread count") {
  const std::vector<generation_options> chains{
      {.max_new_tokens = 24, .sampling = {.temperature = 1.0, .top_p = 0.95, .seed = 2026}},
      {.max_new_tokens = 24,
       .sampling = {.temperature = 0.8, .top_k = 10, .min_p = 0.05, .repetition_penalty = 1.3, .presence_penalty = 0.2,
                    .frequency_penalty = 0.1, .seed = 7}}};
  const std::vector<token_t> prompt{4, 9, 1, 20};
  auto reference = small_model<float>(policy::reference{});
  for (const auto& sampled : chains) {
    const auto tokens = generate(reference, prompt, sampled);
    CHECK(tokens.size() == 24);
    for (int threads : {1, 2, 3}) {
      auto simd = small_model<float>(policy::simd{threads});
      CHECK(generate(simd, prompt, sampled) == tokens);
    }
    // Another seed draws another sequence.
    auto other = sampled;
    other.sampling.seed += 1;
    CHECK(generate(reference, prompt, other) != tokens);
  }
}

TEST_CASE("KVCache::keep_sequences: the kept sequences decode as before, the others leave; bad input changes nothing") {
  const auto model = small_model<double>(policy::reference{});
  for (const auto storage : {inference_dtype::same, inference_dtype::int8}) {
    INFO("storage " << (storage == inference_dtype::int8 ? "int8" : "same"));
    // Three prompts of 3, 5 and 2 tokens, packed; one decode step on all three.
    const std::vector<index_t> offsets{0, 3, 8, 10};
    Tensor<token_t, 2> prompts({1, 10});
    for (index_t i = 0; i < 10; ++i) prompts(0, i) = static_cast<token_t>((7 * i + 3) % V);
    auto all = model.make_cache(3, 8, storage);
    Tensor<double, 2> last({3, V});
    model.prefill(prompts, all, last.view(), offsets);
    auto kept = all;
    for (auto& layer : kept) layer.keep_sequences(std::vector<index_t>{0, 2});
    CHECK(kept[0].batch() == 2);
    CHECK(kept[0].length(0) == 3);
    CHECK(kept[0].length(1) == 2);
    Tensor<token_t, 2> three({3, 1}), two({2, 1});
    three(0, 0) = two(0, 0) = 11;
    three(1, 0) = 4;
    three(2, 0) = two(1, 0) = 19;
    Tensor<double, 3> from_all({3, 1, V}), from_kept({2, 1, V});
    model.decode(three, all, from_all.view());
    model.decode(two, kept, from_kept.view());
    for (index_t v = 0; v < V; ++v) {
      CHECK(from_kept(0, 0, v) == from_all(0, 0, v));  // the reference computes each row alike: the same bits
      CHECK(from_kept(1, 0, v) == from_all(2, 0, v));
    }
    auto& layer = kept[0];
    test_support::expect_input_error([&] { layer.keep_sequences(std::vector<index_t>{1, 0}); },
                                     "KVCache::keep_sequences", "kept", "increasing", "0 at 1");
    test_support::expect_input_error([&] { layer.keep_sequences(std::vector<index_t>{2}); }, "KVCache::keep_sequences",
                                     "kept", "[0, 2)", "2 at 0");
    test_support::expect_input_error([&] { layer.keep_sequences(std::vector<index_t>{}); }, "KVCache::keep_sequences",
                                     "kept", "at least one", "none");
    CHECK(layer.batch() == 2);
    CHECK(layer.length(1) == 3);
  }
}

// Prompts of several lengths, each with its own options: a batch gives what one prompt at a time gives.
template <class Model>
void check_batch_equals_one_at_a_time(const Model& model, const std::string& what) {
  INFO(what);
  const std::vector<std::vector<token_t>> prompts{{3, 17, 5}, {1}, {8, 8, 2, 14, 20, 6, 9}, {22, 0}, {5, 12, 7, 1}};
  std::vector<generation_options> options{
      {.max_new_tokens = 12},
      {.max_new_tokens = 5, .sampling = {.temperature = 1.0, .seed = 1}},
      {.max_new_tokens = 20, .sampling = {.temperature = 0.9, .top_k = 8, .top_p = 0.9, .seed = 2}},
      {.max_new_tokens = 1},
      {.max_new_tokens = 16, .sampling = {.temperature = 1.2, .min_p = 0.05, .repetition_penalty = 1.2, .seed = 3}}};
  // A stop token the first prompt reaches early: it leaves the batch while the others go on.
  const auto alone = generate(model, prompts[0], options[0]);
  options[0].stop_tokens = {alone[3]};
  std::vector<std::vector<token_t>> one_at_a_time;
  for (std::size_t i = 0; i < prompts.size(); ++i) one_at_a_time.push_back(generate(model, prompts[i], options[i]));
  CHECK(one_at_a_time[0].size() <= 4);
  CHECK(one_at_a_time[3].size() == 1);

  std::vector<std::vector<token_t>> streamed(prompts.size());
  const auto together = generate(model, std::span(prompts), std::span<const generation_options>(options),
                                 [&](std::size_t i, token_t t) { streamed[i].push_back(t); });
  CHECK(together == one_at_a_time);
  CHECK(streamed == together);
  // The same options for every prompt: each as alone with those options.
  const generation_options shared{.max_new_tokens = 6, .sampling = {.temperature = 1.0, .top_k = 5, .seed = 9}};
  const auto same = generate(model, std::span(prompts), shared);
  for (std::size_t i = 0; i < prompts.size(); ++i) CHECK(same[i] == generate(model, prompts[i], shared));
}

TEST_CASE("generate many prompts: the same tokens as one at a time, each prompt with its own options and end") {
  check_batch_equals_one_at_a_time(small_model<double>(policy::reference{}), "reference, double");
  check_batch_equals_one_at_a_time(small_model<float>(policy::reference{}), "reference, float");
  // simd multiplies a batch's rows with other kernels than one row's: equal
  // within rounding, far below this model's gaps between candidates.
  for (const int threads : {1, 2})
    check_batch_equals_one_at_a_time(small_model<double>(policy::simd{threads}),
                                     "simd, double, " + std::to_string(threads) + " threads");
  check_batch_equals_one_at_a_time(small_model<double>(policy::simd{2}), "simd, double");

  const auto model = small_model<double>(policy::reference{});
  const std::vector<std::vector<token_t>> prompts{{1, 2}, {3, V}};
  const std::vector<generation_options> two(2);
  test_support::expect_input_error([&] { generate(model, std::span(prompts), std::span<const generation_options>(two)); },
                                   "generate", "prompts[1]", "[0, 23)", "23 at position 1");
  const std::vector<std::vector<token_t>> good{{1, 2}, {3}};
  test_support::expect_input_error(
      [&] { generate(model, std::span(good), std::span<const generation_options>(two.data(), 1)); }, "generate",
      "options", "one per prompt (2)", "1");
  auto int8 = two;
  int8[1].kv_cache = inference_dtype::int8;
  test_support::expect_input_error([&] { generate(model, std::span(good), std::span<const generation_options>(int8)); },
                                   "generate", "options[1].kv_cache", "options[0]'s", "another");
  auto zero = two;
  zero[1].max_new_tokens = 0;
  test_support::expect_input_error([&] { generate(model, std::span(good), std::span<const generation_options>(zero)); },
                                   "generate", "options[1].max_new_tokens", "at least 1", "0");
  test_support::expect_input_error(
      [&] { generate(model, std::span<const std::vector<token_t>>(), std::span<const generation_options>()); },
      "generate", "prompts", "at least one prompt", "none");
}

TEST_CASE("generation settings: generation_config.json, else config.json, as transformers reads them") {
  namespace fs = std::filesystem;
  const auto llama3 = io::read_generation_settings(fs::path(DIFFTX_TEST_DATA) / "hf" / "llama3");
  CHECK(llama3.eos_token_ids == std::vector<token_t>{2});
  CHECK(llama3.bos_token_id == 1);
  CHECK_FALSE(llama3.do_sample);
  CHECK(llama3.top_k == 50);  // transformers' default
  CHECK(llama3.file.ends_with("generation_config.json"));
  const auto greedy = llama3.sampling(5);
  CHECK(greedy.temperature == 0.0);
  CHECK(greedy.seed == 5);

  // Llama-3.1-Instruct's generation_config.json, in its own words.
  const auto instruct = io::parse_generation_settings(
      nlohmann::json::parse(R"({"bos_token_id": 128000, "do_sample": true, "eos_token_id": [128001, 128008, 128009],
                                "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.42.3"})"),
      "generation_config.json");
  CHECK(instruct.eos_token_ids == std::vector<token_t>{128001, 128008, 128009});
  const auto sampled = instruct.sampling(1);
  CHECK(sampled.temperature == 0.6);
  CHECK(sampled.top_p == 0.9);
  CHECK(sampled.top_k == 50);
  CHECK(sampled.min_p == 0.0);
  // do_sample false: greedy with the penalty, the sampling values unused (and unchecked, as transformers only warns).
  const auto penalised = io::parse_generation_settings(
      nlohmann::json::parse(R"({"temperature": 0, "repetition_penalty": 1.1, "eos_token_id": null, "min_p": 0.05})"),
      "g.json");
  CHECK(penalised.eos_token_ids.empty());
  CHECK(penalised.sampling().temperature == 0.0);
  CHECK(penalised.sampling().repetition_penalty == 1.1);

  // Only config.json: its keys (transformers reads generation keys from it then).
  test_support::temp_folder folder;
  std::ofstream(folder / "config.json") << R"({"model_type": "diffllama", "eos_token_id": 7, "bos_token_id": 6})";
  const auto from_config = io::read_generation_settings(folder.path());
  CHECK(from_config.eos_token_ids == std::vector<token_t>{7});
  CHECK(from_config.file.ends_with("config.json"));
  // With a generation_config.json, config.json is not read at all.
  std::ofstream(folder / "generation_config.json") << R"({"bos_token_id": 6})";
  CHECK(io::read_generation_settings(folder.path()).eos_token_ids.empty());

  const auto refused = [](const std::string& json, const std::string& key, const std::string& expected,
                          const std::string& got) {
    test_support::expect_input_error([&] { io::parse_generation_settings(nlohmann::json::parse(json), "g.json"); },
                                     "read_generation_settings", "g.json: " + key, expected, got);
  };
  refused(R"({"eos_token_id": "2"})", "eos_token_id", "token id", "\"2\"");
  refused(R"({"eos_token_id": [1, -2]})", "eos_token_id", "token id", "-2");
  refused(R"({"bos_token_id": 4294967296})", "bos_token_id", "token id", "4294967296");
  refused(R"({"do_sample": 1})", "do_sample", "true or false", "1");
  refused(R"({"do_sample": true, "temperature": 0.0})", "temperature", "> 0", "0.0");
  refused(R"({"do_sample": true, "top_p": 1.5})", "top_p", "(0, 1]", "1.5");
  refused(R"({"top_k": -1})", "top_k", ">= 0", "-1");
  refused(R"({"temperature": "hot"})", "temperature", "a number", "\"hot\"");
  refused(R"({"repetition_penalty": 0})", "repetition_penalty", "> 0", "0");
  test_support::expect_input_error([] { io::parse_generation_settings(nlohmann::json::array(), "g.json"); },
                                   "read_generation_settings", "g.json", "a JSON object", "array");
  test_support::temp_folder empty;
  test_support::expect_input_error([&] { io::read_generation_settings(empty.path()); }, "read_generation_settings",
                                   empty.path().string(), "generation_config.json or config.json", "neither");
}

TEST_CASE("generate with a folder's settings stops at its EOS where transformers' generate stops") {
  // tests/data/sampling.json "stops": prompts of the llama3 fixture folder whose
  // greedy continuation (transformers, float64) ends at EOS within 16 tokens.
  namespace fs = std::filesystem;
  const auto& stops = sampling_fixture().at("stops");
  REQUIRE(stops.size() >= 2);
  const auto folder = fs::path(DIFFTX_TEST_DATA) / stops[0].at("folder").get<std::string>();
  const auto settings = io::read_generation_settings(folder);
  const generation_options o{.max_new_tokens = stops[0].at("max_new_tokens").get<index_t>(),
                             .stop_tokens = settings.eos_token_ids,
                             .sampling = settings.sampling()};
  const auto reference = io::load_diffllama<double>(folder);
  const auto simd = io::load_diffllama<float>(folder, policy::simd{});
  std::vector<std::vector<token_t>> prompts, expected;
  for (const auto& s : stops) {
    prompts.push_back(s.at("prompt").get<std::vector<token_t>>());
    expected.push_back(s.at("tokens").get<std::vector<token_t>>());
    CHECK(static_cast<index_t>(expected.back().size()) < o.max_new_tokens);
    CHECK(std::ranges::find(settings.eos_token_ids, expected.back().back()) != settings.eos_token_ids.end());
    CHECK(generate(reference, prompts.back(), o) == expected.back());
    CHECK(generate(simd, prompts.back(), o) == expected.back());
  }
  CHECK(generate(reference, std::span(prompts), o) == expected);
  CHECK(generate(simd, std::span(prompts), o) == expected);
}
