// MultiHead forward and backward through an installed difftx; exits non-zero
// if the gradient check fails.
#include <cstdio>

#include <difftx/difftx.hpp>

int main() {
  using namespace difftx;
  MultiHead<double, 8> attention({.d_model = 32, .heads = 2, .kv_heads = 1});
  Tensor<double, 3> x({1, 6, 32}), y({1, 6, 32}), dy({1, 6, 32}), dx({1, 6, 32});
  random_stream rng(1);
  fill_normal(x.view(), rng);
  fill_normal(dy.view(), rng);
  MultiHead<double, 8>::saved_type saved;
  attention.forward(x.view(), y.view(), saved);
  attention.backward(x.view(), dy.view(), saved, dx.view());
  testing::gradcheck_options options;
  options.max_entries_per_tensor = 16;
  const auto check = testing::gradcheck(attention, x.view(), options);
  std::printf("consumer: MultiHead forward/backward ok, gradcheck worst %.2e (%s)\n", check.worst_error(),
              check.passed() ? "pass" : "FAIL");
  return check.passed() ? 0 : 1;
}
