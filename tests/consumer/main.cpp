// MultiHead forward and backward through an installed difftx; exits non-zero
// if the gradient check fails.
#include <cstdio>

#include <cstring>

#include <difftx/difftx.hpp>
#include <difftx/policy/simd.hpp>

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
  // Linked to difftx::native on x86-64, the simd policy must not be left at the SSE2 baseline.
  const char* isa = policy::simd::instruction_set();
  std::printf("consumer: policy::simd compiled for %s\n", isa);
#if defined(__x86_64__)
  if (std::strcmp(isa, "sse2") == 0) return 1;
#endif
  return check.passed() ? 0 : 1;
}
