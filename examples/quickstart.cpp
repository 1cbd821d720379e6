// The README's ten lines of C++, compiled and run by CTest so they cannot go stale.
#include <iostream>

#include <difftx/difftx.hpp>

int main() {
  using namespace difftx;
  // [readme-snippet]
  DecoderLayer<float, 64> layer({{.d_model = 512, .heads = 4}});  // 4 differential heads of 2 x 64
  Tensor<float, 3> x({2, 128, 512}), y(x.shape()), dy(x.shape()), dx(x.shape());
  DecoderLayer<float, 64>::saved_type saved;                      // what the backward needs
  layer.forward(x, y, saved);                                     // y = layer(x)
  layer.backward(x, dy, saved, dx);                               // dx; parameter gradients accumulate
  for (auto& p : layer.parameters()) std::cout << p.name << "\n";  // attn_norm.weight, attn.q_proj.weight, ...

  DecoderLayer<double, 4> small({{.d_model = 16, .heads = 2}});   // gradcheck wants double or long double
  Tensor<double, 3> x64({1, 5, 16});
  random_stream rng(1);
  fill_normal(x64.view(), rng);
  auto check = testing::gradcheck(small, x64);                    // finite differences vs the backward
  std::cout << check.report() << (check.passed() ? "pass\n" : "FAIL\n");
  // [readme-snippet]
  return check.passed() ? 0 : 1;
}
