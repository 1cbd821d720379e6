// Every op of include/difftx/ops/, op by op, in the spirit of llama.cpp's
// test-backend-ops: policy::simd in float, double, float16 and bfloat16
// against policy::reference in double on the same numbers (each input drawn
// once, rounded to the type, and given to both), within testing::tolerance<T>
// (the forward bar for a forward op, the backward bar for a backward one). A
// failure names the op, the policy, the number type, the shapes and the output.
// Shapes are small and ragged (sizes off the vector widths, grouped heads,
// causal and not), so the whole table runs in about a second.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <array>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <difftx/difftx.hpp>
#include <difftx/policy/simd.hpp>
#include <difftx/testing/compare.hpp>
#include <difftx/testing/tolerance.hpp>

#include "support/helpers.hpp"

using namespace difftx;

namespace {

// One result of an op, in double.
struct output {
  std::string name;
  std::vector<double> values;
};

template <class T, std::size_t R>
output result(std::string name, const Tensor<T, R>& t) {
  output out{std::move(name), std::vector<double>(static_cast<std::size_t>(t.size()))};
  for (index_t i = 0; i < t.size(); ++i) out.values[static_cast<std::size_t>(i)] = scalar_traits<T>::to_double(t.data()[i]);
  return out;
}

// An input: normal values of stddev `scale` drawn from `seed`, rounded to R
// (the type under test) and stored as S (R itself, or double for the reference).
template <class S, class R, std::size_t Rank>
Tensor<S, Rank> input(const shape_t<Rank>& shape, std::uint64_t seed, double scale = 1.0) {
  return test_support::convert<S>(test_support::random_tensor<R, Rank>(shape, seed, scale));
}

enum class bar { forward, backward };

// op on simd in each type T against the reference in double. run<S, R>(policy)
// draws the op's inputs as input<S, R> and returns its outputs. Backward
// results are compared as every suite compares gradients: each against at
// least a tenth of the largest reference result (testing::gradient_floor_fraction).
template <class Run>
void check_op(const std::string& op, const std::string& shapes, bar which, Run run) {
  const auto check_type = [&]<class T>() {
    const auto ours = run.template operator()<T, T>(policy::simd{2});
    const auto reference = run.template operator()<double, T>(policy::reference{});
    REQUIRE(ours.size() == reference.size());
    double scale = 0;
    for (const auto& r : reference) scale = std::max(scale, testing::max_abs(r.values.data(), index_t(r.values.size())));
    const double floor = which == bar::backward ? testing::gradient_floor_fraction * scale : 0.0;
    const double limit = which == bar::backward ? testing::tolerance<T>::backward : testing::tolerance<T>::forward;
    for (std::size_t i = 0; i < ours.size(); ++i) {
      REQUIRE(ours[i].values.size() == reference[i].values.size());
      const double difference = testing::normwise_difference(ours[i].values.data(), reference[i].values.data(),
                                                             index_t(ours[i].values.size()), floor);
      CHECK_MESSAGE(difference <= limit, op << " on simd in " << scalar_traits<T>::name << " (" << shapes << "): "
                                            << ours[i].name << " differs from the reference in double by "
                                            << difference << ", bar " << limit);
    }
  };
  check_type.template operator()<float>();
  check_type.template operator()<double>();
  check_type.template operator()<Eigen::half>();
  check_type.template operator()<Eigen::bfloat16>();
}

std::string shape_text(std::initializer_list<std::pair<const char*, std::vector<index_t>>> tensors) {
  std::string text;
  for (const auto& [name, shape] : tensors) text += (text.empty() ? "" : ", ") + std::string(name) + " " + shape_string(shape);
  return text;
}

// Attention's shapes: q [B, N, H, Maps, d], k [B, M, G, Maps, d], v [B, M, G, dv] (dv = Maps · d, as the modules
// have it); M = 0 means M = N. lambda (Maps = 2): [1], or [H] with per_head_lambda.
struct attention_shape {
  index_t B, N, H, G, d;
  bool causal;
  index_t M = 0;
  bool per_head_lambda = false;
  index_t keys() const { return M == 0 ? N : M; }
  template <int Maps>
  std::string text() const {
    return "Maps = " + std::to_string(Maps) + ", " +
           shape_text({{"q", {B, N, H, Maps, d}}, {"k", {B, keys(), G, Maps, d}}, {"v", {B, keys(), G, Maps * d}}}) +
           (causal ? ", causal" : ", not causal") + (per_head_lambda ? ", a lambda per head" : "");
  }
};
// The modules' shapes (M = N, one lambda), then M != N with a lambda per head:
// the queries the last N of M positions (causal), or fewer keys than queries
// (not causal); N = 70 over M = 150 crosses the simd kernels' 64-wide tiles
// off their grid, on one pair of (batch row, group) and on two.
constexpr attention_shape attention_shapes[] = {
    {2, 13, 4, 2, 8, true},        {1, 7, 3, 3, 6, false},         {1, 1, 2, 1, 4, true},
    {2, 13, 4, 2, 8, true, 29, true}, {1, 7, 3, 3, 6, false, 4, true}, {1, 70, 2, 1, 8, true, 150, true},
    {1, 70, 4, 2, 6, false, 131, true}};

// The attention inputs of one shape; lambda (Maps = 2) 0.3, or 0.3 + 0.2 h for head h.
template <int Maps, class S, class R>
struct attention_inputs {
  Tensor<S, 5> q, k;
  Tensor<S, 4> v;
  Tensor<accum_t<S>, 1> lambda;
  explicit attention_inputs(const attention_shape& a)
      : q(input<S, R>(shape_t<5>{a.B, a.N, a.H, Maps, a.d}, 1)),
        k(input<S, R>(shape_t<5>{a.B, a.keys(), a.G, Maps, a.d}, 2)),
        v(input<S, R>(shape_t<4>{a.B, a.keys(), a.G, Maps * a.d}, 3)),
        lambda(shape_t<1>{Maps == 2 ? (a.per_head_lambda ? a.H : 1) : 0}) {
    for (index_t h = 0; h < lambda.size(); ++h) lambda(h) = accum_t<S>(0.3 + 0.2 * static_cast<double>(h));
  }
};

// The forward's outputs: o [B, N, H, dv], o2 (Maps = 2), lse [B, H, Maps, N].
template <int Maps, class S>
struct attention_outputs {
  Tensor<S, 4> o, o2;
  Tensor<accum_t<S>, 4> lse;
  attention_outputs(const attention_shape& a)
      : o(shape_t<4>{a.B, a.N, a.H, Maps * a.d}),
        o2(shape_t<4>{Maps == 2 ? a.B : 0, a.N, a.H, Maps * a.d}),
        lse(shape_t<4>{a.B, a.H, Maps, a.N}) {}
  template <class P, class In>
  void compute(const P& p, const In& in, bool causal) {
    attention_forward<Maps>(p, in.q.const_view(), in.k.const_view(), in.v.const_view(), in.lambda.const_view(), causal,
                            o.view(), o2.view(), lse.view());
  }
};

template <int Maps>
void check_attention(const attention_shape& a) {
  check_op("attention_forward", a.text<Maps>(), bar::forward, [&]<class S, class R>(const auto& p) {
    const attention_inputs<Maps, S, R> in(a);
    attention_outputs<Maps, S> out(a);
    out.compute(p, in, a.causal);
    std::vector<output> results{result("o", out.o), result("lse", out.lse)};
    if (Maps == 2) results.push_back(result("o2", out.o2));
    return results;
  });
  // Each policy's backward on its own forward's o, o2 and lse.
  check_op("attention_backward", a.text<Maps>(), bar::backward, [&]<class S, class R>(const auto& p) {
    const attention_inputs<Maps, S, R> in(a);
    attention_outputs<Maps, S> out(a);
    out.compute(p, in, a.causal);
    const auto d_o = input<S, R>(out.o.shape(), 4);
    Tensor<S, 5> dq(in.q.shape()), dk(in.k.shape());
    Tensor<S, 4> dv(in.v.shape());
    Tensor<accum_t<S>, 1> dlambda(in.lambda.shape());
    attention_backward<Maps>(p, in.q.const_view(), in.k.const_view(), in.v.const_view(), in.lambda.const_view(),
                             a.causal, out.o.const_view(), out.o2.const_view(), out.lse.const_view(), d_o.const_view(),
                             dq.view(), dk.view(), dv.view(), dlambda.view());
    std::vector<output> results{result("dq", dq), result("dk", dk), result("dv", dv)};
    if (Maps == 2) results.push_back(result("dlambda", dlambda));
    return results;
  });
}

// Decoding: T new tokens per sequence against caches of S positions, sequence b holding lengths[b] of them.
template <int Maps>
void check_attention_decode() {
  const index_t B = 3, T = 2, S = 11, H = 4, G = 2, d = 8;
  const std::vector<index_t> lengths{11, 2, 7};
  const std::string shapes = "Maps = " + std::to_string(Maps) + ", " +
                             shape_text({{"q", {B, T, H, Maps, d}}, {"k", {B, S, G, Maps, d}}, {"v", {B, S, G, Maps * d}}}) +
                             ", lengths 11, 2, 7";
  check_op("attention_decode", shapes, bar::forward, [&]<class U, class R>(const auto& p) {
    const auto q = input<U, R>(shape_t<5>{B, T, H, Maps, d}, 5), k = input<U, R>(shape_t<5>{B, S, G, Maps, d}, 6);
    const auto v = input<U, R>(shape_t<4>{B, S, G, Maps * d}, 7);
    Tensor<accum_t<U>, 1> lambda(shape_t<1>{Maps == 2 ? 1 : 0});
    if (Maps == 2) lambda(0) = accum_t<U>(0.3);
    Tensor<U, 4> o(shape_t<4>{B, T, H, Maps * d});
    attention_decode<Maps>(p, q.const_view(), k.const_view(), v.const_view(), std::span<const index_t>(lengths),
                           lambda.const_view(), o.view());
    return std::vector<output>{result("o", o)};
  });
}

}  // namespace

TEST_CASE("ops: linear forward and backward") {
  for (auto [M, N, K] : {std::array<index_t, 3>{5, 19, 67}, {1, 33, 16}, {17, 8, 130}}) {
    const std::string shapes = shape_text({{"x", {M, K}}, {"w", {N, K}}});
    check_op("linear_forward", shapes, bar::forward, [&]<class S, class R>(const auto& p) {
      const auto x = input<S, R>(shape_t<2>{M, K}, 1), w = input<S, R>(shape_t<2>{N, K}, 2, 0.2);
      Tensor<S, 2> y(shape_t<2>{M, N});
      linear_forward(p, x.const_view(), w.const_view(), y.view());
      return std::vector<output>{result("y", y)};
    });
    check_op("linear_backward", shapes, bar::backward, [&]<class S, class R>(const auto& p) {
      const auto x = input<S, R>(shape_t<2>{M, K}, 1), w = input<S, R>(shape_t<2>{N, K}, 2, 0.2);
      const auto dy = input<S, R>(shape_t<2>{M, N}, 3);
      auto dw = input<S, R>(shape_t<2>{N, K}, 4);  // gradients accumulate into what is there
      Tensor<S, 2> dx(shape_t<2>{M, K});
      linear_backward(p, x.const_view(), w.const_view(), dy.const_view(), dx.view(), dw.view());
      return std::vector<output>{result("dx", dx), result("dw", dw)};
    });
  }
}

TEST_CASE("ops: rmsnorm forward and backward") {
  for (auto [M, C] : {std::array<index_t, 2>{7, 67}, {1, 16}, {12, 5}}) {
    const std::string shapes = shape_text({{"x", {M, C}}, {"w", {C}}}) + ", scale 0.7";
    check_op("rmsnorm_forward", shapes, bar::forward, [&]<class S, class R>(const auto& p) {
      const auto x = input<S, R>(shape_t<2>{M, C}, 1), w = input<S, R>(shape_t<1>{C}, 2);
      Tensor<S, 2> y(x.shape());
      Tensor<accum_t<S>, 1> rstd(shape_t<1>{M});
      rmsnorm_forward(p, x.const_view(), w.const_view(), 1e-5, 0.7, y.view(), rstd.view());
      return std::vector<output>{result("y", y), result("rstd", rstd)};
    });
    check_op("rmsnorm_backward", shapes, bar::backward, [&]<class S, class R>(const auto& p) {
      const auto x = input<S, R>(shape_t<2>{M, C}, 1), w = input<S, R>(shape_t<1>{C}, 2);
      const auto dy = input<S, R>(shape_t<2>{M, C}, 3);
      Tensor<S, 2> y(x.shape()), dx(x.shape());
      Tensor<accum_t<S>, 1> rstd(shape_t<1>{M});
      Tensor<S, 1> dw(w.shape());
      rmsnorm_forward(p, x.const_view(), w.const_view(), 1e-5, 0.7, y.view(), rstd.view());
      rmsnorm_backward(p, x.const_view(), w.const_view(), rstd.const_view(), 0.7, dy.const_view(), dx.view(), dw.view());
      return std::vector<output>{result("dx", dx), result("dw", dw)};
    });
  }
}

TEST_CASE("ops: rope forward and backward, with linear and llama3 scaling") {
  const rope_scaling llama3{.type = rope_type::llama3, .factor = 8, .original_max_positions = 16};
  const rope_scaling linear{.type = rope_type::linear, .factor = 4};
  for (const auto& [scaling, offset] : {std::pair{rope_scaling{}, index_t{0}}, {linear, 3}, {llama3, 40}}) {
    const shape_t<4> shape{2, 9, 3, 12};
    const std::string shapes = shape_text({{"x", {2, 9, 3, 12}}}) + ", " + rope_type_name(scaling.type) +
                               ", offset " + std::to_string(offset);
    for (const bool forward : {true, false})
      check_op(forward ? "rope_forward" : "rope_backward", shapes, forward ? bar::forward : bar::backward,
               [&]<class S, class R>(const auto& p) {
                 auto x = input<S, R>(shape, 1);
                 if (forward)
                   rope_forward(p, x.view(), offset, 500.0, scaling);
                 else
                   rope_backward(p, x.view(), offset, 500.0, scaling);
                 return std::vector<output>{result(forward ? "x rotated" : "dx rotated back", x)};
               });
  }
}

TEST_CASE("ops: rope forward and backward with a caller's table") {
  // Entries drawn at random (neither unit pairs nor a theta's angles), more
  // rows than positions, an offset into them.
  const shape_t<4> shape{2, 9, 3, 12};
  const index_t offset = 4;
  const std::string shapes = shape_text({{"x", {2, 9, 3, 12}}, {"table.cos, table.sin", {15, 6}}}) + ", offset 4";
  for (const bool forward : {true, false})
    check_op(forward ? "rope_forward" : "rope_backward", shapes, forward ? bar::forward : bar::backward,
             [&]<class S, class R>(const auto& p) {
               auto x = input<S, R>(shape, 1);
               const auto cos = input<accum_t<S>, R>(shape_t<2>{15, 6}, 2), sin = input<accum_t<S>, R>(shape_t<2>{15, 6}, 3);
               const rope_table<accum_t<S>> table{cos.const_view(), sin.const_view()};
               if (forward)
                 rope_forward(p, x.view(), offset, table);
               else
                 rope_backward(p, x.view(), offset, table);
               return std::vector<output>{result(forward ? "x rotated" : "dx rotated back", x)};
             });
  // A table of theta's own angles rotates as theta does: the same pairs, the same formula.
  auto by_theta = input<double, double>(shape, 4);
  auto by_table = by_theta;
  Tensor<double, 2> cos(shape_t<2>{15, 6}), sin(shape_t<2>{15, 6});
  for (index_t p = 0; p < 15; ++p)
    for (index_t i = 0; i < 6; ++i) {
      const double angle = static_cast<double>(p) * rope_inverse_frequency(500.0, {}, i, 12);
      cos(p, i) = std::cos(angle);
      sin(p, i) = std::sin(angle);
    }
  rope_forward(policy::reference{}, by_theta.view(), offset, 500.0);
  rope_forward(policy::reference{}, by_table.view(), offset, rope_table<double>{cos.const_view(), sin.const_view()});
  CHECK(testing::normwise_difference(by_table.data(), by_theta.data(), by_theta.size()) == 0.0);
}

TEST_CASE("ops: swiglu gate forward and backward") {
  const index_t M = 6, F = 37;
  const std::string shapes = shape_text({{"g", {M, F}}, {"u", {M, F}}});
  check_op("swiglu_gate_forward", shapes, bar::forward, [&]<class S, class R>(const auto& p) {
    const auto g = input<S, R>(shape_t<2>{M, F}, 1), u = input<S, R>(shape_t<2>{M, F}, 2);
    Tensor<S, 2> h(g.shape());
    swiglu_gate_forward(p, g.const_view(), u.const_view(), h.view());
    return std::vector<output>{result("h", h)};
  });
  check_op("swiglu_gate_backward", shapes, bar::backward, [&]<class S, class R>(const auto& p) {
    const auto g = input<S, R>(shape_t<2>{M, F}, 1), u = input<S, R>(shape_t<2>{M, F}, 2);
    const auto dh = input<S, R>(shape_t<2>{M, F}, 3);
    Tensor<S, 2> dg(g.shape()), du(g.shape());
    swiglu_gate_backward(p, g.const_view(), u.const_view(), dh.const_view(), dg.view(), du.view());
    return std::vector<output>{result("dg", dg), result("du", du)};
  });
}

TEST_CASE("ops: diff_heads forward and backward (V2's head combination)") {
  const index_t M = 5, h = 3, D = 10;
  const std::string shapes = shape_text({{"a", {M, 2 * h, D}}, {"z", {M, h}}});
  check_op("diff_heads_forward", shapes, bar::forward, [&]<class S, class R>(const auto& p) {
    const auto a = input<S, R>(shape_t<3>{M, 2 * h, D}, 1), z = input<S, R>(shape_t<2>{M, h}, 2);
    Tensor<S, 3> o(shape_t<3>{M, h, D});
    diff_heads_forward(p, a.const_view(), z.const_view(), o.view());
    return std::vector<output>{result("o", o)};
  });
  check_op("diff_heads_backward", shapes, bar::backward, [&]<class S, class R>(const auto& p) {
    const auto a = input<S, R>(shape_t<3>{M, 2 * h, D}, 1), z = input<S, R>(shape_t<2>{M, h}, 2);
    const auto d_o = input<S, R>(shape_t<3>{M, h, D}, 3);
    Tensor<S, 3> da(a.shape());
    Tensor<S, 2> dz(z.shape());
    diff_heads_backward(p, a.const_view(), z.const_view(), d_o.const_view(), da.view(), dz.view());
    return std::vector<output>{result("da", da), result("dz", dz)};
  });
}

TEST_CASE("ops: diff_lambda forward and backward") {
  const index_t D = 12;
  const std::string shapes = shape_text({{"lq1, lk1, lq2, lk2", {D}}}) + ", layer 1";
  // The lambda vectors' scale at initialisation and after training (0.1 to 0.3).
  const auto vectors = []<class S, class R>() {
    return std::array{input<S, R>(shape_t<1>{D}, 1, 0.3), input<S, R>(shape_t<1>{D}, 2, 0.3),
                      input<S, R>(shape_t<1>{D}, 3, 0.3), input<S, R>(shape_t<1>{D}, 4, 0.3)};
  };
  check_op("diff_lambda_forward", shapes, bar::forward, [&]<class S, class R>(const auto& p) {
    const auto l = vectors.template operator()<S, R>();
    Tensor<accum_t<S>, 1> lambda(shape_t<1>{1});
    diff_lambda_forward(p, l[0].const_view(), l[1].const_view(), l[2].const_view(), l[3].const_view(), lambda_init(1),
                        lambda.view());
    return std::vector<output>{result("lambda", lambda)};
  });
  check_op("diff_lambda_backward", shapes, bar::backward, [&]<class S, class R>(const auto& p) {
    const auto l = vectors.template operator()<S, R>();
    Tensor<accum_t<S>, 1> dlambda(shape_t<1>{1});
    dlambda(0) = accum_t<S>(0.75);
    std::array<Tensor<S, 1>, 4> grads{Tensor<S, 1>(shape_t<1>{D}), Tensor<S, 1>(shape_t<1>{D}),
                                      Tensor<S, 1>(shape_t<1>{D}), Tensor<S, 1>(shape_t<1>{D})};
    for (auto& g : grads) fill_constant(g.view(), 0.0);
    diff_lambda_backward(p, l[0].const_view(), l[1].const_view(), l[2].const_view(), l[3].const_view(),
                         dlambda.const_view(), grads[0].view(), grads[1].view(), grads[2].view(), grads[3].view());
    return std::vector<output>{result("dlq1", grads[0]), result("dlk1", grads[1]), result("dlq2", grads[2]),
                               result("dlk2", grads[3])};
  });
}

TEST_CASE("ops: attention forward and backward, standard (1 map) and differential (2 maps)") {
  for (const auto& a : attention_shapes) {
    check_attention<1>(a);
    check_attention<2>(a);
  }
}

TEST_CASE("ops: attention_decode, 1 and 2 maps") {
  check_attention_decode<1>();
  check_attention_decode<2>();
}

TEST_CASE("ops: embedding forward and backward") {
  const index_t V = 11, C = 19;
  const std::vector<token_t> ids{3, 0, 10, 3, 7, 3};
  Tensor<token_t, 1> tokens(shape_t<1>{index_t(ids.size())});
  std::copy(ids.begin(), ids.end(), tokens.data());
  const std::string shapes = shape_text({{"tokens", {index_t(ids.size())}}, {"w", {V, C}}}) + ", a token thrice";
  check_op("embedding_forward", shapes, bar::forward, [&]<class S, class R>(const auto& p) {
    const auto w = input<S, R>(shape_t<2>{V, C}, 1);
    Tensor<S, 2> y(shape_t<2>{tokens.size(), C});
    embedding_forward(p, tokens.const_view(), w.const_view(), y.view());
    return std::vector<output>{result("y", y)};
  });
  check_op("embedding_backward", shapes, bar::backward, [&]<class S, class R>(const auto& p) {
    const auto dy = input<S, R>(shape_t<2>{tokens.size(), C}, 2);
    auto dw = input<S, R>(shape_t<2>{V, C}, 3);  // gradients accumulate into what is there
    embedding_backward(p, tokens.const_view(), dy.const_view(), dw.view());
    return std::vector<output>{result("dw", dw)};
  });
}

TEST_CASE("ops: cross_entropy forward and backward") {
  const index_t M = 5, V = 29;
  const std::vector<token_t> ids{4, -1, 28, 0, 4};  // -1: a position without an answer
  Tensor<token_t, 1> targets(shape_t<1>{M});
  std::copy(ids.begin(), ids.end(), targets.data());
  const std::string shapes = shape_text({{"logits", {M, V}}, {"targets", {M}}}) + ", one ignored";
  check_op("cross_entropy_forward", shapes, bar::forward, [&]<class S, class R>(const auto& p) {
    const auto logits = input<S, R>(shape_t<2>{M, V}, 1, 3.0);
    Tensor<accum_t<S>, 1> loss(shape_t<1>{1}), lse(shape_t<1>{M});
    cross_entropy_forward<S>(p, logits.const_view(), targets.const_view(), loss.view(), lse.view());
    return std::vector<output>{result("loss", loss), result("lse", lse)};
  });
  check_op("cross_entropy_backward", shapes, bar::backward, [&]<class S, class R>(const auto& p) {
    const auto logits = input<S, R>(shape_t<2>{M, V}, 1, 3.0);
    Tensor<accum_t<S>, 1> loss(shape_t<1>{1}), lse(shape_t<1>{M});
    Tensor<S, 2> dlogits(logits.shape());
    cross_entropy_forward<S>(p, logits.const_view(), targets.const_view(), loss.view(), lse.view());
    cross_entropy_backward(p, logits.const_view(), targets.const_view(), lse.const_view(), 1.5, dlogits.view());
    return std::vector<output>{result("dlogits", dlogits)};
  });
}

TEST_CASE("ops: add_into") {
  const shape_t<3> shape{2, 7, 19};
  check_op("add_into", shape_text({{"x, y", {2, 7, 19}}}), bar::forward, [&]<class S, class R>(const auto& p) {
    const auto x = input<S, R>(shape, 1);
    auto y = input<S, R>(shape, 2);
    add_into(p, x.const_view(), y.view());
    return std::vector<output>{result("y", y)};
  });
}
