// Inference: KV-cache decoding, packed variable-length batches and the
// stateless forward, on the CPU policies, against the plain forward.
//  - prefill then decode steps (one and several tokens, B > 1 with different
//    prompt lengths, grouped heads, a cache filled to capacity) equal one
//    forward over the whole sequence, for MultiHead, the baseline Attention,
//    DecoderLayer, BaselineLayer, Stack, LanguageModel and V2 (MultiHeadV2,
//    its baseline, DecoderLayerV2: double, float, bfloat16), on the reference
//    in double and on simd in every type, within difftx::testing::tolerance
//    (per decoder layer on the path) of the same build's forward.
//  - a packed batch equals each sequence run on its own, output and every
//    gradient, within the backward tolerance.
//  - bad input (decode before prefill, past the capacity, bad offsets, a cache
//    from another module) throws input_error and changes neither cache nor output.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <difftx/difftx.hpp>
#include <difftx/policy/simd.hpp>
#include <difftx/testing/compare.hpp>
#include <difftx/testing/tolerance.hpp>

#include "support/compare_modules.hpp"
#include "support/helpers.hpp"

using namespace difftx;

namespace {

constexpr index_t C = 16, D = 4;

// Largest normwise difference between rows [n0, n1) of `full` and `part`.
template <class T, class R>
double part_difference(const Tensor<T, 3>& part, const Tensor<R, 3>& full, index_t n0) {
  const auto expected = test_support::token_range<R>(full, n0, n0 + part.extent(1));
  return testing::normwise_difference(part.data(), expected.data(), part.size());
}

struct multihead_factory {
  index_t heads = 4, kv_heads = 2;
  template <class T, class P>
  MultiHead<T, D, P> operator()() const {
    return MultiHead<T, D, P>({C, heads, kv_heads, 2});
  }
};
struct attention_factory {
  template <class T, class P>
  Attention<T, D, P> operator()() const {
    return Attention<T, D, P>({C, 4, 2});
  }
};
struct decoder_factory {
  template <class T, class P>
  DecoderLayer<T, D, P> operator()() const {
    return DecoderLayer<T, D, P>({{C, 2, 1, 1}, 32});
  }
};
struct baseline_factory {
  template <class T, class P>
  BaselineLayer<T, D, P> operator()() const {
    return BaselineLayer<T, D, P>({{C, 4, 2}, 32});
  }
};
struct multihead_v2_factory {
  index_t heads = 2, kv_heads = 2;  // 2h query heads over g groups
  bool differential = true;
  template <class T, class P>
  MultiHeadV2<T, D, P> operator()() const {
    return MultiHeadV2<T, D, P>({.d_model = C, .heads = heads, .kv_heads = kv_heads, .differential = differential});
  }
};
struct decoder_v2_factory {
  template <class T, class P>
  DecoderLayerV2<T, D, P> operator()() const {
    return DecoderLayerV2<T, D, P>({{.d_model = C, .heads = 2, .kv_heads = 1}, 32});
  }
};
struct stack_factory {
  template <class T, class P>
  Stack<DecoderLayer<T, dynamic, P>> operator()() const {
    std::vector<DecoderLayer<T, dynamic, P>> layers;
    for (index_t l = 0; l < 2; ++l) layers.emplace_back(DecoderLayerConfig{{C, 2, 2, l, 10000.0, true, 6}, 32});
    return Stack<DecoderLayer<T, dynamic, P>>(std::move(layers));
  }
};

// A long double reference oracle and a (T, P) candidate with the same weights
// (exactly representable in T).
using oracle_t = long double;
template <class T, class P, class Make>
auto oracle_and_candidate(Make make, std::uint64_t seed) {
  auto oracle = make.template operator()<oracle_t, policy::reference>();
  auto candidate = make.template operator()<T, P>();
  test_support::randomise_parameters(oracle, seed);
  for (auto& p : oracle.parameters())
    for (index_t i = 0; i < p.size(); ++i) p.value[i] = test_support::round_through<oracle_t, T>(p.value[i]);
  copy_parameters(oracle, candidate);
  return std::pair{std::move(oracle), std::move(candidate)};
}

// Prefill `prompt` tokens, then decode the rest in the given step sizes; every
// output row against one forward over all tokens by the same build (type and
// policy: that forward is held to the reference by simd_test and
// fixtures_test). Returns the worst normwise difference.
template <class T, class P, class Make>
double decode_against_forward(Make make, index_t batch, index_t prompt, const std::vector<index_t>& steps,
                              index_t capacity) {
  auto candidate = oracle_and_candidate<T, P>(make, 11).second;
  index_t total = prompt;
  for (index_t s : steps) total += s;
  const auto x = test_support::random_tensor<T, 3>({batch, total, C}, 12);
  Tensor<T, 3> y_full(x.shape());
  candidate.forward(x, y_full.view());

  auto cache = candidate.make_cache(batch, capacity);
  auto x0 = test_support::token_range<T>(x, 0, prompt);
  Tensor<T, 3> y0(x0.shape());
  candidate.prefill(x0, cache, y0.view());
  double worst = part_difference(y0, y_full, 0);
  index_t n = prompt;
  for (index_t s : steps) {
    auto xs = test_support::token_range<T>(x, n, n + s);
    Tensor<T, 3> ys(xs.shape());
    candidate.decode(xs, cache, ys.view());
    worst = std::max(worst, part_difference(ys, y_full, n));
    n += s;
  }
  return worst;
}

// layers: decoder layers on the longest path (the tolerance's counts are per layer).
template <class T, class P = policy::simd, class Make>
void check_decoding(const std::string& label, Make make, int layers) {
  const std::vector<index_t> steps{1, 1, 2, 1, 3};
  const double e = decode_against_forward<T, P>(make, 2, 5, steps, 13);
  INFO(label << " " << scalar_traits<T>::name << ": " << e / scalar_traits<T>::epsilon << " u");
  CHECK(e <= layers * testing::tolerance<T>::forward);
}

template <class Make>
void check_decoding_everywhere(const std::string& label, Make make, int layers = 1) {
  check_decoding<double, policy::reference>(label, make, layers);
  check_decoding<float>(label, make, layers);
  check_decoding<double>(label, make, layers);
  check_decoding<Eigen::half>(label, make, layers);
  check_decoding<Eigen::bfloat16>(label, make, layers);
}

// Sets every cache row of k [B, S, ...] and v [B, S, ...] past each sequence's
// length to NaN, so that a kernel reading one gives a NaN output.
template <class T>
void nan_past_lengths(Tensor<T, 5>& k, Tensor<T, 4>& v, const std::vector<index_t>& lengths) {
  const index_t S = k.extent(1), k_row = k.size() / (k.extent(0) * S), v_row = v.size() / (v.extent(0) * S);
  for (std::size_t b = 0; b < lengths.size(); ++b)
    for (index_t t = lengths[b]; t < S; ++t) {
      std::fill_n(k.view()[static_cast<index_t>(b)][t].data(), k_row, T(std::numeric_limits<float>::quiet_NaN()));
      std::fill_n(v.view()[static_cast<index_t>(b)][t].data(), v_row, T(std::numeric_limits<float>::quiet_NaN()));
    }
}

}  // namespace

TEST_CASE("prefill then decode equals one forward: MultiHead, Attention, layers, Stack") {
  check_decoding_everywhere("MultiHead h=4 g=2", multihead_factory{});
  check_decoding_everywhere("MultiHead h=2 g=2", multihead_factory{2, 2});
  check_decoding_everywhere("Attention H=4 G=2", attention_factory{});
  check_decoding_everywhere("DecoderLayer", decoder_factory{});
  check_decoding_everywhere("BaselineLayer", baseline_factory{});
  check_decoding_everywhere("Stack of 2 (D = 6 at run time)", stack_factory{}, 2);
}

// Heads wide enough for whole vectors (d = 34: vectors plus a tail at any
// width; values of 68, four vectors at a time plus a tail at 8 and 16 lanes)
// over a cache of two blocks with a ragged end: simd's decode loops for a few query rows (steps of
// 1 and 2 tokens, r = 2; both maps' P·V in one pass over V) and its products
// for more (a step of 3), in every type.
struct wide_head_factory {
  template <class T, class P>
  MultiHead<T, dynamic, P> operator()() const {
    return MultiHead<T, dynamic, P>({C, 2, 1, 2, 10000.0, true, 34});
  }
};

TEST_CASE("prefill then decode over a long cache with wide heads") {
  auto check = [](auto type) {
    using T = decltype(type);
    const double e = decode_against_forward<T, policy::simd>(wide_head_factory{}, 2, 299, {1, 2, 3, 1}, 306);
    INFO(scalar_traits<T>::name << ": " << e / scalar_traits<T>::epsilon << " u");
    CHECK(e <= testing::tolerance<T>::forward);
  };
  check(float{});
  check(double{});
  check(Eigen::half{});
  check(Eigen::bfloat16{});
}

TEST_CASE("prefill then decode equals one forward: MultiHeadV2, its baseline, DecoderLayerV2") {
  for (const auto& make : {multihead_v2_factory{}, multihead_v2_factory{3, 2}, multihead_v2_factory{4, 2, false}}) {
    const std::string label = "MultiHeadV2 h=" + std::to_string(make.heads) + " g=" + std::to_string(make.kv_heads) +
                              (make.differential ? "" : " baseline");
    check_decoding<double, policy::reference>(label, make, 1);
    check_decoding<float>(label, make, 1);
    check_decoding<Eigen::bfloat16>(label, make, 1);
  }
  check_decoding<double, policy::reference>("DecoderLayerV2", decoder_v2_factory{}, 1);
  check_decoding<float>("DecoderLayerV2", decoder_v2_factory{}, 1);
  // The cache of a standard transformer with g groups: g (D + D) values per token, whatever h is.
  const auto v2 = multihead_v2_factory{3, 2}.operator()<float, policy::simd>();
  CHECK(v2.make_cache(1, 8).bytes_per_token() == 2 * (D + D) * sizeof(float));
}

TEST_CASE("decoding past 256 cached keys (several key blocks per sequence)") {
  // The simd kernel splits the cache into blocks of 256 keys and combines them.
  const std::vector<index_t> steps{1, 4, 1};
  const double e = decode_against_forward<float, policy::simd>(multihead_factory{}, 2, 600, steps, 606);
  INFO("simd float: " << e / scalar_traits<float>::epsilon << " u");
  CHECK(e <= testing::tolerance<float>::forward);
}

TEST_CASE("a cache filled to capacity, then the error when it overflows") {
  auto [oracle, module] = oracle_and_candidate<double, policy::simd>(multihead_factory{}, 3);
  auto x = test_support::random_tensor<oracle_t, 3>({2, 8, C}, 4);
  auto cache = module.make_cache(2, 8);
  Tensor<double, 3> y0({2, 6, C}), y1({2, 2, C});
  module.prefill(test_support::token_range<double>(x, 0, 6), cache, y0.view());
  module.decode(test_support::token_range<double>(x, 6, 8), cache, y1.view());  // exactly full
  CHECK(cache.length(0) == 8);
  CHECK(cache.length(1) == 8);
  Tensor<oracle_t, 3> full(x.shape());
  oracle.forward(x, full.view());
  CHECK(part_difference(y1, full, 6) <= testing::tolerance<double>::forward);

  const auto keys_before = Tensor<double, 5>(cache.keys().shape());
  Tensor<double, 3> one({2, 1, C}), y_one({2, 1, C});
  y_one(0, 0, 0) = 42;
  test_support::expect_input_error([&] { module.decode(one, cache, y_one.view()); }, "MultiHead::decode", "cache",
                                   "room for 1 more tokens (capacity 8)", "sequence 0 holding 8");
  CHECK(cache.length(0) == 8);
  CHECK(y_one(0, 0, 0) == 42);
  // A prompt longer than the capacity: refused before the cache restarts.
  Tensor<double, 3> long_prompt({2, 9, C}), y_long({2, 9, C});
  test_support::expect_input_error([&] { module.prefill(long_prompt, cache, y_long.view()); }, "MultiHead::prefill",
                                   "cache", "a capacity of at least the prompt's 9 tokens", "capacity 8");
  CHECK(cache.length(1) == 8);
}

TEST_CASE("a cache's stored regions: each sequence's tokens of each tensor, what decoding reads") {
  const auto module = multihead_factory{}.operator()<float, policy::simd>();
  for (const auto storage : {inference_dtype::same, inference_dtype::int8}) {
    auto cache = module.make_cache(2, 8, storage);
    const auto& s = cache.shape();
    for (const index_t tokens : {3, 5}) {  // sequence 0 holds 3, sequence 1 holds 5
      const auto k = test_support::random_tensor<float, 5>({1, tokens, s.kv_heads, s.maps, s.head_dim}, 1);
      const auto v = test_support::random_tensor<float, 4>({1, tokens, s.kv_heads, s.value_dim}, 2);
      cache.append(tokens == 3 ? 0 : 1, k.const_view(), v.const_view());
    }
    const auto regions = cache.stored_regions();
    const std::size_t tensors = storage == inference_dtype::int8 ? 4 : 2;  // int8: keys, key steps, values, value steps
    REQUIRE(regions.size() == 2 * tensors);
    std::size_t total = 0;
    for (const auto& region : regions) total += region.size();
    CHECK(total == (3 + 5) * cache.bytes_per_token());
    for (std::size_t t = 0; t < tensors; ++t)  // sequence 1's rows start at its capacity's first row
      CHECK(regions[2 * t + 1].size() * 3 == regions[2 * t].size() * 5);
    if (storage == inference_dtype::same) {
      CHECK(regions[0].data() == reinterpret_cast<const std::byte*>(cache.keys().data()));
      CHECK(regions[1].data() == reinterpret_cast<const std::byte*>(cache.keys()[1].data()));
      CHECK(regions[3].data() == reinterpret_cast<const std::byte*>(cache.values()[1].data()));
    }
    cache.reset();
    for (const auto& region : cache.stored_regions()) CHECK(region.empty());
  }
}

TEST_CASE("packed prompts of different lengths, then decoding, equal each sequence on its own") {
  // Three prompts of 3, 7 and 1 tokens packed as [1, 11, C], then three
  // decode steps for all three at once; each against its own full forward.
  auto [oracle, module] = oracle_and_candidate<float, policy::simd>(decoder_factory{}, 5);
  const std::vector<index_t> prompt{3, 7, 1}, offsets{0, 3, 10, 11};
  const index_t steps = 3, B = 3;
  std::vector<Tensor<oracle_t, 3>> sequences, expected;
  for (index_t b = 0; b < B; ++b) {
    sequences.push_back(test_support::random_tensor<oracle_t, 3>({1, prompt[b] + steps, C}, 20 + b));
    expected.emplace_back(sequences.back().shape());
    oracle.forward(sequences.back(), expected.back().view());
  }
  Tensor<float, 3> packed({1, 11, C}), y_packed({1, 11, C});
  for (index_t b = 0; b < B; ++b)
    for (index_t n = 0; n < prompt[b]; ++n)
      for (index_t c = 0; c < C; ++c) packed(0, offsets[b] + n, c) = static_cast<float>(sequences[b](0, n, c));
  auto cache = module.make_cache(B, 16);
  module.prefill(packed, cache, y_packed.view(), offsets);
  const double bar = testing::tolerance<float>::forward;
  for (index_t b = 0; b < B; ++b) {
    Tensor<float, 3> part({1, prompt[b], C});
    for (index_t n = 0; n < prompt[b]; ++n)
      for (index_t c = 0; c < C; ++c) part(0, n, c) = y_packed(0, offsets[b] + n, c);
    CHECK(part_difference(part, expected[b], 0) <= bar);
    CHECK(cache.length(b) == prompt[b]);
  }
  for (index_t step = 0; step < steps; ++step) {
    Tensor<float, 3> x({B, 1, C}), y({B, 1, C});
    for (index_t b = 0; b < B; ++b)
      for (index_t c = 0; c < C; ++c) x(b, 0, c) = static_cast<float>(sequences[b](0, prompt[b] + step, c));
    module.decode(x, cache, y.view());
    for (index_t b = 0; b < B; ++b) {
      Tensor<float, 3> row({1, 1, C});
      for (index_t c = 0; c < C; ++c) row(0, 0, c) = y(b, 0, c);
      CHECK(part_difference(row, expected[b], prompt[b] + step) <= bar);
    }
  }
}

namespace {
// Forward and backward of a packed batch against each sequence on its own
// (gradients of the weights summed over the sequences). Returns the worst
// normwise difference over the output, the input gradient and every weight gradient.
template <class T, class P, class Make>
double packed_against_separate(Make make, const std::vector<index_t>& offsets) {
  auto [oracle, module] = oracle_and_candidate<T, P>(make, 7);
  const index_t total = offsets.back();
  auto x = test_support::random_tensor<oracle_t, 3>({1, total, C}, 8);
  auto dy = test_support::random_tensor<oracle_t, 3>({1, total, C}, 9);
  for (auto* t : {&x, &dy})
    for (index_t i = 0; i < t->size(); ++i) t->data()[i] = test_support::round_through<oracle_t, T>(t->data()[i]);
  // The oracle: sequence by sequence, long double, reference.
  Tensor<oracle_t, 3> y_ref(x.shape()), dx_ref(x.shape());
  zero_grad(oracle);
  for (std::size_t s = 0; s + 1 < offsets.size(); ++s) {
    const index_t n0 = offsets[s], n = offsets[s + 1] - n0;
    Tensor<oracle_t, 3> xs({1, n, C}), dys({1, n, C}), ys({1, n, C}), dxs({1, n, C});
    std::copy_n(x.data() + n0 * C, n * C, xs.data());
    std::copy_n(dy.data() + n0 * C, n * C, dys.data());
    typename decltype(oracle)::saved_type saved;
    oracle.forward(xs, ys.view(), saved);
    oracle.backward(xs, dys, saved, dxs.view());
    std::copy_n(ys.data(), n * C, y_ref.data() + n0 * C);
    std::copy_n(dxs.data(), n * C, dx_ref.data() + n0 * C);
  }
  // The candidate: one packed call.
  const auto xt = test_support::convert<T>(x), dyt = test_support::convert<T>(dy);
  Tensor<T, 3> y(x.shape()), dx(x.shape());
  typename decltype(module)::saved_type saved;
  zero_grad(module);
  module.forward(xt, y.view(), saved, offsets);
  module.backward(xt, dyt, saved, dx.view());

  double scale = testing::max_abs(dx_ref.data(), dx_ref.size());
  for (const auto& g : oracle.parameters()) scale = std::max(scale, testing::max_abs(g.grad, g.size()));
  const double floor = testing::gradient_floor_fraction * scale;
  double worst = testing::normwise_difference(y.data(), y_ref.data(), y.size());
  worst = std::max(worst, testing::normwise_difference(dx.data(), dx_ref.data(), dx.size(), floor));
  auto grads = module.parameters();
  auto grads_ref = oracle.parameters();
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const double d = testing::normwise_difference(grads[i].grad, grads_ref[i].grad, grads[i].size(), floor);
    INFO(grads[i].name << ": " << d);
    worst = std::max(worst, d);
  }
  return worst;
}
}  // namespace

TEST_CASE("a packed batch equals each sequence on its own, forward and every gradient") {
  const std::vector<index_t> offsets{0, 5, 6, 13, 70};  // 5, 1, 7 and 57 tokens
  constexpr double bar = testing::tolerance<double>::backward;
  CHECK(packed_against_separate<double, policy::reference>(multihead_factory{}, offsets) <= bar);
  CHECK(packed_against_separate<double, policy::reference>(attention_factory{}, offsets) <= bar);
  CHECK(packed_against_separate<double, policy::reference>(decoder_factory{}, offsets) <= bar);
  CHECK(packed_against_separate<double, policy::reference>(multihead_v2_factory{3, 2}, offsets) <= bar);
  CHECK(packed_against_separate<double, policy::simd>(stack_factory{}, offsets) <= 2 * bar);
  CHECK(packed_against_separate<float, policy::simd>(decoder_factory{}, offsets) <= testing::tolerance<float>::backward);
  CHECK(packed_against_separate<Eigen::bfloat16, policy::simd>(baseline_factory{}, offsets) <=
        testing::tolerance<Eigen::bfloat16>::backward);
  CHECK(packed_against_separate<float, policy::simd>(decoder_v2_factory{}, offsets) <=
        testing::tolerance<float>::backward);
}

TEST_CASE("the stateless forward equals the forward that saves") {
  auto [oracle, module] = oracle_and_candidate<float, policy::simd>(stack_factory{}, 13);
  auto x = test_support::random_tensor<float, 3>({2, 9, C}, 14);
  Tensor<float, 3> y_saved(x.shape()), y_plain(x.shape());
  typename decltype(module)::saved_type saved;
  module.forward(x, y_saved.view(), saved);
  module.forward(x, y_plain.view());
  CHECK(testing::normwise_difference(y_plain.data(), y_saved.data(), y_plain.size()) == 0.0);
}

// A two-layer double LanguageModel (vocabulary 11) with FFNs of ffn_dim: the
// logits of one forward over 2 x 9 tokens, then (after `before_decoding`) a
// prefill of the first 4 and one decode step per token after, equal them.
template <class BeforeDecoding>
void check_prefill_and_decode(index_t ffn_dim, BeforeDecoding&& before_decoding) {
  using Layer = DecoderLayer<double, D, policy::simd>;
  std::vector<Layer> layers;
  for (index_t l = 0; l < 2; ++l) layers.emplace_back(DecoderLayerConfig{{C, 2, 1, l}, ffn_dim});
  LanguageModel<Layer> model({11, C}, std::move(layers));
  random_stream rng(3);
  model.reset_parameters(rng);
  Tensor<token_t, 2> tokens({2, 9});
  for (index_t i = 0; i < tokens.size(); ++i) tokens.data()[i] = static_cast<token_t>((i * 7 + 3) % 11);
  Tensor<double, 3> logits({2, 9, 11});
  model.forward(tokens, logits.view());

  before_decoding(model);
  auto cache = model.make_cache(2, 9);
  Tensor<token_t, 2> prompt({2, 4});
  for (index_t b = 0; b < 2; ++b)
    for (index_t n = 0; n < 4; ++n) prompt(b, n) = tokens(b, n);
  Tensor<double, 3> prompt_logits({2, 4, 11});
  model.prefill(prompt, cache, prompt_logits.view());
  CHECK(part_difference(prompt_logits, logits, 0) <= 1e-12);
  for (index_t n = 4; n < 9; ++n) {
    Tensor<token_t, 2> next({2, 1});
    for (index_t b = 0; b < 2; ++b) next(b, 0) = tokens(b, n);
    Tensor<double, 3> step({2, 1, 11});
    model.decode(next, cache, step.view());
    CHECK(part_difference(step, logits, n) <= 1e-12);
  }
}

TEST_CASE("LanguageModel: prefill and greedy decoding equal the forward's logits") {
  check_prefill_and_decode(32, [](auto&) {});
}

TEST_CASE("LanguageModel with decoding panels: decoding equals the forward's logits, a backward refuses") {
  // ffn_dim 2100 doubles: down_proj's rows are wider than wide_weight_row_bytes
  // (16.4 KiB), so it gets panels, which the decode steps (2 rows) read; the
  // prompt (8 rows) multiplies W.
  check_prefill_and_decode(2100, [](auto& model) { model.add_decoding_panels(); });

  using Layer = DecoderLayer<double, D, policy::simd>;
  Layer layer(DecoderLayerConfig{{C, 2, 1, 0}, 2100});
  layer.add_decoding_panels();
  const auto x = test_support::random_tensor<double, 3>({1, 3, C}, 6);
  Tensor<double, 3> y(x.shape()), dx(x.shape());
  Layer::saved_type saved;
  layer.forward(x, y.view(), saved);
  test_support::expect_input_error([&] { layer.backward(x, y, saved, dx.view()); }, "DecoderLayer::backward", "weights",
                                   "W alone", "W and its decoding panels");
  for (const auto& p : layer.parameters())
    CHECK(std::all_of(p.grad, p.grad + p.size(), [](double g) { return g == 0; }));
}

TEST_CASE("bfloat16 decoding panels where the product widens x to float") {
  // x of 4100 values is 16.4 KB as float (past wide_weight_row_bytes) and
  // 8.2 KB as bfloat16: panels on the converting product (forced, or a CPU
  // without AVX512_BF16), none on the dot-product instruction, which
  // reads x as it lies; x of 4000 floats (16.0 KB) gets none. require_trainable
  // tells whether a Linear has them. A decoding step gives the bits of the
  // product it should read (the panels' or W's) and lands within bfloat16's
  // forward bar of the reference.
  using bf16 = Eigen::bfloat16;
  const auto x = test_support::random_tensor<bf16, 3>({1, 1, 4100}, 8);
  for (const auto product : {policy::bf16_product::converting, policy::bf16_product::dot_instructions}) {
    policy::simd p;
    p.bf16_products = product;
    const bool widens = p.bf16_product_used() == policy::bf16_product::converting;
    Linear<bf16, policy::simd> wide(4100, 40, p), narrow(4000, 40, p);
    Linear<bf16> oracle(4100, 40);
    for (auto* l : {&wide, &narrow}) l->add_decoding_panels();
    random_stream a(5), b(5);
    wide.reset_parameters(a);
    oracle.reset_parameters(b);
    wide.add_decoding_panels();  // again, after the new weights
    INFO("bf16_products=" << static_cast<int>(product) << " widens=" << widens);
    CHECK_NOTHROW(narrow.require_trainable("test"));
    if (widens)
      CHECK_THROWS_AS(wide.require_trainable("test"), input_error);
    else
      CHECK_NOTHROW(wide.require_trainable("test"));
    Tensor<bf16, 3> y({1, 1, 40}), y_oracle({1, 1, 40});
    typename Linear<bf16, policy::simd>::saved_type s;
    typename Linear<bf16>::saved_type s_oracle;
    wide.forward(x, y.view(), s);
    oracle.forward(x, y_oracle.view(), s_oracle);
    CHECK(testing::normwise_difference(y.data(), y_oracle.data(), y.size()) <= testing::tolerance<bf16>::forward);
    const auto w = wide.parameters().front().value;
    const TensorView<const bf16, 2> w_view(w, {40, 4100});
    Tensor<bf16, 2> y_read({1, 40});
    const auto x_rows = x.const_view().reshape<2>({1, 4100});
    if (widens)
      linear_forward(p, x_rows, decoding_panels<bf16>(w, 40, 4100), y_read.view());
    else
      linear_forward(p, x_rows, w_view, y_read.view());
    CHECK(testing::normwise_difference(y.data(), y_read.data(), y.size()) == 0.0);
  }
}

TEST_CASE("inference bad input: documented errors, nothing changed") {
  MultiHead<float, D, policy::simd> module({C, 2});
  MultiHead<float, D, policy::simd> other({C, 2, 1});
  Tensor<float, 3> x({2, 1, C}), y({2, 1, C});
  y(1, 0, 3) = 7;
  auto cache = module.make_cache(2, 4);
  test_support::expect_input_error([&] { module.decode(x, cache, y.view()); }, "MultiHead::decode", "cache",
                                   "a cache a prefill has started", "sequence 0 empty");
  CHECK(y(1, 0, 3) == 7);
  auto foreign = other.make_cache(2, 4);
  test_support::expect_input_error([&] { module.prefill(x, foreign, y.view()); }, "MultiHead::prefill", "cache",
                                   "a cache made by this module (G = 2", "G = 1");
  auto small = module.make_cache(3, 4);
  test_support::expect_input_error([&] { module.prefill(x, small, y.view()); }, "MultiHead::prefill", "cache",
                                   "a cache of 2 sequences", "3 sequences");
  CHECK(y(1, 0, 3) == 7);

  // Offsets: not increasing, a total that disagrees with the tensor, a first offset not 0, B != 1.
  Tensor<float, 3> packed({1, 6, C}), y_packed({1, 6, C});
  y_packed(0, 5, 0) = 9;
  const std::vector<index_t> not_increasing{0, 4, 4, 6}, short_total{0, 2, 5}, late_start{1, 6};
  test_support::expect_input_error([&] { module.forward(packed, y_packed.view(), not_increasing); },
                                   "MultiHead::forward", "cu_seqlens", "strictly increasing", "4 then 4 at index 2");
  test_support::expect_input_error([&] { module.forward(packed, y_packed.view(), short_total); }, "MultiHead::forward",
                                   "cu_seqlens", "a last offset equal to the packed token count 6", "5");
  test_support::expect_input_error([&] { module.forward(packed, y_packed.view(), late_start); }, "MultiHead::forward",
                                   "cu_seqlens", "a first offset of 0", "1");
  Tensor<float, 3> two_rows({2, 3, C}), y_two({2, 3, C});
  const std::vector<index_t> offsets{0, 3};
  test_support::expect_input_error([&] { module.forward(two_rows, y_two.view(), offsets); }, "MultiHead::forward", "x",
                                   "a packed batch [1, total, ...]", "[2, 3, 16]");
  auto cache3 = module.make_cache(3, 8);
  test_support::expect_input_error([&] { module.prefill(packed, cache3, y_packed.view(), short_total); },
                                   "MultiHead::prefill", "cu_seqlens", "a last offset", "5");
  CHECK(y_packed(0, 5, 0) == 9);
  CHECK(cache3.length(0) == 0);
}

TEST_CASE("attention_decode: simd's kernels at a real model's head sizes, in every type, against the reference in double") {
  // d = 134: runs of whole vectors (bfloat16's in pairs) and a tail at 8 and
  // 16 lanes, dv = 2d; G = 4 groups of r = 2 heads; T = 1 and 2 new tokens (2
  // and 4 query rows a group: the loops over the cache in place) and 3 (6:
  // Eigen's products). Three sequences, one of 300 keys (several blocks), the
  // cache's rows past each length NaN.
  auto check = [](auto type) {
    using T = decltype(type);
    using A = accum_t<T>;
    const index_t B = 3, H = 8, G = 4, d = 134, S = 320;
    const std::vector<index_t> lengths{3, 300, 37};
    auto k = test_support::random_tensor<T, 5>({B, S, G, 2, d}, 2, 2.0);
    auto v = test_support::random_tensor<T, 4>({B, S, G, 2 * d}, 3);
    nan_past_lengths(k, v, lengths);
    Tensor<A, 1> lambda({1});
    lambda(0) = A(0.3);
    Tensor<double, 1> lambda_double({1});
    lambda_double(0) = 0.3;
    for (index_t new_tokens : {1, 2, 3}) {
      const auto q = test_support::random_tensor<T, 5>({B, new_tokens, H, 2, d}, 1);
      Tensor<double, 4> o_ref({B, new_tokens, H, 2 * d});
      Tensor<T, 4> o({B, new_tokens, H, 2 * d});
      attention_decode<2>(policy::reference{}, test_support::convert<double>(q).const_view(),
                          test_support::convert<double>(k).const_view(), test_support::convert<double>(v).const_view(),
                          lengths, lambda_double.const_view(), o_ref.view());
      attention_decode<2>(policy::simd{}, q.const_view(), k.const_view(), v.const_view(), lengths, lambda.const_view(),
                          o.view());
      const double e = testing::normwise_difference(o.data(), o_ref.data(), o.size());
      INFO(scalar_traits<T>::name << " T=" << new_tokens << ": " << e / scalar_traits<T>::epsilon << " u");
      CHECK(e <= testing::tolerance<T>::forward);  // false for NaN: no row past a length was read
    }
  };
  check(float{});
  check(double{});
  check(Eigen::half{});
  check(Eigen::bfloat16{});
}

TEST_CASE("attention_decode: simd equals the reference and reads nothing past a sequence's length") {
  // B = 3 sequences holding 1, 300 and 37 keys of a 320-key cache whose other
  // rows are NaN; T = 2 new tokens need lengths >= 2, so the first holds 2.
  const index_t B = 3, T = 2, H = 4, G = 2, d = 6, S = 320;
  const std::vector<index_t> lengths{2, 300, 37};
  auto q = test_support::random_tensor<float, 5>({B, T, H, 2, d}, 1);
  auto k = test_support::random_tensor<float, 5>({B, S, G, 2, d}, 2, 2.0);
  auto v = test_support::random_tensor<float, 4>({B, S, G, 2 * d}, 3);
  nan_past_lengths(k, v, lengths);
  Tensor<float, 1> lambda({1});
  lambda(0) = 0.3f;
  Tensor<float, 4> o_ref({B, T, H, 2 * d}), o({B, T, H, 2 * d});
  attention_decode<2>(policy::reference{}, q.const_view(), k.const_view(), v.const_view(), lengths, lambda.const_view(),
                      o_ref.view());
  attention_decode<2>(policy::simd{}, q.const_view(), k.const_view(), v.const_view(), lengths, lambda.const_view(),
                      o.view());
  auto finite = [](const Tensor<float, 4>& t) { return std::all_of(t.data(), t.data() + t.size(), [](float x) { return std::isfinite(x); }); };
  CHECK(finite(o_ref));  // no NaN row was read
  CHECK(finite(o));
  CHECK(testing::normwise_difference(o.data(), o_ref.data(), o.size()) <= testing::tolerance<float>::forward);
  const std::vector<index_t> too_long{2, 321, 37};
  test_support::expect_input_error(
      [&] {
        attention_decode<2>(policy::simd{}, q.const_view(), k.const_view(), v.const_view(), too_long,
                            lambda.const_view(), o.view());
      },
      "attention_decode", "lengths", "lengths in [T, S] = [2, 320]", "321 for sequence 1");
}
