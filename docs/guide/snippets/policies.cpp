// docs/guide/policies.md's code: the same layer on the reference policy and
// on policy::simd with its options, in float and bfloat16, weights copied
// across by name. CTest runs it: the three outputs must agree.
#include <algorithm>
#include <cmath>
#include <iostream>

#include <difftx/difftx.hpp>
#include <difftx/policy/simd.hpp>

using namespace difftx;

int main() {
  const DecoderLayerConfig config{{.d_model = 64, .heads = 2, .kv_heads = 1}};
  Tensor<float, 3> x({1, 33, 64}), y_ref(x.shape()), y_simd(x.shape());
  random_stream rng(2);
  fill_normal(x.view(), rng);
  // [policies-snippet]
  DecoderLayer<float, 16> oracle(config);                          // policy::reference: plain loops
  policy::simd simd{.threads = 2,                                  // 0: omp_get_max_threads()
                    .bf16_products = policy::bf16_product::automatic,
                    .matmuls = policy::simd::matmul_library::automatic};
  DecoderLayer<float, 16, policy::simd> fast(config, simd);
  DecoderLayer<Eigen::bfloat16, 16, policy::simd> half(config, simd);  // stored in bfloat16, computed in float
  copy_parameters(oracle, fast);                                   // by name, after checking every shape
  copy_parameters(oracle, half);                                   // rounded to bfloat16
  std::cout << policy::simd::instruction_set() << ", bfloat16 products: "
            << (simd.bf16_product_used() == policy::bf16_product::dot_instructions ? "vdpbf16ps" : "converting") << "\n";
  // [policies-snippet]
  oracle.forward(x, y_ref);
  fast.forward(x, y_simd);
  Tensor<Eigen::bfloat16, 3> x16(x.shape()), y16(x.shape());
  std::transform(x.data(), x.data() + x.size(), x16.data(), [](float v) { return Eigen::bfloat16(v); });
  half.forward(x16, y16);
  double worst_simd = 0, worst_bf16 = 0, largest = 0;
  for (index_t i = 0; i < x.size(); ++i) {
    largest = std::max(largest, std::abs(double(y_ref.data()[i])));
    worst_simd = std::max(worst_simd, std::abs(double(y_simd.data()[i]) - y_ref.data()[i]));
    worst_bf16 = std::max(worst_bf16, std::abs(double(float(y16.data()[i])) - y_ref.data()[i]));
  }
  std::cout << "simd vs reference " << worst_simd / largest << ", bfloat16 vs reference " << worst_bf16 / largest << "\n";
  return worst_simd / largest < 1e-5 && worst_bf16 / largest < 5e-2 ? 0 : 1;
}
