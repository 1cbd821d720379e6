// A two-layer Differential Transformer stack in float64 and float32: forward,
// backward, a gradient check of the float64 stack against finite differences,
// and the float32 stack compared with it. Prints one table.
#include <chrono>
#include <cstdio>
#include <vector>

#include <difftx/difftx.hpp>

using namespace difftx;

constexpr index_t D = 8;  // half head size: each differential head is 2 x 8 wide

template <class T>
Stack<DecoderLayer<T, D>> make_stack() {
  std::vector<DecoderLayer<T, D>> layers;
  for (index_t l = 0; l < 2; ++l)
    layers.emplace_back(DecoderLayerConfig{{.d_model = 32, .heads = 2, .kv_heads = 1, .layer_index = l}, 64});
  return Stack<DecoderLayer<T, D>>(std::move(layers));
}

struct run_result {
  double forward_ms, backward_ms;
  Tensor<double, 3> out, dx;
  std::vector<std::vector<double>> grads;
};

template <class T>
run_result run(Stack<DecoderLayer<T, D>>& stack, const Tensor<double, 3>& x64, const Tensor<double, 3>& dy64) {
  auto to_T = [](const Tensor<double, 3>& a) {
    Tensor<T, 3> b(a.shape());
    for (index_t i = 0; i < a.size(); ++i) b.data()[i] = scalar_traits<T>::from_double(a.data()[i]);
    return b;
  };
  auto to_double = [](const Tensor<T, 3>& a) {
    Tensor<double, 3> b(a.shape());
    for (index_t i = 0; i < a.size(); ++i) b.data()[i] = scalar_traits<T>::to_double(a.data()[i]);
    return b;
  };
  const auto x = to_T(x64), dy = to_T(dy64);
  Tensor<T, 3> out(x.shape()), dx(x.shape());
  typename Stack<DecoderLayer<T, D>>::saved_type saved;
  zero_grad(stack);
  const auto t0 = std::chrono::steady_clock::now();
  stack.forward(x.view(), out.view(), saved);
  const auto t1 = std::chrono::steady_clock::now();
  stack.backward(x.view(), dy.view(), saved, dx.view());
  const auto t2 = std::chrono::steady_clock::now();
  run_result r{std::chrono::duration<double, std::milli>(t1 - t0).count(),
               std::chrono::duration<double, std::milli>(t2 - t1).count(), to_double(out), to_double(dx), {}};
  for (const auto& p : stack.parameters()) {
    r.grads.emplace_back();
    for (index_t i = 0; i < p.size(); ++i) r.grads.back().push_back(scalar_traits<T>::to_double(p.grad[i]));
  }
  return r;
}

// max |a - b| / max |b|
double difference(const double* a, const double* b, std::size_t n) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

int main() {
  auto stack64 = make_stack<double>();
  random_stream init(7);
  stack64.reset_parameters(init);
  auto stack32 = make_stack<float>();
  {  // the same weights, rounded to float
    auto dst = stack32.parameters();
    auto src = stack64.parameters();
    for (std::size_t i = 0; i < dst.size(); ++i)
      for (index_t e = 0; e < dst[i].size(); ++e) dst[i].value[e] = static_cast<float>(src[i].value[e]);
  }

  Tensor<double, 3> x({2, 9, 32}), dy({2, 9, 32});
  random_stream rng(11);
  fill_normal(x.view(), rng);
  fill_normal(dy.view(), rng);

  const auto r64 = run(stack64, x, dy);
  const auto r32 = run(stack32, x, dy);
  double worst_grad32 = difference(r32.dx.data(), r64.dx.data(), static_cast<std::size_t>(x.size()));
  for (std::size_t i = 0; i < r64.grads.size(); ++i)
    worst_grad32 = std::max(worst_grad32, difference(r32.grads[i].data(), r64.grads[i].data(), r64.grads[i].size()));

  testing::gradcheck_options options;
  options.max_entries_per_tensor = 24;  // a seeded sample per tensor keeps this to seconds
  const auto check = testing::gradcheck(stack64, x.view(), options);

  std::printf("difftx: 2 x DecoderLayer (C = 32, h = 2, g = 1, D = 8, F = 64), input [2, 9, 32], policy reference\n\n");
  std::printf("| dtype   | forward ms | backward ms | output vs float64 | gradients vs float64 | gradcheck worst error   |\n");
  std::printf("|---------|-----------:|------------:|------------------:|---------------------:|-------------------------|\n");
  char verdict[32];
  std::snprintf(verdict, sizeof verdict, "%.2e (%s)", check.worst_error(), check.passed() ? "pass" : "FAIL");
  std::printf("| float64 | %10.2f | %11.2f | %17s | %20s | %-23s |\n", r64.forward_ms, r64.backward_ms, "-", "-",
              verdict);
  std::printf("| float32 | %10.2f | %11.2f | %17.2e | %20.2e | %-23s |\n", r32.forward_ms, r32.backward_ms,
              difference(r32.out.data(), r64.out.data(), static_cast<std::size_t>(x.size())), worst_grad32,
              "(float64 only)");
  std::printf("\nworst gradcheck entry: %s, over %zu tensors\n", check.where().c_str(), check.tensors.size());
  return check.passed() ? 0 : 1;
}
