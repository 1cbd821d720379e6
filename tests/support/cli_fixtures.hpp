// What the suites of the difftx tool (cli_*_test.cpp, one executable: cli_test)
// share: the PyTorch fixtures they run the tool on (the decoder_layer fixture
// and the V2 ones), `difftx run` on them, and the comparisons of its results.
#pragma once

#include <filesystem>
#include <string>
#include <utility>

#include <difftx/io/npy.hpp>
#include <difftx/io/safetensors.hpp>
#include <difftx/testing/compare.hpp>
#include <difftx/testing/tolerance.hpp>

#include "support/cli_run.hpp"
#include "support/temp_folder.hpp"

// The suites' names: `using namespace cli_fixtures;` brings difftx's and these.
namespace cli_fixtures {

using namespace difftx;
using testing::normwise_difference;
using test_support::check_message;
using test_support::difftx_cli;
using test_support::expect_usage_error;
using test_support::outcome;
using test_support::q;
using test_support::read_text;
using test_support::shell_command;

inline const std::filesystem::path data_dir = DIFFTX_TEST_DATA;
inline const std::string fixture_weights = (data_dir / "decoder_layer.safetensors").string();
inline const std::string fixture_input = (data_dir / "npy" / "decoder_layer.input.f64.npy").string();
inline const std::string fixture_grad_output = (data_dir / "npy" / "decoder_layer.grad_output.f64.npy").string();
// The decoder_layer fixture's configuration beyond what its weights say.
inline const std::string fixture_flags = " --module decoder_layer --layer-index 2";

// A copy of the fixture's weights with `edit` applied, written to path.
template <class Edit>
std::string edited_weights(const std::filesystem::path& path, Edit&& edit) {
  auto weights = io::read_safetensors(fixture_weights);
  edit(weights);
  io::write_safetensors(path, weights);
  return q(path);
}

inline double difference(const io::stored_tensor& ours, const io::stored_tensor& reference, double floor = 0) {
  REQUIRE(ours.shape == reference.shape);
  const auto a = ours.values(), b = reference.values();
  return normwise_difference(a.data(), b.data(), static_cast<index_t>(b.size()), floor);
}

// The values of t rounded through `type` (what a module in that type holds), stored as float32.
inline io::stored_tensor rounded_to(const io::stored_tensor& t, io::dtype type) {
  return io::stored_tensor::from_values(io::dtype::f32, t.shape, io::stored_tensor::from_values(type, t.shape, t.values()).values());
}

struct run_files {
  io::stored_tensor output, grad_input;
  io::tensor_file grad_weights;
};

// difftx run on the given files, writing into folder; the run must succeed.
inline run_files run_module(const test_support::temp_folder& folder, const std::string& weights, const std::string& input,
                     const std::string& grad_output, const std::string& dtype) {
  const auto r = difftx_cli("run" + fixture_flags + " --kv-heads 1 --weights " + weights + " --input " + input + " --grad-output " +
                            grad_output + " --output " + q(folder / "y.npy") + " --grad-input " + q(folder / "dx.npy") +
                            " --grad-weights " + q(folder / "dw.safetensors") + " --dtype " + dtype);
  INFO("stderr: " << r.err);
  REQUIRE(r.code == 0);
  return {io::read_npy(folder / "y.npy"), io::read_npy(folder / "dx.npy"), io::read_safetensors(folder / "dw.safetensors")};
}

// The output's difference from the reference run, and the worst of dx and
// every weight gradient, each against at least a tenth of the largest reference
// gradient, as every suite compares them (testing::gradient_floor_fraction).
inline std::pair<double, double> differences(const run_files& ours, const run_files& reference) {
  double scale = testing::max_abs(reference.grad_input.values().data(), reference.grad_input.size());
  for (const auto& [name, t] : reference.grad_weights.tensors) scale = std::max(scale, testing::max_abs(t.values().data(), t.size()));
  const double floor = testing::gradient_floor_fraction * scale;
  double backward = difference(ours.grad_input, reference.grad_input, floor);
  for (const auto& [name, t] : reference.grad_weights.tensors)
    backward = std::max(backward, difference(ours.grad_weights.at(name, "test", "dw"), t, floor));
  return {difference(ours.output, reference.output), backward};
}

// The V2 fixtures (tools/make_fixtures.py): the module and the flags their
// metadata needs beyond what the weights say.
struct v2_fixture {
  const char* name;
  const char* flags;
};
inline constexpr v2_fixture v2_fixtures[] = {
    {"multihead_v2_causal", "--module multihead_v2"},
    {"multihead_v2_gqa_noncausal", "--module multihead_v2 --no-causal --rope-theta 500"},  // h = 3, g = 2, D = 6
    {"multihead_v2_n1", "--module multihead_v2"},                                           // N = 1, D = 2
    {"multihead_v2_baseline", "--module multihead_v2 --heads 4"},  // differential off: no lambda_proj
    {"decoder_layer_v2", "--module decoder_layer_v2"},
};

// difftx run on a V2 fixture's weights, input and grad_output (written to
// folder as .npy), with extra flags; the run must succeed.
inline run_files run_v2_fixture(const test_support::temp_folder& folder, const std::string& name, const std::string& extra,
                         const std::string& flags = "") {
  const auto weights = data_dir / (name + ".safetensors");
  const auto f = io::read_safetensors(weights);
  io::write_npy(folder / "x.npy", f.at("input", "test", "fixture"));
  io::write_npy(folder / "dy.npy", f.at("grad_output", "test", "fixture"));
  std::string module_flags = flags;
  if (module_flags.empty())
    for (const auto& fx : v2_fixtures)
      if (name == fx.name) module_flags = fx.flags;
  const auto r = difftx_cli("run " + module_flags + " " + extra + " --weights " + q(weights) + " --input " +
                            q(folder / "x.npy") + " --grad-output " + q(folder / "dy.npy") + " --output " +
                            q(folder / "y.npy") + " --grad-input " + q(folder / "dx.npy") + " --grad-weights " +
                            q(folder / "dw.safetensors"));
  INFO("difftx run " << module_flags << " " << extra << " on " << name << "; stderr: " << r.err);
  REQUIRE(r.code == 0);
  return {io::read_npy(folder / "y.npy"), io::read_npy(folder / "dx.npy"), io::read_safetensors(folder / "dw.safetensors")};
}

// The fixture's own output, grad_input and weight gradients (grad.<name>) as run_files.
inline run_files v2_fixture_results(const std::string& name) {
  const auto f = io::read_safetensors(data_dir / (name + ".safetensors"));
  run_files expected{f.at("output", "test", "fixture"), f.at("grad_input", "test", "fixture"), {}};
  for (const auto& [tensor, t] : f.tensors)
    if (tensor.rfind("grad.", 0) == 0) expected.grad_weights.tensors[tensor.substr(5)] = t;
  return expected;
}

// Whether the tool runs --policy cuda here: built without CUDA, built with it
// but no device, or ready. The "cli gpu:" cases assert what a user sees in each.
enum class cuda_in_tool { not_built, no_device, ready };
inline cuda_in_tool probe_cuda() {
  const auto probe = difftx_cli("bench --policy cuda --module rmsnorm --batch 1 --seq 1 --d-model 8 --repeats 1");
  if (probe.code == 0) return cuda_in_tool::ready;
  return probe.err.find("is not built into") != std::string::npos ? cuda_in_tool::not_built : cuda_in_tool::no_device;
}

}  // namespace cli_fixtures
