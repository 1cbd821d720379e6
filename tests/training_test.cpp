// What training needs on top of the layers: the embedding, softmax
// cross-entropy with ignored positions, the language model around a stack, the
// attention-map probe, AdamW with its schedule, and gradient clipping. Gradients
// against five-point finite differences in double (testing::gradcheck); AdamW
// against torch.optim.AdamW; losses against values computed by hand; the
// language model on policy::simd against the reference.
#include <doctest/doctest.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include <difftx/difftx.hpp>
#include <difftx/policy/simd.hpp>
#include <difftx/testing/compare.hpp>
#include <difftx/testing/tolerance.hpp>

#include "support/helpers.hpp"

using namespace difftx;
using test_support::random_tensor;
using test_support::randomise_parameters;

namespace {

constexpr double gradcheck_tolerance = 1e-6;

Tensor<token_t, 2> tokens_of(const shape_t<2>& shape, std::vector<token_t> ids) {
  Tensor<token_t, 2> t(shape);
  REQUIRE(static_cast<index_t>(ids.size()) == t.size());
  std::copy(ids.begin(), ids.end(), t.data());
  return t;
}

template <class Model>
std::vector<testing::gradcheck_variable<double>> parameter_variables(Model& model) {
  std::vector<testing::gradcheck_variable<double>> variables;
  for (auto& p : model.parameters()) variables.push_back({p.name, p.shape, p.value, p.grad});
  return variables;
}

}  // namespace

TEST_CASE("Embedding: rows by token id and a scatter-add backward with repeated ids") {
  Embedding<double> embed(5, 3);
  randomise_parameters(embed, 1);
  const auto tokens = tokens_of({2, 3}, {4, 0, 4, 2, 2, 2});
  Tensor<double, 3> y({2, 3, 3});
  Embedding<double>::saved_type saved;
  embed.forward(tokens.view(), y.view(), saved);
  const auto w = embed.parameters()[0];
  for (index_t i = 0; i < 6; ++i)
    for (index_t c = 0; c < 3; ++c) CHECK(y.data()[i * 3 + c] == w.value[tokens.data()[i] * 3 + c]);

  auto dy = random_tensor<double, 3>({2, 3, 3}, 2);
  auto loss = [&]() -> long double {
    embed.forward(tokens.view(), y.view(), saved);
    long double l = 0;
    for (index_t i = 0; i < y.size(); ++i) l += static_cast<long double>(dy.data()[i]) * y.data()[i];
    return l;
  };
  auto gradients = [&] {
    zero_grad(embed);
    embed.forward(tokens.view(), y.view(), saved);
    embed.backward(tokens.view(), dy.view(), saved);
  };
  const auto result = testing::gradcheck<double>(parameter_variables(embed), loss, gradients);
  INFO(result.report());
  CHECK(result.passed());
  // Row 1 and row 3 are never looked up: zero gradient. Row 2 gets three rows of dy.
  for (index_t c = 0; c < 3; ++c) {
    CHECK(w.grad[1 * 3 + c] == 0.0);
    CHECK(w.grad[3 * 3 + c] == 0.0);
    CHECK(w.grad[2 * 3 + c] == doctest::Approx(dy.data()[3 * 3 + c] + dy.data()[4 * 3 + c] + dy.data()[5 * 3 + c]));
  }
}

TEST_CASE("Embedding: an id outside the table is bad input and nothing is written") {
  Embedding<float> embed(4, 2);
  Tensor<float, 3> y({1, 2, 2});
  fill_constant(y.view(), 7.0);
  Embedding<float>::saved_type saved;
  for (token_t bad : {4, -1}) {
    const auto tokens = tokens_of({1, 2}, {1, bad});
    CHECK_THROWS_AS(embed.forward(tokens.view(), y.view(), saved), input_error);
    for (index_t i = 0; i < y.size(); ++i) CHECK(y.data()[i] == 7.0f);
  }
}

TEST_CASE("cross entropy: hand values with ignored positions and the mean over counted ones") {
  // Row 0: logits (1, 2, 3), target 2; row 1 ignored; row 2: logits (0, 0, 0), target 0.
  Tensor<double, 3> logits({1, 3, 3});
  const double values[] = {1, 2, 3, 5, -5, 9, 0, 0, 0};
  std::copy(std::begin(values), std::end(values), logits.data());
  const auto targets = tokens_of({1, 3}, {2, -1, 0});
  CrossEntropyLoss<double> ce;
  CrossEntropyLoss<double>::saved_type saved;
  const double row0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3.0;
  const double row2 = std::log(3.0);
  CHECK(ce.forward(logits.view(), targets.view(), saved) == doctest::Approx((row0 + row2) / 2).epsilon(1e-14));

  Tensor<double, 3> dlogits({1, 3, 3});
  ce.backward(logits.view(), targets.view(), saved, dlogits.view(), 2.0);  // dloss = 2 -> scale 2 / K = 1
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  CHECK(dlogits(0, 0, 0) == doctest::Approx(std::exp(1.0) / z));
  CHECK(dlogits(0, 0, 2) == doctest::Approx(std::exp(3.0) / z - 1));
  for (index_t v = 0; v < 3; ++v) CHECK(dlogits(0, 1, v) == 0.0);
  CHECK(dlogits(0, 2, 0) == doctest::Approx(1.0 / 3 - 1));
  CHECK(dlogits(0, 2, 1) == doctest::Approx(1.0 / 3));

  // No counted position: loss 0, gradient 0.
  const auto none = tokens_of({1, 3}, {-1, -1, -1});
  CHECK(ce.forward(logits.view(), none.view(), saved) == 0.0);
  ce.backward(logits.view(), none.view(), saved, dlogits.view());
  for (index_t i = 0; i < dlogits.size(); ++i) CHECK(dlogits.data()[i] == 0.0);

  // A target >= V is bad input.
  const auto bad = tokens_of({1, 3}, {3, 0, 0});
  CHECK_THROWS_AS(ce.forward(logits.view(), bad.view(), saved), input_error);
}

TEST_CASE("cross entropy: gradient against finite differences") {
  auto logits = random_tensor<double, 3>({2, 4, 6}, 3, 2.0);
  const auto targets = tokens_of({2, 4}, {5, -1, 0, 3, -1, 2, 2, 1});
  CrossEntropyLoss<double> ce;
  CrossEntropyLoss<double>::saved_type saved;
  Tensor<double, 3> dlogits(logits.shape());
  auto loss = [&]() -> long double { return ce.forward(logits.view(), targets.view(), saved); };
  auto gradients = [&] {
    ce.forward(logits.view(), targets.view(), saved);
    ce.backward(logits.view(), targets.view(), saved, dlogits.view());
  };
  const auto result = testing::gradcheck<double>({{"logits", {2, 4, 6}, logits.data(), dlogits.data()}}, loss, gradients);
  INFO(result.report());
  CHECK(result.passed());
}

TEST_CASE("LanguageModel: cross-entropy gradient of every parameter in both models") {
  // V = 7, C = 8, two layers; differential: 2 heads of 2 x 2, baseline: 4 heads of 2.
  const auto tokens = tokens_of({2, 5}, {0, 3, 6, 3, 1, 2, 2, 5, 4, 0});
  const auto targets = tokens_of({2, 5}, {3, -1, 3, 1, 2, -1, 5, 4, 0, 6});
  auto check_model = [&](auto model, const std::string& label, double step = 0) {
    using Model = decltype(model);
    randomise_parameters(model, 11);
    CrossEntropyLoss<double> ce;
    typename CrossEntropyLoss<double>::saved_type ce_saved;
    typename Model::saved_type saved;
    Tensor<double, 3> logits(model.output_shape(tokens.shape())), dlogits(logits.shape());
    auto loss = [&]() -> long double {
      model.forward(tokens.view(), logits.view(), saved);
      return ce.forward(logits.view(), targets.view(), ce_saved);
    };
    auto gradients = [&] {
      zero_grad(model);
      loss();
      ce.backward(logits.view(), targets.view(), ce_saved, dlogits.view());
      model.backward(tokens.view(), dlogits.view(), saved);
    };
    testing::gradcheck_options options;
    options.max_entries_per_tensor = 12;
    options.step = step;
    const auto result = testing::gradcheck<double>(parameter_variables(model), loss, gradients, options);
    INFO(label << "\n" << result.report());
    MESSAGE(label << ": worst " << result.worst_error() << " at " << result.where());
    CHECK(result.worst_error() < gradcheck_tolerance);
    CHECK(result.passed());
  };
  std::vector<DecoderLayer<double, 2>> diff, tied;
  std::vector<BaselineLayer<double, 2>> base;
  for (index_t l = 0; l < 2; ++l) {
    diff.emplace_back(DecoderLayerConfig{{.d_model = 8, .heads = 2, .layer_index = l}, 12});
    base.emplace_back(BaselineLayerConfig{{.d_model = 8, .heads = 4}, 12});
    // As a DiffLlama checkpoint may be: linear RoPE scaling, its own subln eps, the head tied to the embedding.
    tied.emplace_back(DecoderLayerConfig{{.d_model = 8,
                                               .heads = 2,
                                               .layer_index = l,
                                               .subln_eps = 1e-2,
                                               .rope_scaling = {.type = rope_type::linear, .factor = 2.5}},
                                              12});
  }
  check_model(LanguageModel<DecoderLayer<double, 2>>({7, 8}, std::move(diff)), "LanguageModel<DecoderLayer>");
  check_model(LanguageModel<BaselineLayer<double, 2>>({7, 8}, std::move(base)), "LanguageModel<BaselineLayer>");
  check_model(LanguageModel<DecoderLayer<double, 2>>({.vocab_size = 7, .d_model = 8, .tie_word_embeddings = true},
                                                     std::move(tied)),
              "LanguageModel<DecoderLayer>, tied, rope_factor 2.5, subln_eps 1e-2",
              // A tied table's entries enter twice (the lookup and the head), so the loss's fifth derivative in
              // them is large: at the default step (eps^(1/5), 7e-4) the five-point stencil's truncation error
              // alone was 1.4e-6 relative; at 1e-4 it is 7^4 = 2400x smaller and rounding stays near 1e-12.
              1e-4);
}

TEST_CASE("LanguageModel: policy::simd in float matches the reference in double") {
  // Logits, loss and every parameter gradient of the cross-entropy, both layer
  // kinds; weights drawn in double and rounded to float for both. The model
  // chains two layers and a head, so the bars are twice a DecoderLayer's.
  const auto tokens = tokens_of({2, 9}, {0, 3, 6, 3, 1, 2, 2, 5, 4, 0, 1, 1, 6, 5, 3, 2, 4, 6});
  const auto targets = tokens_of({2, 9}, {3, -1, 3, 1, 2, -1, 5, 4, 0, 6, -1, 2, 2, 1, 0, -1, 6, 5});
  auto run = [&](auto model, std::uint64_t seed) {
    using Model = decltype(model);
    using T = typename Model::value_type;
    randomise_parameters(model, seed);
    for (auto& p : model.parameters())  // the same numbers in both types
      for (index_t i = 0; i < p.size(); ++i) p.value[i] = static_cast<T>(static_cast<float>(p.value[i]));
    CrossEntropyLoss<T, typename Model::policy_type> ce(model.policy());
    typename decltype(ce)::saved_type ce_saved;
    typename Model::saved_type saved;
    Tensor<T, 3> logits(model.output_shape(tokens.shape())), dlogits(logits.shape());
    zero_grad(model);
    model.forward(tokens.view(), logits.view(), saved);
    const double loss = ce.forward(logits.view(), targets.view(), ce_saved);
    ce.backward(logits.view(), targets.view(), ce_saved, dlogits.view());
    model.backward(tokens.view(), dlogits.view(), saved);
    std::vector<std::vector<double>> grads;
    for (auto& p : model.parameters()) grads.emplace_back(p.grad, p.grad + p.size());
    return std::tuple{std::vector<double>(logits.data(), logits.data() + logits.size()), loss, grads};
  };
  auto compare = [&](const auto& fast, const auto& exact, const std::string& label) {
    constexpr double u = scalar_traits<float>::epsilon;
    const auto& [fl, floss, fg] = fast;
    const auto& [el, eloss, eg] = exact;
    const double forward = testing::normwise_difference(fl.data(), el.data(), static_cast<index_t>(el.size()));
    double scale = 0, backward = 0;
    for (const auto& g : eg) scale = std::max(scale, testing::max_abs(g.data(), static_cast<index_t>(g.size())));
    for (std::size_t i = 0; i < eg.size(); ++i)
      backward = std::max(backward, testing::normwise_difference(fg[i].data(), eg[i].data(), static_cast<index_t>(eg[i].size()), 0.1 * scale));
    MESSAGE(label << ": logits " << forward / u << " u, gradients " << backward / u << " u");
    CHECK(forward <= 2 * testing::tolerance<float>::forward);
    CHECK(std::abs(floss - eloss) <= 2 * testing::tolerance<float>::forward * eloss);
    CHECK(backward <= 2 * testing::tolerance<float>::backward);
  };
  auto diff = [](auto policy, auto value) {
    using T = decltype(value);
    std::vector<DecoderLayer<T, 8, decltype(policy)>> layers;
    for (index_t l = 0; l < 2; ++l) layers.emplace_back(DecoderLayerConfig{{.d_model = 32, .heads = 2, .layer_index = l}, 64}, policy);
    return LanguageModel<DecoderLayer<T, 8, decltype(policy)>>({7, 32}, std::move(layers));
  };
  auto base = [](auto policy, auto value) {
    using T = decltype(value);
    std::vector<BaselineLayer<T, 8, decltype(policy)>> layers;
    for (index_t l = 0; l < 2; ++l) layers.emplace_back(BaselineLayerConfig{{.d_model = 32, .heads = 4}, 64}, policy);
    return LanguageModel<BaselineLayer<T, 8, decltype(policy)>>({7, 32}, std::move(layers));
  };
  compare(run(diff(policy::simd{}, 0.0f), 31), run(diff(policy::reference{}, 0.0), 31), "DIFF");
  compare(run(base(policy::simd{}, 0.0f), 32), run(base(policy::reference{}, 0.0), 32), "baseline");
}

TEST_CASE("LanguageModel: parameter names and layer outputs and matched parameter counts") {
  std::vector<DecoderLayer<float, 4>> diff;
  std::vector<BaselineLayer<float, 4>> base;
  for (index_t l = 0; l < 2; ++l) {
    diff.emplace_back(DecoderLayerConfig{{.d_model = 16, .heads = 2, .layer_index = l}, 32});
    base.emplace_back(BaselineLayerConfig{{.d_model = 16, .heads = 4}, 32});
  }
  LanguageModel<DecoderLayer<float, 4>> d({11, 16}, std::move(diff));
  LanguageModel<BaselineLayer<float, 4>> b({11, 16}, std::move(base));
  auto names = [](auto& m) {
    std::vector<std::string> n;
    for (const auto& p : m.parameters()) n.push_back(p.name);
    return n;
  };
  const auto dn = names(d), bn = names(b);
  CHECK(dn.front() == "embed_tokens.weight");
  CHECK(dn[1] == "layers.0.attn_norm.weight");
  CHECK(std::find(dn.begin(), dn.end(), "layers.1.attn.lambda_q1") != dn.end());
  CHECK(dn[dn.size() - 2] == "norm.weight");
  CHECK(dn.back() == "lm_head.weight");
  CHECK(std::find(bn.begin(), bn.end(), "layers.1.attn.q_proj.weight") != bn.end());
  // The differential model has h heads of 2D, the baseline 2h of D: the same
  // projections; DIFF adds 4 λ vectors of D and a subln weight of 2D per layer.
  auto count = [](auto& m) {
    index_t n = 0;
    for (const auto& p : m.parameters()) n += p.size();
    return n;
  };
  CHECK(count(d) - count(b) == 2 * (4 * 4 + 2 * 4));

  const auto tokens = tokens_of({1, 3}, {1, 2, 10});
  Tensor<float, 3> logits(d.output_shape(tokens.shape()));
  decltype(d)::saved_type saved;
  d.forward(tokens.view(), logits.view(), saved);
  decltype(d)::saved_type unfilled;
  CHECK_THROWS_AS(d.backward(tokens.view(), logits.view(), unfilled), input_error);
  CHECK(&d.layer_output(saved, 0) == &saved.stack.inputs[0]);
  CHECK(&d.layer_output(saved, 1) == &saved.hidden);
  CHECK_THROWS_AS(d.layer_output(saved, 2), input_error);
}

TEST_CASE("attention_maps: recomputed weights reproduce the forward's output") {
  // Σ_t w[i, t] V[t] must give the saved o row: A V (Attention), (A1 − λA2) V
  // (MultiHead), (A_2i − λ_i A_2i+1) V with λ per row (MultiHeadV2, both query heads in one group).
  auto check = [](const auto& module, const auto& saved, const auto& v, const auto& o, index_t maps, bool causal) {
    const index_t B = o.extent(0), N = o.extent(1), H = o.extent(2), dv = o.extent(3), G = v.extent(2);
    std::vector<index_t> rows(static_cast<std::size_t>(N));
    std::iota(rows.begin(), rows.end(), 0);
    for (index_t b = 0; b < B; ++b) {
      const auto m = attention_maps(module, saved, b, rows);
      CHECK(m.maps == maps);
      for (index_t i = 0; i < N; ++i)
        for (index_t h = 0; h < H; ++h) {
          double row_sum = 0;
          for (index_t t = 0; t < N; ++t) row_sum += m.weights(i, h, t);
          CHECK(row_sum == doctest::Approx(1.0 - m.lambdas(i, h)).epsilon(1e-12));
          if (causal)
            for (index_t t = i + 1; t < N; ++t) CHECK(m.weights(i, h, t) == 0.0);
          for (index_t c = 0; c < dv; ++c) {
            double acc = 0;
            for (index_t t = 0; t < N; ++t) acc += m.weights(i, h, t) * v(b, t, h / (H / G), c);
            CHECK(acc == doctest::Approx(o(b, i, h, c)).epsilon(1e-12));
          }
        }
    }
  };
  auto x = random_tensor<double, 3>({2, 6, 16}, 21);
  Tensor<double, 3> y(x.shape());
  for (bool causal : {true, false}) {
    MultiHead<double, 4> mh({.d_model = 16, .heads = 2, .kv_heads = 1, .layer_index = 3, .causal = causal});
    randomise_parameters(mh, 22);
    MultiHead<double, 4>::saved_type ms;
    mh.forward(x.view(), y.view(), ms);
    check(mh, ms, ms.v, ms.o, 2, causal);
    Attention<double, 4> at({.d_model = 16, .heads = 4, .kv_heads = 2, .causal = causal});
    randomise_parameters(at, 23);
    Attention<double, 4>::saved_type as;
    at.forward(x.view(), y.view(), as);
    check(at, as, as.v, as.o, 1, causal);
    MultiHeadV2<double, 4> v2({.d_model = 16, .heads = 2, .kv_heads = 1, .causal = causal});
    randomise_parameters(v2, 24);
    MultiHeadV2<double, 4>::saved_type vs;
    v2.forward(x.view(), y.view(), vs);
    check(v2, vs, vs.v, vs.diff, 2, causal);
    const index_t rows[] = {0, 5};
    const auto m = attention_maps(v2, vs, 1, rows);
    for (index_t r = 0; r < 2; ++r)
      for (index_t h = 0; h < 2; ++h)
        CHECK(m.lambdas(r, h) == doctest::Approx(1.0 / (1.0 + std::exp(-vs.lambda_logits(1, rows[r], h)))));
  }
  MultiHead<double, 4> mh({.d_model = 16, .heads = 2});
  MultiHead<double, 4>::saved_type empty;
  const index_t row[] = {0};
  CHECK_THROWS_AS(attention_maps(mh, empty, 0, row), input_error);
}

TEST_CASE("lr_schedule: warm-up then cosine or linear decay to the floor") {
  lr_schedule s{.peak = 1.0, .warmup_steps = 4, .total_steps = 14, .decay = lr_decay::cosine, .final_ratio = 0.1};
  CHECK(s.at(0) == doctest::Approx(0.25));
  CHECK(s.at(3) == doctest::Approx(1.0));
  CHECK(s.at(4) == doctest::Approx(1.0));
  CHECK(s.at(9) == doctest::Approx(0.55));  // half way: 0.1 + 0.9 · 0.5
  CHECK(s.at(14) == doctest::Approx(0.1));
  CHECK(s.at(100) == doctest::Approx(0.1));
  s.decay = lr_decay::linear;
  CHECK(s.at(6) == doctest::Approx(1.0 - 0.9 * 0.2));
  s.decay = lr_decay::constant;
  CHECK(s.at(10) == doctest::Approx(1.0));
}

TEST_CASE("AdamW: three steps match torch.optim.AdamW") {
  // Values from torch 1.13, float64: a matrix with weight decay 0.1 and a
  // vector without, betas (0.9, 0.98), eps 1e-8, learning rates 0.01, 0.01,
  // 0.0055 (warm-up 1, cosine to 10% at step 3).
  Parameter<double, 2> w({2, 2}, host_memory());
  Parameter<double, 1> b({2}, host_memory());
  const double w0[] = {0.5, -1.0, 2.0, 0.25}, b0[] = {0.1, -0.3};
  std::copy(std::begin(w0), std::end(w0), w.value.data());
  std::copy(std::begin(b0), std::end(b0), b.value.data());
  AdamW<double> opt({w.ref("w"), b.ref("b")},
                    {{.peak = 0.01, .warmup_steps = 1, .total_steps = 3, .decay = lr_decay::cosine, .final_ratio = 0.1},
                     0.9, 0.98, 1e-8, 0.1});
  CHECK(opt.decays(0));
  CHECK_FALSE(opt.decays(1));
  const double gw[3][4] = {{0.1, -0.2, 0.3, 0.0}, {-0.05, 0.4, 0.1, -0.3}, {0.2, 0.2, -0.1, 0.05}};
  const double gb[3][2] = {{0.5, -0.5}, {0.2, 0.1}, {-0.4, 0.3}};
  const double want_w[3][4] = {{0.4895000009999999, -0.9890000004999999, 1.9880000003333334, 0.24975},
                               {0.4863394242023601, -0.9916615395141335, 1.9772677022286556, 0.2569061692734054},
                               {0.4824721114133017, -0.9939720469459998, 1.9736923982030443, 0.25930710543943647}};
  const double want_b[3][2] = {{0.0900000002, -0.2900000002},
                               {0.08098283742758249, -0.2848669331618397},
                               {0.08001146063997568, -0.2847773941556724}};
  const double want_lr[3] = {0.01, 0.01, 0.0055};
  for (int s = 0; s < 3; ++s) {
    CHECK(opt.learning_rate() == doctest::Approx(want_lr[s]).epsilon(1e-15));
    std::copy(std::begin(gw[s]), std::end(gw[s]), w.grad.data());
    std::copy(std::begin(gb[s]), std::end(gb[s]), b.grad.data());
    opt.step();
    for (int i = 0; i < 4; ++i) CHECK(w.value.data()[i] == doctest::Approx(want_w[s][i]).epsilon(1e-13));
    for (int i = 0; i < 2; ++i) CHECK(b.value.data()[i] == doctest::Approx(want_b[s][i]).epsilon(1e-13));
  }
  CHECK(opt.steps_taken() == 3);
  AdamWConfig bad;
  bad.beta2 = 1.0;
  CHECK_THROWS_AS(AdamW<double>({w.ref("w")}, bad), input_error);
}

TEST_CASE("clip_grad_norm: the global norm and scaling only above the bound") {
  Parameter<double, 1> a({2}, host_memory()), c({1}, host_memory());
  a.grad(0) = 3;
  a.grad(1) = 0;
  c.grad(0) = 4;
  const std::vector<parameter_ref<double>> ps{a.ref("a"), c.ref("c")};
  CHECK(clip_grad_norm(ps, 10.0) == doctest::Approx(5.0));
  CHECK(a.grad(0) == 3.0);  // below the bound: untouched
  CHECK(clip_grad_norm(ps, 1.0) == doctest::Approx(5.0));
  CHECK(a.grad(0) == doctest::Approx(3.0 / (5.0 + 1e-6)));
  CHECK(c.grad(0) == doctest::Approx(4.0 / (5.0 + 1e-6)));
  CHECK(clip_grad_norm(ps, 0.0) == doctest::Approx(1.0).epsilon(1e-6));  // measures only
}
