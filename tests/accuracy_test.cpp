// Low-precision accuracy against PyTorch, FlashAttention's rule: in bfloat16
// and float16, difftx's error against a float64 reference is at most twice
// PyTorch's own error against the same reference, on the same inputs and
// weights, for the output, dx and every parameter gradient of MultiHead and
// DecoderLayer, on policy::reference and policy::simd.
//
// tools/make_fixtures.py --lowp wrote tests/data/lowp_<module>_<bf16|f16>:
// input, weights and dY rounded to the type (so both sides start from the same
// numbers), the float64 reference output and gradients computed from them, and
// "torch.<name>": PyTorch's own run with module, parameters and input in the
// type and autograd in it (stored in the type, losslessly).
//
// Metric, per tensor: max_i |x_i - ref_i|, as FlashAttention's tests. It is
// printed divided by max_i |ref_i| (testing::normwise_difference), the same
// divisor on both sides, so the comparison is unchanged and the numbers read
// as fractions of the tensor's scale.
//
// Why 2x: a bar set from our own measurements only says we have not changed;
// PyTorch's error on the same problem measures what the type allows for an
// implementation users accept. Summation order and where intermediates are
// rounded legitimately differ between implementations, so an equally careful
// one lands within a small factor of PyTorch's error, either side; 2x is
// FlashAttention's factor for that.
//
// How much one fixture says: a maximum over many independent errors is stable,
// but the four lambda gradients carry one scalar error each (dλ's, times a
// fixed vector), and the q/k/x gradients' maximum can sit on one or two
// ill-conditioned tokens (in a case examined, a query with two near-equal
// logits of 8.1, where P moves at first order with their rounding). There the
// rule compares a few random draws: over 40 other seeds of these shapes our median ratio is 0.45-0.67
// (lambda) and 0.6 (the rest), yet a lambda tensor exceeds 2x in 3-10 of 40
// seeds per file and a q/k/x gradient in 2 of 40 (decoder, bfloat16). These
// fixtures (the first seeds tried) pass with a worst ratio of 1.43; a change
// that only reorders sums can move a lambda ratio past 2 without being less
// accurate.
//
// Zero: PyTorch's results are numbers of the type, and none is nearer ref_i
// than ref_i rounded to the type, so its error is at least the rounding floor
// max_i |round(ref_i) - ref_i| (printed, and checked). It is 0 only if every
// ref_i is representable and PyTorch hits each exactly; the rule then asks
// the same exactness of us. That is the rule as stated, with no special case
// and no division by it.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <difftx/difftx.hpp>
#include <difftx/io/parameters.hpp>
#include <difftx/io/safetensors.hpp>
#include <difftx/policy/simd.hpp>
#include <difftx/testing/compare.hpp>

#include "support/compare_modules.hpp"

using namespace difftx;
using testing::normwise_difference;

namespace {

const std::filesystem::path data_dir = DIFFTX_TEST_DATA;
constexpr index_t head_dim = 8;  // of every lowp fixture

index_t meta_int(const io::tensor_file& f, const std::string& key) { return std::stoll(f.meta(key, "fixture", key)); }
double meta_double(const io::tensor_file& f, const std::string& key) { return std::stod(f.meta(key, "fixture", key)); }

MultiHeadConfig multihead_config(const io::tensor_file& f) {
  return {.d_model = meta_int(f, "d_model"), .heads = meta_int(f, "heads"), .kv_heads = meta_int(f, "kv_heads"),
          .layer_index = meta_int(f, "layer_index"), .rope_theta = meta_double(f, "rope_theta"),
          .causal = meta_int(f, "causal") != 0};
}

// The rule for one tensor: ours (n values of T) against the fixture's name
// (the float64 reference) and torch.<name> (PyTorch's run in T).
template <class T>
void check_tensor(const io::tensor_file& f, const std::string& label, const std::string& name, const T* ours) {
  const auto ref = f.at(name, "accuracy", label).values();
  const auto torch = f.at("torch." + name, "accuracy", label).values();
  REQUIRE(torch.size() == ref.size());
  const auto n = static_cast<index_t>(ref.size());
  std::vector<double> rounded(ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) rounded[i] = test_support::round_through<double, T>(ref[i]);
  const double e_ours = normwise_difference(ours, ref.data(), n);
  const double e_torch = normwise_difference(torch.data(), ref.data(), n);
  const double e_round = normwise_difference(rounded.data(), ref.data(), n);
  MESSAGE(label << ": " << name << ": ours " << e_ours << ", torch " << e_torch << " (ratio " << e_ours / e_torch
                << "; rounding floor " << e_round << ")");
  INFO(label << ": " << name << ": ours " << e_ours << ", torch " << e_torch);
  CHECK(e_torch >= e_round);
  CHECK(e_ours <= 2 * e_torch);
}

// Loads the fixture's weights, runs forward and backward on its input and
// dY in T, and checks the output, dx and every parameter gradient.
template <class Module>
void check_module(Module& module, const io::tensor_file& f, const std::string& label) {
  using T = typename Module::value_type;
  REQUIRE(f.meta("dtype", "fixture", label) == scalar_traits<T>::name);
  REQUIRE(meta_int(f, "head_dim") == module.head_dim());
  io::load_parameters(module, f, label);
  const shape_t<3> shape{meta_int(f, "batch"), meta_int(f, "seq"), meta_int(f, "d_model")};
  const auto x = f.at("input", "accuracy", label).template to_tensor<T, 3>("accuracy", "input", shape);
  const auto dy = f.at("grad_output", "accuracy", label).template to_tensor<T, 3>("accuracy", "grad_output", shape);
  const auto [y, dx] = test_support::run_forward_backward(module, x, dy);
  check_tensor(f, label, "output", y.data());
  check_tensor(f, label, "grad_input", dx.data());
  for (const auto& p : module.parameters()) check_tensor(f, label, "grad." + p.name, p.grad);
}

// Every (type, policy) pair on the module's two fixtures; make<T, Policy>(file).
template <class Make>
void check_all(const std::string& module, Make make) {
  auto run = [&]<class T, class Policy>(const std::string& suffix) {
    const std::string name = "lowp_" + module + "_" + suffix;
    const auto f = io::read_safetensors(data_dir / (name + ".safetensors"));
    auto m = make.template operator()<T, Policy>(f);
    check_module(m, f, name + " " + Policy::name);
  };
  run.template operator()<Eigen::bfloat16, policy::reference>("bf16");
  run.template operator()<Eigen::bfloat16, policy::simd>("bf16");
  run.template operator()<Eigen::half, policy::reference>("f16");
  run.template operator()<Eigen::half, policy::simd>("f16");
}

}  // namespace

TEST_CASE("accuracy: MultiHead in bfloat16 and float16 within 2x of PyTorch's error") {
  check_all("multihead", []<class T, class Policy>(const io::tensor_file& f) {
    return MultiHead<T, head_dim, Policy>(multihead_config(f), Policy{});
  });
}

TEST_CASE("accuracy: DecoderLayer in bfloat16 and float16 within 2x of PyTorch's error") {
  check_all("decoder_layer", []<class T, class Policy>(const io::tensor_file& f) {
    return DecoderLayer<T, head_dim, Policy>({multihead_config(f), meta_int(f, "ffn_dim"), meta_double(f, "eps")},
                                             Policy{});
  });
}
