// Every module's backward against central finite differences, in double, for
// its input and every parameter: N = 1, odd N, B > 1, grouped heads, causal and
// not, layer index 0 and 5. The bar is a worst error below 1e-6 (the error is
// defined in difftx/testing/gradcheck.hpp; the stencil's own error is ~1e-10).
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include <difftx/difftx.hpp>

#include "support/dual.hpp"
#include "support/helpers.hpp"

using namespace difftx;
using test_support::random_tensor;
using test_support::randomise_parameters;

namespace {

constexpr double gradcheck_tolerance = 1e-6;

struct attn_case {
  index_t batch, seq, heads, kv_heads, layer_index;
  bool causal;
};
// N = 1, odd N, B > 1, grouped heads (h = 4, g = 2), non-causal, layer 0 and 5.
const attn_case attention_cases[] = {
    {2, 5, 2, 2, 0, true},   // B > 1, odd N
    {1, 1, 2, 1, 5, true},   // N = 1, grouped (r = 2)
    {1, 7, 4, 2, 5, true},   // grouped h = 4, g = 2
    {2, 6, 4, 2, 0, false},  // grouped, non-causal, B > 1
    {1, 7, 4, 4, 5, false},  // non-causal, odd N
};

std::string describe(const attn_case& c) {
  return "B=" + std::to_string(c.batch) + " N=" + std::to_string(c.seq) + " h=" + std::to_string(c.heads) +
         " g=" + std::to_string(c.kv_heads) + " l=" + std::to_string(c.layer_index) + (c.causal ? " causal" : " non-causal");
}

template <class Module>
void check_module(Module& module, const shape_t<3>& input_shape, const std::string& label, std::uint64_t seed) {
  randomise_parameters(module, seed);
  auto x = random_tensor<double, 3>(input_shape, seed + 1);
  const auto result = testing::gradcheck(module, x.view());
  INFO(label << "\n" << result.report());
  MESSAGE(label << ": worst " << result.worst_error() << " at " << result.where());
  CHECK(result.worst_error() < gradcheck_tolerance);
}

}  // namespace

TEST_CASE("gradcheck: Linear") {
  Linear<double> linear(6, 4);
  check_module(linear, {2, 3, 6}, "Linear 6->4 B=2 N=3", 1);
}

TEST_CASE("gradcheck: RMSNorm") {
  for (auto shape : {shape_t<3>{2, 5, 8}, shape_t<3>{1, 1, 8}, shape_t<3>{3, 7, 5}}) {
    RMSNorm<double> norm(shape[2]);
    check_module(norm, shape, "RMSNorm " + shape_string(shape), 2);
  }
  RMSNorm<double> scaled(6, 1e-5, 0.37);
  check_module(scaled, {2, 3, 6}, "RMSNorm with output scale", 3);
}

TEST_CASE("gradcheck: SwiGLU") {
  for (auto shape : {shape_t<3>{2, 5, 8}, shape_t<3>{1, 1, 8}, shape_t<3>{1, 7, 8}}) {
    SwiGLU<double> ffn(8, 12);
    check_module(ffn, shape, "SwiGLU C=8 F=12 " + shape_string(shape), 4);
  }
}

TEST_CASE("gradcheck: DiffAttn (inputs q, k, v and the four lambda vectors)") {
  constexpr index_t D = 4;
  for (const auto& c : attention_cases) {
    DiffAttn<double, D> attn({c.heads, c.kv_heads, c.layer_index, c.causal});
    randomise_parameters(attn, 5);
    const index_t B = c.batch, N = c.seq;
    auto q = random_tensor<double, 5>(attn.q_shape(B, N), 6);
    auto k = random_tensor<double, 5>(attn.k_shape(B, N), 7);
    auto v = random_tensor<double, 4>(attn.v_shape(B, N), 8);
    auto d_o = random_tensor<double, 4>(attn.output_shape(B, N), 9);
    Tensor<double, 4> o(attn.output_shape(B, N));
    Tensor<double, 5> dq(q.shape()), dk(k.shape());
    Tensor<double, 4> dv(v.shape());
    DiffAttn<double, D>::saved_type saved;

    auto loss = [&]() -> long double {
      attn.forward(q.view(), k.view(), v.view(), o.view(), saved);
      long double l = 0;
      for (index_t i = 0; i < o.size(); ++i) l += static_cast<long double>(d_o.data()[i]) * o.data()[i];
      return l;
    };
    auto gradients = [&]() {
      zero_grad(attn);
      attn.forward(q.view(), k.view(), v.view(), o.view(), saved);
      attn.backward(q.view(), k.view(), v.view(), o.view(), d_o.view(), saved, dq.view(), dk.view(), dv.view());
    };
    auto dims = [](const auto& t) { return std::vector<index_t>(t.shape().begin(), t.shape().end()); };
    std::vector<testing::gradcheck_variable<double>> variables{
        {"q", dims(q), q.data(), dq.data()}, {"k", dims(k), k.data(), dk.data()}, {"v", dims(v), v.data(), dv.data()}};
    for (auto& p : attn.parameters()) variables.push_back({p.name, p.shape, p.value, p.grad});
    const auto result = testing::gradcheck<double>(variables, loss, gradients);
    INFO(describe(c) << "\n" << result.report());
    MESSAGE("DiffAttn " << describe(c) << ": worst " << result.worst_error() << " at " << result.where());
    CHECK(result.worst_error() < gradcheck_tolerance);
  }
}

TEST_CASE("gradcheck: the attention op with M != N keys and a lambda per head (q, k, v, lambda)") {
  // The queries the last N of M positions (causal), fewer keys than queries (not causal), grouped heads.
  struct op_case {
    index_t B, N, M, H, G;
    bool causal;
  };
  for (const auto& c : {op_case{2, 3, 7, 4, 2, true}, op_case{1, 5, 5, 2, 1, true}, op_case{1, 6, 4, 2, 2, false}}) {
    const index_t d = 4, dv = 6;
    auto q = random_tensor<double, 5>({c.B, c.N, c.H, 2, d}, 11);
    auto k = random_tensor<double, 5>({c.B, c.M, c.G, 2, d}, 12);
    auto v = random_tensor<double, 4>({c.B, c.M, c.G, dv}, 13);
    auto lambda = random_tensor<double, 1>({c.H}, 14);
    auto d_o = random_tensor<double, 4>({c.B, c.N, c.H, dv}, 15);
    Tensor<double, 4> o(d_o.shape()), o2(d_o.shape());
    Tensor<double, 4> lse({c.B, c.H, 2, c.N});
    Tensor<double, 5> dq(q.shape()), dk(k.shape());
    Tensor<double, 4> dv_grad(v.shape());
    Tensor<double, 1> dlambda(lambda.shape());
    const policy::reference p;
    auto forward = [&] {
      attention_forward<2>(p, q.const_view(), k.const_view(), v.const_view(), lambda.const_view(), c.causal, o.view(),
                           o2.view(), lse.view());
    };
    auto loss = [&]() -> long double {
      forward();
      long double l = 0;
      for (index_t i = 0; i < o.size(); ++i) l += static_cast<long double>(d_o.data()[i]) * o.data()[i];
      return l;
    };
    auto gradients = [&]() {
      forward();
      attention_backward<2>(p, q.const_view(), k.const_view(), v.const_view(), lambda.const_view(), c.causal,
                            o.const_view(), o2.const_view(), lse.const_view(), d_o.const_view(), dq.view(), dk.view(),
                            dv_grad.view(), dlambda.view());
    };
    auto dims = [](const auto& t) { return std::vector<index_t>(t.shape().begin(), t.shape().end()); };
    std::vector<testing::gradcheck_variable<double>> variables{{"q", dims(q), q.data(), dq.data()},
                                                               {"k", dims(k), k.data(), dk.data()},
                                                               {"v", dims(v), v.data(), dv_grad.data()},
                                                               {"lambda", dims(lambda), lambda.data(), dlambda.data()}};
    const auto result = testing::gradcheck<double>(variables, loss, gradients);
    const std::string label = "attention op B=" + std::to_string(c.B) + " N=" + std::to_string(c.N) +
                              " M=" + std::to_string(c.M) + " H=" + std::to_string(c.H) + " G=" + std::to_string(c.G) +
                              (c.causal ? " causal" : " non-causal");
    INFO(label << "\n" << result.report());
    MESSAGE(label << ": worst " << result.worst_error() << " at " << result.where());
    CHECK(result.worst_error() < gradcheck_tolerance);
  }
}

TEST_CASE("gradcheck: MultiHead") {
  // llama3 RoPE with a short original context: of the two pairs at D = 4 one is blended, one divided.
  const rope_scaling llama3{.type = rope_type::llama3, .factor = 8.0, .high_freq_factor = 16.0,
                            .original_max_positions = 64.0};
  for (const auto& c : attention_cases) {
    MultiHead<double, 4> mh({.d_model = 12, .heads = c.heads, .kv_heads = c.kv_heads, .layer_index = c.layer_index,
                             .rope_theta = 10000.0, .causal = c.causal, .rope_scaling = llama3});
    check_module(mh, {c.batch, c.seq, 12}, "MultiHead C=12 D=4 " + describe(c), 10);
  }
}

namespace {
// MultiHead rotating by a caller's rope_table, seen as testing::gradcheck sees a module.
struct multihead_with_table {
  using value_type = double;
  using saved_type = MultiHead<double, 4>::saved_type;
  MultiHead<double, 4>& module;
  MultiHead<double, 4>::rope_table_type table;
  void forward(cview<double, 3> x, TensorView<double, 3> y, saved_type& s) const { module.forward(x, y, s, {}, table); }
  void backward(cview<double, 3> x, cview<double, 3> dy, const saved_type& s, TensorView<double, 3> dx) {
    module.backward(x, dy, s, dx, table);
  }
  std::vector<parameter_ref<double>> parameters() { return module.parameters(); }
  const policy::reference& policy() const { return module.policy(); }
  shape_t<3> output_shape(const shape_t<3>& input) const { return input; }
};
}  // namespace

TEST_CASE("gradcheck: MultiHead with a caller's rope table") {
  // Entries drawn at random, so neither unit pairs nor a theta's angles: the
  // backward must transpose exactly what the forward applied. More rows than positions.
  const auto cos = random_tensor<double, 2>({9, 2}, 21), sin = random_tensor<double, 2>({9, 2}, 22);
  for (const auto& c : {attention_cases[0], attention_cases[2], attention_cases[3]}) {
    MultiHead<double, 4> mh({.d_model = 12, .heads = c.heads, .kv_heads = c.kv_heads, .layer_index = c.layer_index,
                             .causal = c.causal});
    multihead_with_table adapter{mh, {cos.const_view(), sin.const_view()}};
    check_module(adapter, {c.batch, c.seq, 12}, "MultiHead with a rope table, C=12 D=4 " + describe(c), 23);
  }
}

TEST_CASE("gradcheck: Attention (baseline)") {
  for (const auto& c : attention_cases) {
    Attention<double, 4> attn({.d_model = 12, .heads = c.heads, .kv_heads = c.kv_heads, .rope_theta = 500.0,
                               .causal = c.causal});
    check_module(attn, {c.batch, c.seq, 12}, "Attention C=12 D=4 " + describe(c), 11);
  }
}

TEST_CASE("gradcheck: DecoderLayer") {
  for (const auto& c : attention_cases) {
    DecoderLayer<double, 4> layer({{.d_model = 16, .heads = c.heads, .kv_heads = c.kv_heads,
                                    .layer_index = c.layer_index, .rope_theta = 10000.0, .causal = c.causal},
                                   24});
    check_module(layer, {c.batch, c.seq, 16}, "DecoderLayer C=16 F=24 D=4 " + describe(c), 12);
  }
}

TEST_CASE("gradcheck: MultiHeadV2 and DecoderLayerV2 (lambda_proj through the sigmoid)") {
  // h = c.heads output heads (2h query heads), g = c.kv_heads. The lambda logits
  // x W_lambda^T have a standard deviation ~1.5, so the sigmoid is exercised off its linear middle.
  for (const auto& c : attention_cases) {
    MultiHeadV2<double, 4> mh(
        {.d_model = 12, .heads = c.heads, .kv_heads = c.kv_heads, .rope_theta = 500.0, .causal = c.causal});
    check_module(mh, {c.batch, c.seq, 12}, "MultiHeadV2 C=12 D=4 " + describe(c), 13);
  }
  // g = 2 divides the 6 query heads but not h = 3: the pair of output head 1 (query heads 2, 3) reads both groups.
  MultiHeadV2<double, dynamic> straddling({.d_model = 12, .heads = 3, .kv_heads = 2, .head_dim = 6});
  check_module(straddling, {2, 5, 12}, "MultiHeadV2 C=12 D=6 h=3 g=2", 14);
  MultiHeadV2<double, 4> baseline({.d_model = 12, .heads = 4, .kv_heads = 2, .differential = false});
  check_module(baseline, {2, 5, 12}, "MultiHeadV2 baseline (differential off) C=12 D=4 h=4 g=2", 15);
  for (const auto& c : {attention_cases[0], attention_cases[3]}) {
    DecoderLayerV2<double, 4> layer(
        {{.d_model = 16, .heads = c.heads, .kv_heads = c.kv_heads, .causal = c.causal}, 24});
    check_module(layer, {c.batch, c.seq, 16}, "DecoderLayerV2 C=16 F=24 D=4 " + describe(c), 16);
  }
}

TEST_CASE("gradcheck: long double") {
  // The same check one precision up: the stencil's rounding error shrinks
  // ~2000x, so the bar drops to 1e-9.
  DecoderLayer<long double, 4> layer({{.d_model = 8, .heads = 2, .kv_heads = 1, .layer_index = 1}, 16});
  randomise_parameters(layer, 13);
  auto x = random_tensor<long double, 3>({1, 3, 8}, 14);
  testing::gradcheck_options options;
  options.tolerance = 1e-9;
  const auto result = testing::gradcheck(layer, x.view(), options);
  INFO(result.report());
  MESSAGE("DecoderLayer<long double>: worst " << result.worst_error() << " at " << result.where());
  CHECK(result.passed());
}

namespace {

using dual_test::Dual;

const MultiHeadConfig dual_config{.d_model = 12, .heads = 2, .kv_heads = 1, .layer_index = 5};

// A MultiHead whose backward makes out_proj's gradient 0.1% too large: the
// kind of slip gradcheck exists to catch.
template <class T>
class off_by_a_little : public MultiHead<T, 4> {
 public:
  using MultiHead<T, 4>::MultiHead;
  void backward(cview<T, 3> x, cview<T, 3> dy, const typename MultiHead<T, 4>::saved_type& saved, TensorView<T, 3> dx) {
    MultiHead<T, 4>::backward(x, dy, saved, dx);
    for (const auto& p : this->parameters())
      if (p.name == "out_proj.weight")
        for (index_t i = 0; i < p.size(); ++i)
          p.grad[i] = scalar_traits<T>::from_double(scalar_traits<T>::to_double(p.grad[i]) * (1 + 1e-3));
  }
};

}  // namespace

TEST_CASE("gradcheck: any Scalar (the tests' dual numbers)") {
  // A type that is not std::floating_point takes gradcheck's other path: shifts
  // in its accumulation type, values read through to_double. Dual's values
  // compute as double's do, so the bar is double's.
  MultiHead<Dual, 4> dual(dual_config);
  randomise_parameters(dual, 15);
  const auto x = random_tensor<Dual, 3>({2, 3, 12}, 16);
  const auto result = testing::gradcheck(dual, x.view());
  INFO(result.report());
  MESSAGE("MultiHead<Dual>: worst " << result.worst_error() << " at " << result.where());
  CHECK(result.passed());
  CHECK(result.worst_error() < gradcheck_tolerance);
  REQUIRE(result.tensors.size() == dual.parameters().size() + 1);
  CHECK(result.tensors.front().checked == x.size());  // every entry of the input
  for (const auto& t : result.tensors) CHECK_FALSE(t.all_zero);
}

TEST_CASE("gradcheck detects a wrong gradient in any Scalar") {
  off_by_a_little<Dual> broken(dual_config);
  randomise_parameters(broken, 17);
  const auto x = random_tensor<Dual, 3>({1, 4, 12}, 18);
  const auto result = testing::gradcheck(broken, x.view());
  INFO(result.report());
  CHECK_FALSE(result.passed());
  CHECK(result.worst().name == "out_proj.weight");
  CHECK(result.worst_error() == doctest::Approx(1e-3).epsilon(0.01));  // |1.001 g - g| / (1.001 |g|)
  for (const auto& t : result.tensors)
    if (t.name != "out_proj.weight") CHECK(t.worst_error < gradcheck_tolerance);
}

TEST_CASE("gradcheck detects a wrong gradient") {
  // A check that cannot fail proves nothing: corrupt one analytic entry.
  std::vector<double> value{0.3, -1.2, 0.8}, grad(3);
  auto loss = [&]() -> long double { return std::sin(value[0]) * value[1] + value[2] * value[2] * value[2]; };
  auto gradients = [&]() {
    grad = {std::cos(value[0]) * value[1], std::sin(value[0]), 3 * value[2] * value[2]};
    grad[2] *= 1.0 + 1e-4;
  };
  const auto result = testing::gradcheck<double>({{"z", {3}, value.data(), grad.data()}}, loss, gradients);
  CHECK_FALSE(result.passed());
  CHECK(result.worst().worst_index == 2);
  CHECK(result.worst_error() == doctest::Approx(1e-4).epsilon(1e-3));
}

TEST_CASE("gradcheck does not pass a vacuous check") {
  // A function whose gradients are all zero proves nothing about a backward.
  std::vector<double> value{0.3, -1.2}, grad(2);
  const auto result = testing::gradcheck<double>({{"z", {2}, value.data(), grad.data()}}, [] { return 1.0L; },
                                                 [&] { grad = {0.0, 0.0}; });
  CHECK(result.gradient_scale == 0.0);
  CHECK_FALSE(result.passed());
  CHECK(result.report().find("vacuous") != std::string::npos);
}
