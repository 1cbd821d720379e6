// Generation (generation/sampler.hpp, generation/generate.hpp): the sampler's
// truncation against transformers' warpers, its draws against the softmax,
// and generate() on a LanguageModel: the prefill's last-token logits, stop
// tokens, and the same tokens for a seed on every CPU policy and thread count.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <difftx/difftx.hpp>
#include <difftx/generation/generate.hpp>
#include <difftx/policy/simd.hpp>
#include <difftx/testing/tolerance.hpp>

#include "support/helpers.hpp"

using namespace difftx;

namespace {

// tests/data/sampling.json (tools/sampling_fixtures.py): rows of logits with
// the tokens transformers' Temperature/TopK/TopP warpers keep, and their softmax.
nlohmann::json sampling_cases() {
  std::ifstream in(std::string(DIFFTX_TEST_DATA) + "/sampling.json");
  REQUIRE(in.good());
  return nlohmann::json::parse(in).at("cases");
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

}  // namespace

TEST_CASE("sampler: the kept tokens and their probabilities are transformers' warpers'") {
  for (const auto& c : sampling_cases()) {
    const auto logits = c.at("logits").get<std::vector<double>>();
    const token_sampler sampler({.temperature = c.at("temperature").get<double>(),
                                 .top_k = c.at("top_k").get<index_t>(),
                                 .top_p = c.at("top_p").get<double>()});
    INFO("V " << logits.size() << " temperature " << c.at("temperature") << " top_k " << c.at("top_k") << " top_p "
              << c.at("top_p") << " (" << c.at("kind").get<std::string>() << ")");
    const auto got = sampler.distribution(std::span<const double>(logits));
    const auto kept = c.at("kept").get<std::vector<token_t>>();
    const auto probabilities = c.at("probabilities").get<std::vector<double>>();
    REQUIRE(got.size() == kept.size());
    for (std::size_t i = 0; i < kept.size(); ++i) {
      CHECK(got[i].token == kept[i]);
      // Both sides exp and normalise in double: a few units in the last place.
      CHECK(std::abs(got[i].probability - probabilities[i]) <= 1e-14);
    }
  }
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
  // Top-k and top-p: a truncated token is never drawn.
  token_sampler truncated({.temperature = 1.0, .top_k = 3, .top_p = 0.9, .seed = 7});
  const auto kept = truncated.distribution(std::span<const float>(logits));
  for (int i = 0; i < 20000; ++i) {
    const token_t t = truncated.next(std::span<const float>(logits));
    CHECK(std::ranges::any_of(kept, [t](const token_probability& c) { return c.token == t; }));
  }
}

TEST_CASE("sampler: greedy is the first largest logit; the same seed draws the same tokens; bad options refused") {
  const std::vector<double> logits{0.5, 2.0, -1.0, 2.0};
  token_sampler greedy({});
  CHECK(greedy.next(std::span<const double>(logits)) == 1);
  token_sampler a({.temperature = 1.0, .seed = 99}), b({.temperature = 1.0, .seed = 99});
  for (int i = 0; i < 100; ++i) CHECK(a.next(std::span<const double>(logits)) == b.next(std::span<const double>(logits)));

  test_support::expect_input_error([] { token_sampler({.temperature = -1.0}); }, "token_sampler", "temperature",
                                   ">= 0", "-1");
  test_support::expect_input_error([] { token_sampler({.top_k = -2}); }, "token_sampler", "top_k", ">= 0", "-2");
  test_support::expect_input_error([] { token_sampler({.top_p = 0.0}); }, "token_sampler", "top_p", "(0, 1]", "0");
  const std::vector<double> bad{0.0, std::nan("")};
  test_support::expect_input_error([&] { greedy.next(std::span<const double>(bad)); }, "token_sampler", "logits",
                                   "finite", "token 1");
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
}

TEST_CASE("generate: a seed gives the same sampled tokens on every CPU policy and thread count") {
  const generation_options sampled{.max_new_tokens = 24, .sampling = {.temperature = 1.0, .top_p = 0.95, .seed = 2026}};
  const std::vector<token_t> prompt{4, 9, 1, 20};
  auto reference = small_model<float>(policy::reference{});
  const auto tokens = generate(reference, prompt, sampled);
  CHECK(tokens.size() == 24);
  for (int threads : {1, 2, 3}) {
    auto simd = small_model<float>(policy::simd{threads});
    CHECK(generate(simd, prompt, sampled) == tokens);
  }
  // Another seed draws another sequence.
  auto other = sampled;
  other.sampling.seed = 2027;
  CHECK(generate(reference, prompt, other) != tokens);
}
