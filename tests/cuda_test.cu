// policy::cuda against the reference policy (in double) on random shapes: odd
// N, N not a multiple of the tiles, grouped heads, non-causal, B > 1; forward
// and every gradient of every module, in float32, float16 and bfloat16, within
// difftx::testing::tolerance. Head sizes 64 and 128 exercise the tensor-core
// attention kernels, 8 the CUDA-core ones. float64 runs MultiHead and
// DecoderLayer in double throughout (the CUDA-core kernels at every head size).
// Embedding and CrossEntropyLoss with token ids in device memory (repeated ids,
// ignored targets, bad ids) and a LanguageModel trained one step's worth of
// gradients, in float32 and float64. attention_decode (split-K decoding over
// a key/value cache whose rows past each length are NaN) against the
// reference in float32, bfloat16 and float64; modules' prefill + decode and
// packed batches against the reference forward. Without a GPU the suite exits
// 77, which CTest reports as skipped.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <difftx/difftx.hpp>
#include <difftx/policy/cuda.hpp>
#include <difftx/testing/compare.hpp>
#include <difftx/testing/tolerance.hpp>

#include "support/compare_modules.hpp"

using namespace difftx;

namespace {

template <class T, std::size_t R>
Tensor<T, R> to_device(const Tensor<double, R>& host, const policy::cuda& p) {
  Tensor<T, R> typed(host.shape());
  for (index_t i = 0; i < host.size(); ++i) typed.data()[i] = scalar_traits<T>::from_double(host.data()[i]);
  Tensor<T, R> device(host.shape(), p.memory());
  p.memory().upload(device.data(), typed.data(), static_cast<std::size_t>(typed.size()) * sizeof(T));
  return device;
}

template <class T>
std::vector<double> to_host(const T* device, index_t n, const policy::cuda& p) {
  std::vector<T> typed(static_cast<std::size_t>(n));
  p.memory().download(typed.data(), device, typed.size() * sizeof(T));
  std::vector<double> out(typed.size());
  for (std::size_t i = 0; i < typed.size(); ++i) out[i] = scalar_traits<T>::to_double(typed[i]);
  return out;
}

// Rounds a double through T, so the reference sees exactly what the GPU holds.
template <class T>
double through(double v) {
  return scalar_traits<T>::to_double(scalar_traits<T>::from_double(v));
}

// Rounds the reference module's parameters through T, so it holds exactly what
// the GPU module gets, and copies them there (modules/copy_parameters.hpp).
template <class T, class Reference, class Gpu>
void copy_parameters_to_device(Reference& reference, Gpu& gpu) {
  for (const auto& param : reference.parameters())
    for (index_t e = 0; e < param.size(); ++e) param.value[e] = through<T>(param.value[e]);
  copy_parameters(reference, gpu);
}

// The module in T on the GPU (on policy p) against the same module in double
// on the host; a packed batch [1, total, C] where sequences (cu_seqlens) are given.
template <class T, class Make>
void check_module(const std::string& label, Make make, const shape_t<3>& shape, policy::cuda p = {},
                  sequence_offsets sequences = {}) {
  auto reference = make.template operator()<double, policy::reference>(policy::reference{});
  auto gpu = make.template operator()<T, policy::cuda>(p);
  test_support::randomise_parameters(reference, 11);
  copy_parameters_to_device<T>(reference, gpu);
  const auto ref_params = reference.parameters();
  const auto gpu_params = gpu.parameters();
  auto x = test_support::random_tensor<double, 3>(shape, 12), dy = test_support::random_tensor<double, 3>(shape, 13);
  for (auto* t : {&x, &dy})
    for (index_t i = 0; i < t->size(); ++i) t->data()[i] = through<T>(t->data()[i]);

  const auto [y_ref, dx_ref] = test_support::run_forward_backward(reference, x, dy, sequences);
  const auto x_gpu = to_device<T>(x, p), dy_gpu = to_device<T>(dy, p);
  Tensor<T, 3> y_gpu(shape, p.memory()), dx_gpu(shape, p.memory());
  typename decltype(gpu)::saved_type saved;
  zero_grad(gpu);
  test_support::forward_on(gpu, x_gpu, y_gpu, saved, sequences);
  gpu.backward(x_gpu, dy_gpu, saved, dx_gpu);

  double scale = testing::max_abs(dx_ref.data(), dx_ref.size());
  for (const auto& g : ref_params) scale = std::max(scale, testing::max_abs(g.grad, g.size()));
  const double floor = 0.1 * scale;  // as test_support::compare_modules, for the same reason
  const auto y = to_host(y_gpu.data(), y_gpu.size(), p);
  const auto dx = to_host(dx_gpu.data(), dx_gpu.size(), p);
  const double forward = testing::normwise_difference(y.data(), y_ref.data(), y_ref.size());
  double backward = testing::normwise_difference(dx.data(), dx_ref.data(), dx_ref.size(), floor);
  std::string worst = "input";
  for (std::size_t i = 0; i < ref_params.size(); ++i) {
    const auto g = to_host(gpu_params[i].grad, gpu_params[i].size(), p);
    const double d = testing::normwise_difference(g.data(), ref_params[i].grad, ref_params[i].size(), floor);
    if (d > backward) {
      backward = d;
      worst = ref_params[i].name;
    }
  }
  const double u = scalar_traits<T>::epsilon;
  MESSAGE(label << " " << scalar_traits<T>::name << ": forward " << forward / u << " u, backward " << backward / u
                << " u (worst " << worst << ")");
  CHECK(forward <= testing::tolerance<T>::forward);
  CHECK(backward <= testing::tolerance<T>::backward);
}

template <class Make>
void check_all_types(const std::string& label, Make make, const shape_t<3>& shape, const policy::cuda& p = {}) {
  check_module<float>(label, make, shape, p);
  check_module<Eigen::half>(label, make, shape, p);
  check_module<Eigen::bfloat16>(label, make, shape, p);
}

// difftx's own attention kernels, also in a build where cuDNN's are the default.
policy::cuda own_kernels() { return {.attention = policy::cuda_attention::difftx}; }

// Each attention path the build has, with a label: difftx's kernels, and
// cuDNN's where built (for float16/bfloat16; other types run difftx's on both).
std::vector<std::pair<std::string, policy::cuda>> attention_paths() {
  std::vector<std::pair<std::string, policy::cuda>> paths{{" (difftx kernels)", own_kernels()}};
  if (built_with_cudnn) paths.emplace_back(" (cuDNN)", policy::cuda{.attention = policy::cuda_attention::cudnn});
  return paths;
}

struct attention_case {
  index_t batch, seq, heads, kv_heads;
  bool causal;
};
const attention_case cases[] = {{1, 1, 2, 2, true}, {2, 63, 4, 2, true}, {1, 130, 2, 1, false}, {2, 97, 4, 4, true}};

// A maker of MultiHead at D = 64 (C 128, layer 2) with the case's heads and mask, and
// llama3 RoPE whose original context (64) puts D = 64's frequencies in all three bands.
auto multihead_d64(const attention_case& c) {
  return [c]<class U, class P>(P p) {
    return MultiHead<U, 64, P>({.d_model = 128, .heads = c.heads, .kv_heads = c.kv_heads, .layer_index = 2,
                                .rope_theta = 10000.0,
                                .causal = c.causal,
                                .rope_scaling = {.type = rope_type::llama3, .factor = 32.0, .original_max_positions = 64.0}},
                               p);
  };
}

const auto multihead_d128 = []<class U, class P>(P p) {
  return MultiHead<U, 128, P>({.d_model = 256, .heads = 2, .kv_heads = 1}, p);
};
const auto attention_d64 = []<class U, class P>(P p) {
  return Attention<U, 64, P>({.d_model = 128, .heads = 4, .kv_heads = 2}, p);
};

std::string describe(const attention_case& c) {
  return "B=" + std::to_string(c.batch) + " N=" + std::to_string(c.seq) + " h=" + std::to_string(c.heads) +
         " g=" + std::to_string(c.kv_heads) + (c.causal ? " causal" : " non-causal");
}

// Token ids [B, N] in `memory` (host or device).
Tensor<token_t, 2> tokens_in(const shape_t<2>& shape, const std::vector<token_t>& ids,
                             memory_resource& memory = host_memory()) {
  Tensor<token_t, 2> host(shape);
  REQUIRE(static_cast<index_t>(ids.size()) == host.size());
  std::copy(ids.begin(), ids.end(), host.data());
  if (memory.space() == memory_space::host) return host;
  Tensor<token_t, 2> device(shape, memory);
  memory.upload(device.data(), host.data(), ids.size() * sizeof(token_t));
  return device;
}

// n ids drawn uniformly from [low, high), seeded.
std::vector<token_t> random_ids(index_t n, token_t low, token_t high, std::uint64_t seed) {
  random_stream rng(seed);
  std::vector<token_t> ids(static_cast<std::size_t>(n));
  for (auto& id : ids) id = std::min<token_t>(high - 1, low + static_cast<token_t>(rng.uniform(0.0, high - low)));
  return ids;
}

// The worst normwise difference over every parameter gradient (floor: 10% of
// the largest reference gradient, as check_module), and the parameter it is in.
template <class T>
std::pair<double, std::string> worst_gradient(const std::vector<parameter_ref<T>>& gpu_params,
                                              const std::vector<parameter_ref<double>>& ref_params,
                                              const policy::cuda& p) {
  double scale = 0;
  for (const auto& g : ref_params) scale = std::max(scale, testing::max_abs(g.grad, g.size()));
  std::pair<double, std::string> worst{0.0, "none"};
  for (std::size_t i = 0; i < ref_params.size(); ++i) {
    const auto g = to_host(gpu_params[i].grad, gpu_params[i].size(), p);
    const double d = testing::normwise_difference(g.data(), ref_params[i].grad, ref_params[i].size(), 0.1 * scale);
    if (d >= worst.first) worst = {d, ref_params[i].name};
  }
  return worst;
}

// Runs f and returns the message of the input_error it throws ("" if none).
template <class F>
std::string input_error_of(F f) {
  try {
    f();
  } catch (const input_error& e) {
    return e.what();
  }
  return "";
}

// Embedding and CrossEntropyLoss in T on the GPU against the reference in double.
template <class T>
void check_embedding_and_cross_entropy() {
  policy::cuda p;
  const index_t V = 37, C = 24, B = 3, N = 41;  // 123 ids over 37 rows: ids repeat
  const double u = scalar_traits<T>::epsilon;
  const auto ids = random_ids(B * N, 0, static_cast<token_t>(V), 31);
  const auto tokens_host = tokens_in({B, N}, ids), tokens_gpu = tokens_in({B, N}, ids, p.memory());

  // Embedding: the forward copies rows (exact); the backward sums repeated ids.
  Embedding<double> embed_ref(V, C);
  Embedding<T, policy::cuda> embed_gpu(V, C, p);
  test_support::randomise_parameters(embed_ref, 32);
  copy_parameters_to_device<T>(embed_ref, embed_gpu);
  auto dy = test_support::random_tensor<double, 3>({B, N, C}, 33);
  for (index_t i = 0; i < dy.size(); ++i) dy.data()[i] = through<T>(dy.data()[i]);
  Tensor<double, 3> y_ref({B, N, C});
  Tensor<T, 3> y_gpu({B, N, C}, p.memory());
  typename Embedding<double>::saved_type saved_ref;
  typename Embedding<T, policy::cuda>::saved_type saved_gpu;
  zero_grad(embed_ref);
  zero_grad(embed_gpu);
  embed_ref.forward(tokens_host, y_ref, saved_ref);
  embed_ref.backward(tokens_host, dy, saved_ref);
  const auto dy_gpu = to_device<T>(dy, p);
  embed_gpu.forward(tokens_gpu, y_gpu, saved_gpu);
  embed_gpu.backward(tokens_gpu, dy_gpu, saved_gpu);
  const auto y = to_host(y_gpu.data(), y_gpu.size(), p);
  CHECK(testing::normwise_difference(y.data(), y_ref.data(), y_ref.size()) == 0.0);
  const double embed_backward = worst_gradient(embed_gpu.parameters(), embed_ref.parameters(), p).first;
  MESSAGE("Embedding " << scalar_traits<T>::name << ": backward " << embed_backward / u << " u");
  CHECK(embed_backward <= testing::tolerance<T>::backward);
  // float64: each id's rows are summed in ascending order in double, then added
  // once, exactly as the reference does, so the bits agree.
  if constexpr (std::is_same_v<T, double>) CHECK(embed_backward == 0.0);

  // An id outside the table: the reference's input_error, nothing written.
  for (token_t bad : {static_cast<token_t>(V), token_t{-1}}) {
    auto bad_ids = ids;
    bad_ids[5] = bad;
    bad_ids[70] = static_cast<token_t>(V + 3);  // a later bad id: the first one is named
    const auto bad_host = tokens_in({B, N}, bad_ids), bad_gpu = tokens_in({B, N}, bad_ids, p.memory());
    const std::string expected = input_error_of([&] { embed_ref.forward(bad_host, y_ref, saved_ref); });
    CHECK(expected.find("at flat index 5") != std::string::npos);
    CHECK(input_error_of([&] { embed_gpu.forward(bad_gpu, y_gpu, saved_gpu); }) == expected);
    CHECK(to_host(y_gpu.data(), y_gpu.size(), p) == y);
    const std::string expected_backward = input_error_of([&] { embed_ref.backward(bad_host, dy, saved_ref); });
    CHECK(!expected_backward.empty());
    CHECK(input_error_of([&] { embed_gpu.backward(bad_gpu, dy_gpu, saved_gpu); }) == expected_backward);
  }

  // Cross-entropy over logits [B, N, V]; about a fifth of the targets are -1 (ignored).
  auto logits_ref = test_support::random_tensor<double, 3>({B, N, V}, 34, 2.0);
  for (index_t i = 0; i < logits_ref.size(); ++i) logits_ref.data()[i] = through<T>(logits_ref.data()[i]);
  auto target_ids = random_ids(B * N, 0, static_cast<token_t>(V), 35);
  for (std::size_t i = 0; i < target_ids.size(); i += 5) target_ids[i] = -1;
  const auto targets_host = tokens_in({B, N}, target_ids), targets_gpu = tokens_in({B, N}, target_ids, p.memory());
  const auto logits_gpu = to_device<T>(logits_ref, p);
  CrossEntropyLoss<double> ce_ref;
  CrossEntropyLoss<T, policy::cuda> ce_gpu(p);
  typename CrossEntropyLoss<double>::saved_type ce_saved_ref;
  typename CrossEntropyLoss<T, policy::cuda>::saved_type ce_saved_gpu;
  const double loss_ref = ce_ref.forward(logits_ref, targets_host, ce_saved_ref);
  const double loss_gpu = ce_gpu.forward(logits_gpu, targets_gpu, ce_saved_gpu);
  const double loss_difference = std::abs(loss_gpu - loss_ref) / std::abs(loss_ref);
  const auto lse = to_host(ce_saved_gpu.lse.data(), ce_saved_gpu.lse.size(), p);
  const double lse_difference =
      testing::normwise_difference(lse.data(), ce_saved_ref.lse.data(), ce_saved_ref.lse.size());
  Tensor<double, 3> dlogits_ref({B, N, V});
  Tensor<T, 3> dlogits_gpu({B, N, V}, p.memory());
  ce_ref.backward(logits_ref, targets_host, ce_saved_ref, dlogits_ref, 1.5);
  ce_gpu.backward(logits_gpu, targets_gpu, ce_saved_gpu, dlogits_gpu, 1.5);
  const auto dlogits = to_host(dlogits_gpu.data(), dlogits_gpu.size(), p);
  const double ce_backward = testing::normwise_difference(dlogits.data(), dlogits_ref.data(), dlogits_ref.size());
  MESSAGE("CrossEntropyLoss " << scalar_traits<T>::name << ": loss " << loss_difference / u << " u, lse "
                              << lse_difference / u << " u, dlogits " << ce_backward / u << " u");
  CHECK(loss_difference <= testing::tolerance<T>::forward);
  CHECK(lse_difference <= testing::tolerance<T>::forward);
  CHECK(ce_backward <= testing::tolerance<T>::backward);
  for (index_t i = 0; i < dlogits_ref.size(); ++i)  // ignored rows: exactly zero
    if (target_ids[static_cast<std::size_t>(i / V)] < 0) REQUIRE(dlogits[static_cast<std::size_t>(i)] == 0.0);

  // No counted target: loss 0, every gradient 0.
  const auto none = tokens_in({B, N}, std::vector<token_t>(static_cast<std::size_t>(B * N), -1), p.memory());
  CHECK(ce_gpu.forward(logits_gpu, none, ce_saved_gpu) == 0.0);
  ce_gpu.backward(logits_gpu, none, ce_saved_gpu, dlogits_gpu);
  const auto zeros = to_host(dlogits_gpu.data(), dlogits_gpu.size(), p);
  CHECK(std::all_of(zeros.begin(), zeros.end(), [](double v) { return v == 0.0; }));

  // A target >= V: the reference's input_error from the forward and the backward.
  auto bad_targets = target_ids;
  bad_targets[7] = static_cast<token_t>(V);
  const auto bad_host = tokens_in({B, N}, bad_targets), bad_gpu = tokens_in({B, N}, bad_targets, p.memory());
  const std::string expected_forward = input_error_of([&] { ce_ref.forward(logits_ref, bad_host, ce_saved_ref); });
  CHECK(expected_forward.find("at flat index 7") != std::string::npos);
  CHECK(input_error_of([&] { ce_gpu.forward(logits_gpu, bad_gpu, ce_saved_gpu); }) == expected_forward);
  ce_ref.forward(logits_ref, targets_host, ce_saved_ref);
  ce_gpu.forward(logits_gpu, targets_gpu, ce_saved_gpu);
  const std::string expected =
      input_error_of([&] { ce_ref.backward(logits_ref, bad_host, ce_saved_ref, dlogits_ref); });
  CHECK(!expected.empty());
  CHECK(input_error_of([&] { ce_gpu.backward(logits_gpu, bad_gpu, ce_saved_gpu, dlogits_gpu); }) == expected);
}

// A two-layer LanguageModel<DecoderLayer> in T on the GPU against the same
// model in double on the host: logits, the cross-entropy and every parameter
// gradient of it. The model chains two layers and a head, so the bars are
// twice a DecoderLayer's (as the simd test in training_test.cpp).
template <class T>
void check_language_model() {
  policy::cuda p;
  const index_t V = 23, B = 2, N = 19;
  const auto ids = random_ids(B * N, 0, static_cast<token_t>(V), 41);
  auto target_ids = random_ids(B * N, 0, static_cast<token_t>(V), 42);
  for (std::size_t i = 3; i < target_ids.size(); i += 7) target_ids[i] = -1;
  const auto tokens_host = tokens_in({B, N}, ids), tokens_gpu = tokens_in({B, N}, ids, p.memory());
  const auto targets_host = tokens_in({B, N}, target_ids), targets_gpu = tokens_in({B, N}, target_ids, p.memory());
  auto make = []<class U, class P>(P policy) {
    std::vector<DecoderLayer<U, 8, P>> layers;
    for (index_t l = 0; l < 2; ++l)
      layers.emplace_back(DecoderLayerConfig{{.d_model = 32, .heads = 2, .kv_heads = 1, .layer_index = l}, 64}, policy);
    return LanguageModel<DecoderLayer<U, 8, P>>({.vocab_size = 23, .d_model = 32}, std::move(layers));
  };
  auto reference = make.template operator()<double, policy::reference>(policy::reference{});
  auto gpu = make.template operator()<T, policy::cuda>(p);
  test_support::randomise_parameters(reference, 43);
  copy_parameters_to_device<T>(reference, gpu);
  zero_grad(reference);
  zero_grad(gpu);

  auto run = [](auto& model, const auto& tokens, const auto& targets, auto& logits, auto& dlogits) {
    using Model = std::remove_reference_t<decltype(model)>;
    CrossEntropyLoss<typename Model::value_type, typename Model::policy_type> ce(model.policy());
    typename decltype(ce)::saved_type ce_saved;
    typename Model::saved_type saved;
    model.forward(tokens, logits, saved);
    const double loss = ce.forward(logits, targets, ce_saved);
    ce.backward(logits, targets, ce_saved, dlogits);
    model.backward(tokens, dlogits, saved);
    return loss;
  };
  Tensor<double, 3> logits_ref({B, N, V}), dlogits_ref({B, N, V});
  Tensor<T, 3> logits_gpu({B, N, V}, p.memory()), dlogits_gpu({B, N, V}, p.memory());
  const double loss_ref = run(reference, tokens_host, targets_host, logits_ref, dlogits_ref);
  const double loss_gpu = run(gpu, tokens_gpu, targets_gpu, logits_gpu, dlogits_gpu);

  const double u = scalar_traits<T>::epsilon;
  const auto logits = to_host(logits_gpu.data(), logits_gpu.size(), p);
  const double forward = testing::normwise_difference(logits.data(), logits_ref.data(), logits_ref.size());
  const double loss_difference = std::abs(loss_gpu - loss_ref) / std::abs(loss_ref);
  const auto gradients = worst_gradient(gpu.parameters(), reference.parameters(), p);
  const double backward = gradients.first;
  MESSAGE("LanguageModel " << scalar_traits<T>::name << ": logits " << forward / u << " u, loss "
                           << loss_difference / u << " u, gradients " << backward / u << " u (worst "
                           << gradients.second << ")");
  CHECK(forward <= 2 * testing::tolerance<T>::forward);
  CHECK(loss_difference <= 2 * testing::tolerance<T>::forward);
  CHECK(backward <= 2 * testing::tolerance<T>::backward);
}


// attention_decode in T on the GPU against the reference in double on the same
// inputs (rounded through T), heads H = 4 over G = 2 groups, S cached rows.
// Cache rows at or past a sequence's length are NaN: reading any of them
// would make an output NaN.
template <class T, int Maps>
void check_attention_decode(index_t new_tokens, index_t d, const std::vector<index_t>& lengths, index_t S) {
  using A = accum_t<T>;
  policy::cuda p;
  const index_t B = static_cast<index_t>(lengths.size()), H = 4, G = 2, dv = Maps * d;
  auto q = test_support::random_tensor<double, 5>({B, new_tokens, H, Maps, d}, 51);
  auto k = test_support::random_tensor<double, 5>({B, S, G, Maps, d}, 52, 2.0);
  auto v = test_support::random_tensor<double, 4>({B, S, G, dv}, 53);
  auto round_through = [](double* data, index_t n) {
    for (index_t i = 0; i < n; ++i) data[i] = through<T>(data[i]);
  };
  round_through(q.data(), q.size());
  round_through(k.data(), k.size());
  round_through(v.data(), v.size());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (index_t b = 0; b < B; ++b)
    for (index_t t = lengths[static_cast<std::size_t>(b)]; t < S; ++t) {
      std::fill_n(k.data() + (b * S + t) * G * Maps * d, G * Maps * d, nan);
      std::fill_n(v.data() + (b * S + t) * G * dv, G * dv, nan);
    }
  Tensor<double, 1> lambda_ref({Maps == 2 ? 1 : 0});
  Tensor<A, 1> lambda_gpu({Maps == 2 ? 1 : 0}, p.memory());
  if constexpr (Maps == 2) {
    const A lambda = static_cast<A>(0.3);
    lambda_ref(0) = static_cast<double>(lambda);
    p.memory().upload(lambda_gpu.data(), &lambda, sizeof lambda);
  }

  Tensor<double, 4> o_ref({B, new_tokens, H, dv});
  attention_decode<Maps>(policy::reference{}, q.const_view(), k.const_view(), v.const_view(), lengths,
                         lambda_ref.const_view(), o_ref.view());
  const auto q_gpu = to_device<T>(q, p), k_gpu = to_device<T>(k, p);
  const auto v_gpu = to_device<T>(v, p);
  Tensor<T, 4> o_gpu({B, new_tokens, H, dv}, p.memory());
  attention_decode<Maps>(p, q_gpu.const_view(), k_gpu.const_view(), v_gpu.const_view(), lengths,
                         lambda_gpu.const_view(), o_gpu.view());
  const auto o = to_host(o_gpu.data(), o_gpu.size(), p);

  const double difference = testing::normwise_difference(o.data(), o_ref.data(), o_ref.size());
  MESSAGE("attention_decode Maps=" << Maps << " d=" << d << " T=" << new_tokens << " B=" << B << " "
                                   << scalar_traits<T>::name << ": " << difference / scalar_traits<T>::epsilon
                                   << " u");
  CHECK(std::all_of(o.begin(), o.end(), [](double x) { return std::isfinite(x); }));  // no NaN row was read
  CHECK(difference <= testing::tolerance<T>::forward);
}

// Prefill, then decode steps of 1 and 3 tokens on the GPU; and a packed batch
// of three sequences; every output against the reference forward in double.
template <class T, class Make>
void check_inference(const std::string& label, Make make, index_t C, const policy::cuda& p = {}) {
  auto reference = make.template operator()<double, policy::reference>(policy::reference{});
  auto gpu = make.template operator()<T, policy::cuda>(p);
  test_support::randomise_parameters(reference, 21);
  copy_parameters_to_device<T>(reference, gpu);
  const index_t B = 2, prompt = 70, total = prompt + 4;
  auto x = test_support::random_tensor<double, 3>({B, total, C}, 22);
  for (index_t i = 0; i < x.size(); ++i) x.data()[i] = through<T>(x.data()[i]);
  Tensor<double, 3> y_ref(x.shape());
  reference.forward(x, y_ref.view());

  auto cache = gpu.make_cache(B, total);
  double worst = 0;
  index_t n = 0;
  for (index_t step : {prompt, index_t{1}, index_t{3}}) {
    const auto x_step = to_device<T>(test_support::token_range<double>(x, n, n + step), p);
    Tensor<T, 3> y_step(x_step.shape(), p.memory());
    if (n == 0)
      gpu.prefill(x_step, cache, y_step.view());
    else
      gpu.decode(x_step, cache, y_step.view());
    const auto y = to_host(y_step.data(), y_step.size(), p);
    const auto expected = test_support::token_range<double>(y_ref, n, n + step);
    worst = std::max(worst, testing::normwise_difference(y.data(), expected.data(), expected.size()));
    n += step;
  }
  INFO(label << " " << scalar_traits<T>::name << " prefill + decode: " << worst / scalar_traits<T>::epsilon << " u");
  CHECK(worst <= testing::tolerance<T>::forward);

  // Packed: sequence b of x's rows as one [1, 2·total, C] batch of two sequences.
  const std::vector<index_t> offsets{0, total, 2 * total};
  Tensor<double, 3> flat({1, B * total, C});
  std::copy_n(x.data(), x.size(), flat.data());
  const auto packed = to_device<T>(flat, p);
  Tensor<T, 3> y_packed(packed.shape(), p.memory());
  gpu.forward(packed, y_packed.view(), offsets);
  const auto y = to_host(y_packed.data(), y_packed.size(), p);
  const double packed_difference = testing::normwise_difference(y.data(), y_ref.data(), y_ref.size());
  INFO(label << " " << scalar_traits<T>::name << " packed: " << packed_difference / scalar_traits<T>::epsilon << " u");
  CHECK(packed_difference <= testing::tolerance<T>::forward);
}

}  // namespace

TEST_CASE("cuda: RMSNorm and SwiGLU") {
  check_all_types("RMSNorm", []<class U, class P>(P p) { return RMSNorm<U, P>(96, 1e-5, 1.0, p); }, {2, 33, 96});
  check_all_types("SwiGLU", []<class U, class P>(P p) { return SwiGLU<U, P>(96, 160, p); }, {2, 33, 96});
}

TEST_CASE("cuda: MultiHead, tensor-core attention (D = 64, 128) and CUDA-core attention (D = 8)") {
  for (const auto& c : cases) {
    check_all_types("MultiHead D=64 " + describe(c), multihead_d64(c), {c.batch, c.seq, 128}, own_kernels());
    check_all_types(
        "MultiHead D=8 " + describe(c),
        [c]<class U, class P>(P p) {
          return MultiHead<U, 8, P>({.d_model = 48, .heads = c.heads, .kv_heads = c.kv_heads, .causal = c.causal}, p);
        },
        {c.batch, c.seq, 48}, own_kernels());
  }
  check_all_types("MultiHead D=128", multihead_d128, {1, 150, 256}, own_kernels());
}

// cuDNN's attention (attention_cudnn.cuh) in the same modules, against the
// same reference and bars: each map one cuDNN problem (d against dv = 2d),
// grouped heads, causal and not, N off every tile. The context's counts say
// that cuDNN ran every call it takes (a refusal falls back to difftx's kernels,
// which would pass the bars without testing cuDNN): all but the one-token
// sequences' calls, which cuDNN may refuse (9.19 on an H100 refuses the
// forward, s_q = s_kv = 1, and takes the backward, which then reads the lse
// difftx's forward saved).
TEST_CASE("cuda: MultiHead and baseline Attention on cuDNN's attention") {
  if (!built_with_cudnn) {
    MESSAGE("this build has no cuDNN attention (CMake found no cuDNN or no cudnn_frontend.h): not run");
    return;
  }
  const policy::cuda p{.attention = policy::cuda_attention::cudnn};
  auto& calls = p.context->attention_calls;
  auto count = [&](attention_path path) { return calls[static_cast<std::size_t>(path)].load(); };
  const long long own_before = count(attention_path::tensor_cores) + count(attention_path::cuda_cores),
                  cudnn_before = count(attention_path::cudnn);
  int modules = 0, refused = 0;
  auto both_types = [&](const std::string& label, auto make, const shape_t<3>& shape) {
    check_module<Eigen::half>(label, make, shape, p);
    check_module<Eigen::bfloat16>(label, make, shape, p);
    (shape[1] == 1 ? refused : modules) += 2;
  };
  for (const auto& c : cases) both_types("MultiHead D=64 cuDNN " + describe(c), multihead_d64(c), {c.batch, c.seq, 128});
  both_types("MultiHead D=128 cuDNN", multihead_d128, {1, 150, 256});
  both_types("Attention D=64 cuDNN", attention_d64, {2, 77, 128});
  MESSAGE("attention calls on cuDNN: " << count(attention_path::cudnn) - cudnn_before << ", on difftx's kernels: "
                                       << count(attention_path::tensor_cores) + count(attention_path::cuda_cores) -
                                              own_before);
  const long long on_cudnn = count(attention_path::cudnn) - cudnn_before,
                  on_own = count(attention_path::tensor_cores) + count(attention_path::cuda_cores) - own_before;
  CHECK(refused == 2);  // the one-token case, in both types
  CHECK(on_cudnn + on_own == 2 * (modules + refused));  // a forward and a backward each
  CHECK(on_cudnn >= 2 * modules);                        // every call but the one-token ones on cuDNN
}

// Packed batches on cuDNN's ragged layout (policy.cudnn_ragged): the
// sequences are cuDNN's batch, one call per map, against the reference's
// per-sequence calls in double, forward and every gradient. Lengths 37, 1,
// 112, 63 (one of one token, none a multiple of a tile, the longest padded to
// 128 in the graph) and 70 sequences of 1..9 tokens (two launches of the
// offsets' kernel); causal and not. The counts say that each module's
// forward and backward ran as one ragged cuDNN call each: the per-sequence
// fallback would make a call per sequence and pass the same bars. MultiHead
// D = 128 (values 256 wide) has its forward there and its backward one
// sequence at a time (ragged_backward_max_dv). (cuDNN refuses
// ragged statistics in the backward before Hopper, so on sm_8x the backward
// falls back and the count fails by design: run this on sm_90 or newer.)
TEST_CASE("cuda: packed batches on cuDNN's ragged layout") {
  if (!built_with_cudnn) {
    MESSAGE("this build has no cuDNN attention (CMake found no cuDNN or no cudnn_frontend.h): not run");
    return;
  }
  const policy::cuda p{.attention = policy::cuda_attention::cudnn, .cudnn_ragged = true};
  auto& calls = p.context->attention_calls;
  const std::vector<index_t> few{0, 37, 38, 150, 213};
  std::vector<index_t> many{0};
  for (index_t s = 0; s < 70; ++s) many.push_back(many.back() + 1 + s % 9);
  long long expected = 0;
  auto both_types = [&](const std::string& label, auto make, index_t C, const std::vector<index_t>& sequences,
                        int ragged_calls = 2) {
    const shape_t<3> shape{1, sequences.back(), C};
    const std::string name = label + " " + std::to_string(sequences.size() - 1) + " sequences";
    check_module<Eigen::half>(name, make, shape, p, sequences);
    check_module<Eigen::bfloat16>(name, make, shape, p, sequences);
    expected += 2 * ragged_calls;  // in each of the two types
  };
  const long long before = calls[static_cast<std::size_t>(attention_path::cudnn_ragged)].load();
  both_types("MultiHead D=64 h=4 g=2", multihead_d64({1, 1, 4, 2, true}), 128, few);
  both_types("MultiHead D=64 h=4 g=2 non-causal", multihead_d64({1, 1, 4, 2, false}), 128, few);
  both_types("MultiHead D=64 h=2 g=1", multihead_d64({1, 1, 2, 1, true}), 128, many);
  both_types("MultiHead D=128", multihead_d128, 256, few, 1);  // the forward only
  both_types("Attention D=64", attention_d64, 128, few);
  both_types(
      "MultiHeadV2 D=64", []<class U, class P>(P q) {
        return MultiHeadV2<U, dynamic, P>({.d_model = 128, .heads = 2, .kv_heads = 1, .head_dim = 64}, q);
      },
      128, few);
  const long long on_ragged = calls[static_cast<std::size_t>(attention_path::cudnn_ragged)].load() - before;
  MESSAGE("attention calls on cuDNN's ragged layout: " << on_ragged << " (one per packed forward or backward: "
                                                       << expected << ")");
  CHECK(on_ragged == expected);
}

TEST_CASE("cuda: baseline Attention and DecoderLayer") {
  for (const auto& [path, on_path] : attention_paths()) {
    check_all_types("Attention D=64" + path, attention_d64, {2, 77, 128}, on_path);
    check_all_types(
        "DecoderLayer D=64" + path,
        []<class U, class P>(P p) {
          return DecoderLayer<U, 64, P>({{.d_model = 128, .heads = 2, .kv_heads = 1, .layer_index = 3}, 192}, p);
        },
        {2, 70, 128}, on_path);
  }
}

TEST_CASE("cuda: MultiHeadV2 (tensor-core attention over 2h query heads, the head combination), baseline, layer") {
  for (const auto& [path, on_path] : attention_paths()) {
    for (const auto& c : cases) {
      check_all_types(
          "MultiHeadV2 D=64 " + describe(c) + path,
          [c]<class U, class P>(P p) {
            return MultiHeadV2<U, dynamic, P>(
                {.d_model = 128, .heads = c.heads, .kv_heads = c.kv_heads, .causal = c.causal, .head_dim = 64}, p);
          },
          {c.batch, c.seq, 128}, on_path);
    }
    check_all_types(
        "MultiHeadV2 D=128 baseline" + path,
        []<class U, class P>(P p) {
          return MultiHeadV2<U, 128, P>({.d_model = 256, .heads = 2, .kv_heads = 1, .differential = false}, p);
        },
        {1, 150, 256}, on_path);
    check_all_types(
        "DecoderLayerV2 D=64" + path,
        []<class U, class P>(P p) { return DecoderLayerV2<U, 64, P>({{.d_model = 128, .heads = 3, .kv_heads = 2}, 192}, p); },
        {2, 70, 128}, on_path);
  }
}

// float64 runs in double throughout (CUDA-core attention at every head size,
// cuBLASLt in CUBLAS_COMPUTE_64F), against the reference, also in double: the
// two differ only in the order of their sums, FMA contraction and the last bit
// of exp/log, so they are held to testing::tolerance<double> (72 u = 8.0e-15
// forward, 288 u = 3.2e-14 for gradients): the same multiple of u as float32's
// bar, since the float64 kernels are the float32 ones with u = 2^-53 (simd
// against the reference in float64 lands near 1 u and 7 u on a DecoderLayer).
// Any float rounding left in the path would show as ~1e-7, 10^7 times the bar.
TEST_CASE("cuda: float64 MultiHead and DecoderLayer, double throughout") {
  for (const auto& c : cases) {
    check_module<double>(
        "MultiHead D=64 " + describe(c),
        [c]<class U, class P>(P p) {
          return MultiHead<U, 64, P>({.d_model = 128, .heads = c.heads, .kv_heads = c.kv_heads, .layer_index = 2,
                                      .rope_theta = 10000.0, .causal = c.causal},
                                     p);
        },
        {c.batch, c.seq, 128});
    check_module<double>(
        "MultiHead D=8 " + describe(c),
        [c]<class U, class P>(P p) {
          return MultiHead<U, 8, P>({.d_model = 48, .heads = c.heads, .kv_heads = c.kv_heads, .causal = c.causal}, p);
        },
        {c.batch, c.seq, 48});
  }
  // d = 128 with two maps: the largest double tiles (8 rows, 32 KiB of shared memory).
  check_module<double>(
      "MultiHead D=128",
      []<class U, class P>(P p) { return MultiHead<U, 128, P>({.d_model = 256, .heads = 2, .kv_heads = 1}, p); },
      {1, 150, 256});
  check_module<double>(
      "Attention D=64",
      []<class U, class P>(P p) { return Attention<U, 64, P>({.d_model = 128, .heads = 4, .kv_heads = 2}, p); },
      {2, 77, 128});
  check_module<double>(
      "DecoderLayer D=64",
      []<class U, class P>(P p) {
        return DecoderLayer<U, 64, P>({{.d_model = 128, .heads = 2, .kv_heads = 1, .layer_index = 3}, 192}, p);
      },
      {2, 70, 128});
}

// A decode step synchronises (its logits come back), and a pool with the
// default release threshold would hand its memory back to the driver there.
TEST_CASE("cuda: keep_freed_memory's pool keeps freed memory until asked to release it") {
  int device = 0;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  cuda_context context(device);
  context.keep_freed_memory();  // a pool of its own: no other case's tensors in it
  constexpr std::size_t bytes = std::size_t{64} << 20;
  context.memory->deallocate(context.memory->allocate(bytes), bytes);
  context.synchronize();
  const std::uint64_t kept = context.reserved_bytes();
  CHECK(kept >= bytes);
  void* again = context.memory->allocate(bytes);
  CHECK(context.reserved_bytes() == kept);  // served from what was kept
  context.memory->deallocate(again, bytes);
  context.release_cached_memory();
  CHECK(context.reserved_bytes() == 0);
}

TEST_CASE("cuda: Embedding and CrossEntropyLoss with token ids on the device") {
  check_embedding_and_cross_entropy<float>();
  check_embedding_and_cross_entropy<double>();
}

TEST_CASE("cuda: LanguageModel forward and backward") {
  check_language_model<float>();
  check_language_model<double>();
}

// Decoding over a key/value cache (the split-K kernel and the combine) against
// the reference: one and two maps, head sizes 64, 128 (dv = 256 with two maps:
// two value columns per thread) and 6, T = 1 and 3 new tokens, sequences of
// different lengths (300 keys: several splits; 1 or 3: one split of one tile).
// float64 is held to its own tolerance (double throughout).
TEST_CASE("cuda: attention_decode against the reference") {
  const index_t S = 320;
  for (const index_t d : {64, 128, 6})
    for (const index_t new_tokens : {1, 3}) {
      const std::vector<index_t> lengths{new_tokens, 37, 300};
      check_attention_decode<float, 1>(new_tokens, d, lengths, S);
      check_attention_decode<float, 2>(new_tokens, d, lengths, S);
      check_attention_decode<Eigen::bfloat16, 1>(new_tokens, d, lengths, S);
      check_attention_decode<Eigen::bfloat16, 2>(new_tokens, d, lengths, S);
      check_attention_decode<double, 1>(new_tokens, d, lengths, S);
      check_attention_decode<double, 2>(new_tokens, d, lengths, S);
    }
  // T (H/G) = 18 query rows per group: two row blocks of at most 16. With
  // splits of 128 keys (what an H100 gets here), 257 keys leave a last split
  // of one key, which only the last new token sees: the other rows combine a
  // split that has no key for them.
  check_attention_decode<float, 2>(9, 6, {9, 257, 130}, S);
  check_attention_decode<double, 2>(9, 6, {9, 257, 130}, S);
  // 70 sequences: two launches (64 lengths per kernel parameter, then 6).
  std::vector<index_t> many(70);
  for (std::size_t b = 0; b < many.size(); ++b) many[b] = 2 + static_cast<index_t>(b * 7 % 62);
  check_attention_decode<float, 2>(2, 6, many, 64);
  check_attention_decode<double, 1>(2, 6, many, 64);

  // Bad input: the reference's input_error, before anything is written.
  policy::cuda p;
  const index_t B = 3, T = 1, H = 4, G = 2, d = 6;
  Tensor<float, 5> q({B, T, H, 2, d}, p.memory()), k({B, S, G, 2, d}, p.memory());
  Tensor<float, 4> v({B, S, G, 2 * d}, p.memory()), o({B, T, H, 2 * d}, p.memory());
  Tensor<float, 1> lambda({1}, p.memory());
  const std::vector<index_t> too_long{1, 321, 37};
  test_support::expect_input_error(
      [&] {
        attention_decode<2>(p, q.const_view(), k.const_view(), v.const_view(), too_long, lambda.const_view(),
                            o.view());
      },
      "attention_decode", "lengths", "lengths in [T, S] = [1, 320]", "321 for sequence 1");
  const auto untouched = to_host(o.data(), o.size(), p);
  CHECK(std::all_of(untouched.begin(), untouched.end(), [](double x) { return x == 0.0; }));
  // A head size past the kernel's: the attention_forward limit on this policy.
  Tensor<float, 5> q_wide({1, 1, H, 2, 130}, p.memory()), k_wide({1, 8, G, 2, 130}, p.memory());
  Tensor<float, 4> v_wide({1, 8, G, 260}, p.memory()), o_wide({1, 1, H, 260}, p.memory());
  const std::vector<index_t> one{1};
  test_support::expect_input_error(
      [&] {
        attention_decode<2>(p, q_wide.const_view(), k_wide.const_view(), v_wide.const_view(), one,
                            lambda.const_view(), o_wide.view());
      },
      "attention_decode", "q", "a head size d <= 128", "d = 130");
}

TEST_CASE("cuda: prefill, decode and packed batches against the reference forward") {
  auto multihead = []<class U, class P>(P p) {
    return MultiHead<U, 64, P>({.d_model = 256, .heads = 2, .kv_heads = 1, .layer_index = 1}, p);
  };
  auto decoder = []<class U, class P>(P p) { return DecoderLayer<U, 8, P>({{.d_model = 48, .heads = 3}}, p); };
  auto baseline = []<class U, class P>(P p) { return Attention<U, 64, P>({.d_model = 256, .heads = 4, .kv_heads = 2}, p); };
  check_inference<float>("MultiHead D=64", multihead, 256);
  check_inference<double>("MultiHead D=64", multihead, 256);
  check_inference<float>("DecoderLayer D=8", decoder, 48);
  auto v2 = []<class U, class P>(P p) {
    return MultiHeadV2<U, dynamic, P>({.d_model = 256, .heads = 2, .kv_heads = 1, .head_dim = 64}, p);
  };
  check_inference<float>("MultiHeadV2 D=64", v2, 256);
  for (const auto& [path, on_path] : attention_paths()) {  // bfloat16's prefill on each attention path
    check_inference<Eigen::bfloat16>("MultiHead D=64" + path, multihead, 256, on_path);
    check_inference<Eigen::bfloat16>("Attention D=64" + path, baseline, 256, on_path);
    check_inference<Eigen::bfloat16>("MultiHeadV2 D=64" + path, v2, 256, on_path);
  }
}

int main(int argc, char** argv) {
  if (!cuda_device_available()) {
    std::printf("cuda_test: skipped, no CUDA device on this machine\n");
    return 77;
  }
  return doctest::Context(argc, argv).run();
}
