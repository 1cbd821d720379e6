// The difftx tool run as a user runs it (the built binary, DIFFTX_CLI): exit
// codes and one-line messages for each usage and bad-input class, `run`
// reproducing a PyTorch fixture (V1 and V2), `check` passing, `bench` reporting
// what it promises, with FLOPs counted by hand for small shapes, `generate`
// decoding what full forwards decode, and `retrieval --arch` putting V2 beside
// DIFF and the Transformer.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include <difftx/difftx.hpp>
#include <difftx/io/mapped_safetensors.hpp>
#include <difftx/io/npy.hpp>
#include <difftx/io/parameters.hpp>
#include <difftx/io/safetensors.hpp>
#include <difftx/policy/simd/bf16_product.hpp>
#include <difftx/testing/compare.hpp>
#include <difftx/testing/tolerance.hpp>

#include "support/cli_run.hpp"
#include "support/helpers.hpp"
#include "support/temp_folder.hpp"

using namespace difftx;
using testing::normwise_difference;
using test_support::check_message;
using test_support::difftx_cli;
using test_support::expect_usage_error;
using test_support::outcome;
using test_support::q;
using test_support::read_text;
using test_support::shell_command;

namespace {

const std::filesystem::path data_dir = DIFFTX_TEST_DATA;
const std::string fixture_weights = (data_dir / "decoder_layer.safetensors").string();
const std::string fixture_input = (data_dir / "npy" / "decoder_layer.input.f64.npy").string();
const std::string fixture_grad_output = (data_dir / "npy" / "decoder_layer.grad_output.f64.npy").string();
// The decoder_layer fixture's configuration beyond what its weights say.
const std::string fixture_flags = " --module decoder_layer --layer-index 2";

// A copy of the fixture's weights with `edit` applied, written to path.
template <class Edit>
std::string edited_weights(const std::filesystem::path& path, Edit&& edit) {
  auto weights = io::read_safetensors(fixture_weights);
  edit(weights);
  io::write_safetensors(path, weights);
  return q(path);
}

double difference(const io::stored_tensor& ours, const io::stored_tensor& reference, double floor = 0) {
  REQUIRE(ours.shape == reference.shape);
  const auto a = ours.values(), b = reference.values();
  return normwise_difference(a.data(), b.data(), static_cast<index_t>(b.size()), floor);
}

// The values of t rounded through `type` (what a module in that type holds), stored as float32.
io::stored_tensor rounded_to(const io::stored_tensor& t, io::dtype type) {
  return io::stored_tensor::from_values(io::dtype::f32, t.shape, io::stored_tensor::from_values(type, t.shape, t.values()).values());
}

struct run_files {
  io::stored_tensor output, grad_input;
  io::tensor_file grad_weights;
};

// difftx run on the given files, writing into folder; the run must succeed.
run_files run_module(const test_support::temp_folder& folder, const std::string& weights, const std::string& input,
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
std::pair<double, double> differences(const run_files& ours, const run_files& reference) {
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
constexpr v2_fixture v2_fixtures[] = {
    {"multihead_v2_causal", "--module multihead_v2"},
    {"multihead_v2_gqa_noncausal", "--module multihead_v2 --no-causal --rope-theta 500"},  // h = 3, g = 2, D = 6
    {"multihead_v2_n1", "--module multihead_v2"},                                           // N = 1, D = 2
    {"multihead_v2_baseline", "--module multihead_v2 --heads 4"},  // differential off: no lambda_proj
    {"decoder_layer_v2", "--module decoder_layer_v2"},
};

// difftx run on a V2 fixture's weights, input and grad_output (written to
// folder as .npy), with extra flags; the run must succeed.
run_files run_v2_fixture(const test_support::temp_folder& folder, const std::string& name, const std::string& extra,
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
run_files v2_fixture_results(const std::string& name) {
  const auto f = io::read_safetensors(data_dir / (name + ".safetensors"));
  run_files expected{f.at("output", "test", "fixture"), f.at("grad_input", "test", "fixture"), {}};
  for (const auto& [tensor, t] : f.tensors)
    if (tensor.rfind("grad.", 0) == 0) expected.grad_weights.tensors[tensor.substr(5)] = t;
  return expected;
}

}  // namespace

TEST_CASE("cli: --help exits 0 for the tool and each command") {
  auto r = difftx_cli("--help");
  CHECK(r.code == 0);
  for (const char* command : {"run", "check", "bench", "Exit codes"}) CHECK(r.out.find(command) != std::string::npos);
  r = difftx_cli("run --help");
  CHECK(r.code == 0);
  CHECK(r.out.find("--grad-weights") != std::string::npos);
  CHECK(r.out.find("multihead_v2") != std::string::npos);
  CHECK(r.out.find("lambda_proj") != std::string::npos);
  r = difftx_cli("bench --help");
  CHECK(r.code == 0);
  CHECK(r.out.find("--baseline") != std::string::npos);
  CHECK(difftx_cli("retrieval --help").out.find("--arch") != std::string::npos);
  CHECK(r.out.find("N(N+1)/2 causal") != std::string::npos);
  CHECK(r.out.find("without the scores the") != std::string::npos);
  CHECK(difftx_cli("check --help").code == 0);
}

TEST_CASE("cli: usage errors exit 2 with one line saying what is wrong") {
  const std::string run = "run" + fixture_flags + " --kv-heads 1 --weights " + fixture_weights + " --input " + fixture_input +
                          " --output /tmp/difftx_never_written.npy";
  expect_usage_error("", {"subcommand"});
  expect_usage_error("frobnicate", {"frobnicate"});
  expect_usage_error("run --module decoder_layer --input x.npy --output y.npy", {"difftx run", "--weights", "required"});
  expect_usage_error(run + " --bogus", {"--bogus"});
  expect_usage_error(run + " --module transformer", {"--module", "transformer"});
  expect_usage_error(run + " --policy tpu", {"difftx run: --policy: policy 'tpu' is not built into this difftx (built: ",
                                             "reference"});
  expect_usage_error(run + " --dtype float8", {"--dtype", "float8"});
  expect_usage_error(run + " --heads 0", {"--heads"});
  expect_usage_error("run" + fixture_flags + " --weights w --input x --output y --heads 4 --kv-heads 3",
                     {"--kv-heads", "divide"});
  expect_usage_error(run + " --grad-input dx.npy", {"--grad-input", "--grad-output"});
  expect_usage_error("run --module attention --weights w --input x --output y", {"--heads", "attention"});
  expect_usage_error("bench --module multihead --batch 1 --seq 4 --d-model 20 --heads 2", {"--head-dim", "5", "odd"});
  expect_usage_error("bench --module multihead --batch 1 --seq 4 --d-model 20 --heads 3", {"--head-dim", "not divisible"});
  expect_usage_error("bench --module multihead --batch 1 --seq 4 --d-model 16", {"--heads"});
  CHECK_FALSE(std::filesystem::exists("/tmp/difftx_never_written.npy"));
}

TEST_CASE("cli: bad input exits 3 with one line naming the file, the tensor and what was expected, writing nothing") {
  test_support::temp_folder folder;
  const auto output = folder / "y.npy";
  auto run = [&](const std::string& weights, const std::string& input, const std::string& extra = " --kv-heads 1") {
    return difftx_cli("run" + fixture_flags + " --weights " + weights + " --input " + input + " --output " + q(output) +
                      " --grad-output " + fixture_grad_output + " --grad-input " + q(folder / "dx.npy") + extra);
  };
  auto expect_bad_input = [&](const outcome& r, std::initializer_list<std::string> parts) {
    CHECK(r.code == 3);
    check_message(r.err, parts);
    CHECK_FALSE(std::filesystem::exists(output));
    CHECK_FALSE(std::filesystem::exists(folder / "dx.npy"));
  };

  SUBCASE("a missing weight") {
    const auto w = edited_weights(folder / "w.safetensors", [](auto& f) { f.tensors.erase("attn.lambda_k2"); });
    expect_bad_input(run(w, fixture_input), {"w.safetensors", "attn.lambda_k2", "expected a tensor named"});
  }
  SUBCASE("a weight of the wrong shape") {
    const auto w = edited_weights(folder / "w.safetensors", [](auto& f) {
      auto& t = f.tensors.at("ffn.down_proj.weight");
      t.shape = {t.shape[1], t.shape[0]};
    });
    expect_bad_input(run(w, fixture_input), {"w.safetensors", "ffn.down_proj.weight", "expected shape [16, 24]", "[24, 16]"});
  }
  SUBCASE("weights that disagree with the flags") {
    expect_bad_input(run(fixture_weights, fixture_input, " --kv-heads 2"),
                     {"decoder_layer.safetensors", "attn.k_proj.weight", "with g = 2 (--kv-heads)", "[8, 16]"});
    expect_bad_input(run(fixture_weights, fixture_input, " --heads 1 --kv-heads 1"),
                     {"decoder_layer.safetensors", "attn.q_proj.weight", "with h = 1 (--heads) and D = 4", "[16, 16]"});
  }
  SUBCASE("an input of the wrong shape") {
    const auto x = (data_dir / "npy" / "diff_attn_causal.input.q.f64.npy").string();
    expect_bad_input(run(fixture_weights, x), {"diff_attn_causal.input.q.f64.npy: input", "expected shape [B, N, 16]",
                                               "[2, 5, 4, 2, 4]"});
  }
  SUBCASE("a grad_output of another shape than the output") {
    const auto dy = io::read_npy(fixture_grad_output);
    io::write_npy(folder / "dy.npy", io::stored_tensor::from_values(dy.type, {1, 12, 16}, dy.values()));
    const auto r = difftx_cli("run" + fixture_flags + " --kv-heads 1 --weights " + fixture_weights + " --input " +
                              fixture_input + " --output " + q(output) + " --grad-output " + q(folder / "dy.npy"));
    expect_bad_input(r, {"dy.npy: grad_output", "shape [2, 6, 16]", "[1, 12, 16]"});
  }
  SUBCASE("unreadable files") {
    expect_bad_input(run(q(folder / "none.safetensors"), fixture_input), {"none.safetensors", "a readable file", "no such file"});
    expect_bad_input(run(fixture_weights, q(folder.path())), {folder.path().string(), "not a regular file"});
  }
  SUBCASE("malformed files") {
    auto bytes = io::read_file_bytes(fixture_input, "test");
    bytes.resize(bytes.size() - 8);
    std::ofstream(folder / "cut.npy", std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    expect_bad_input(run(fixture_weights, q(folder / "cut.npy")),
                     {"cut.npy: data", "expected 1536 bytes for shape [2, 6, 16] of float64", "1528 bytes"});
    expect_bad_input(run(fixture_input, fixture_input), {"decoder_layer.input.f64.npy: header", "a header size within the file"});
  }
  SUBCASE("non-finite values") {
    auto x = io::read_npy(fixture_input);
    auto values = x.values();
    values[17] = std::numeric_limits<double>::quiet_NaN();
    io::write_npy(folder / "nan.npy", io::stored_tensor::from_values(io::dtype::f64, x.shape, values));
    expect_bad_input(run(fixture_weights, q(folder / "nan.npy")),
                     {"nan.npy: input as float32", "expected finite values", "nan at flat index 17"});
    const auto w = edited_weights(folder / "w.safetensors", [](auto& f) {
      auto& t = f.tensors.at("attn.q_proj.weight");
      auto v = t.values();
      v[3] = std::numeric_limits<double>::infinity();
      t = io::stored_tensor::from_values(t.type, t.shape, v);
    });
    expect_bad_input(run(w, fixture_input), {"w.safetensors: attn.q_proj.weight as float32", "finite", "inf at flat index 3"});
    // Finite in the file, but not in the module's type.
    const auto big = edited_weights(folder / "big.safetensors", [](auto& f) {
      auto& t = f.tensors.at("ffn_norm.weight");
      auto v = t.values();
      v[0] = 1e6;
      t = io::stored_tensor::from_values(t.type, t.shape, v);
    });
    expect_bad_input(run(big, fixture_input, " --kv-heads 1 --dtype float16"), {"big.safetensors: ffn_norm.weight as float16", "inf"});
  }
  CHECK(folder.files().size() <= 4);  // only the inputs this test wrote: no output, no temporary
  for (const auto& name : folder.files()) CHECK(name.find(".tmp") == std::string::npos);
}

TEST_CASE("cli: run reproduces the PyTorch fixture to 1e-10 in float64, on the default policy and the reference") {
  test_support::temp_folder folder;
  const auto f = io::read_safetensors(fixture_weights);
  for (const std::string policy : {"", " --policy reference"}) {
    INFO("policy flag: '" << policy << "'");
    const auto r = run_module(folder, fixture_weights, fixture_input, fixture_grad_output, "float64" + policy);
    CHECK(r.output.type == io::dtype::f64);
    double worst = difference(r.output, f.at("output", "test", "fixture"));
    worst = std::max(worst, difference(r.grad_input, f.at("grad_input", "test", "fixture")));
    std::size_t gradients = 0;
    for (const auto& [name, t] : f.tensors)
      if (name.rfind("grad.", 0) == 0) {
        INFO(name);
        worst = std::max(worst, difference(r.grad_weights.at(name.substr(5), "test", "dw"), t));
        ++gradients;
      }
    CHECK(gradients == r.grad_weights.tensors.size());  // every parameter, under the weights' names
    MESSAGE("worst difference" << policy << " over the output, grad_input and " << gradients
                               << " weight gradients: " << worst);
    CHECK(worst < 1e-10);
  }
}

TEST_CASE("cli: run takes a head size no policy compiles (D = 6) and reproduces its PyTorch fixture on every CPU policy") {
  test_support::temp_folder folder;
  const std::string weights = (data_dir / "decoder_layer_d6.safetensors").string();
  const auto f = io::read_safetensors(weights);
  for (const std::string policy : {"reference", "simd"}) {
    INFO("policy " << policy);
    const auto r = difftx_cli("run --module decoder_layer --layer-index 3 --kv-heads 1 --policy " + policy +
                              " --dtype float64 --weights " + q(weights) + " --input " +
                              q(data_dir / "npy" / "decoder_layer_d6.input.f64.npy") + " --grad-output " +
                              q(data_dir / "npy" / "decoder_layer_d6.grad_output.f64.npy") + " --output " +
                              q(folder / "y.npy") + " --grad-input " + q(folder / "dx.npy") + " --grad-weights " +
                              q(folder / "dw.safetensors"));
    INFO("stderr: " << r.err);
    REQUIRE(r.code == 0);
    double worst = difference(io::read_npy(folder / "y.npy"), f.at("output", "test", "fixture"));
    worst = std::max(worst, difference(io::read_npy(folder / "dx.npy"), f.at("grad_input", "test", "fixture")));
    const auto dw = io::read_safetensors(folder / "dw.safetensors");
    for (const auto& [name, t] : f.tensors)
      if (name.rfind("grad.", 0) == 0) worst = std::max(worst, difference(dw.at(name.substr(5), "test", "dw"), t));
    MESSAGE(policy << ": worst difference over the output and every gradient " << worst);
    CHECK(worst < 1e-10);
  }
  // An odd D (lambda vectors of 5, a q_proj of 2·h·5 rows) is bad input naming the tensor.
  auto odd = f;
  auto resize = [&](const std::string& name, const std::vector<index_t>& shape) {
    const auto count = static_cast<std::size_t>(shape.size() == 1 ? shape[0] : shape[0] * shape[1]);
    odd.tensors[name] = io::stored_tensor::from_values(io::dtype::f64, shape, std::vector<double>(count, 0.1));
  };
  for (const char* name : {"attn.lambda_q1", "attn.lambda_k1", "attn.lambda_q2", "attn.lambda_k2"}) resize(name, {5});
  resize("attn.q_proj.weight", {2 * 2 * 5, 16});
  resize("attn.k_proj.weight", {2 * 1 * 5, 16});
  io::write_safetensors(folder / "odd.safetensors", odd);
  const auto r = difftx_cli("run --module decoder_layer --kv-heads 1 --weights " + q(folder / "odd.safetensors") +
                            " --input " + q(data_dir / "npy" / "decoder_layer_d6.input.f64.npy") + " --output " +
                            q(folder / "odd_y.npy"));
  CHECK(r.code == 3);
  check_message(r.err, {"attn.q_proj.weight", "an even head size D", "D = 5"});
  CHECK_FALSE(std::filesystem::exists(folder / "odd_y.npy"));
}

// policy::cuda through the tool. Where the tool has it and a device is
// present, this reproduces the fixture on the GPU (ctest -L gpu runs it:
// tests/CMakeLists.txt); elsewhere it asserts what a user without one sees.
TEST_CASE("cli gpu: --policy cuda reproduces the PyTorch fixture, or says in one line why it cannot run") {
  const std::string run = "run" + fixture_flags + " --kv-heads 1 --weights " + fixture_weights + " --input " +
                          fixture_input + " --output /tmp/difftx_never_written.npy --policy cuda";
  const auto probe = difftx_cli("bench --policy cuda --module rmsnorm --batch 1 --seq 1 --d-model 8 --repeats 1");
  if (probe.code != 0 && probe.err.find("is not built into") != std::string::npos) {
    MESSAGE("this difftx is built without CUDA");
    expect_usage_error(run, {"--policy", "policy 'cuda' is not built into this difftx"});
    return;
  }
  if (probe.code != 0) {
    MESSAGE("no CUDA device: checking the messages a user without one sees");
    expect_usage_error(run, {"--policy", "policy 'cuda' cannot run here: no CUDA device was found"});
    expect_usage_error("bench --policy simd,cuda --module rmsnorm --batch 1 --seq 1 --d-model 8",
                       {"--policy", "no CUDA device was found"});
    const auto r = difftx_cli("check");
    CHECK(r.code == 0);
    CHECK(r.out.find("| every module          | cuda      | every    | - |") != std::string::npos);
    CHECK(r.out.find("skipped cuda: no CUDA device was found") != std::string::npos);
    CHECK_FALSE(std::filesystem::exists("/tmp/difftx_never_written.npy"));
    return;
  }
  // A device: float32 on the GPU within float32's bars of the CPU's float64 run on the same files.
  test_support::temp_folder folder;
  const auto reference = run_module(folder, fixture_weights, fixture_input, fixture_grad_output, "float64 --policy reference");
  const auto ours = run_module(folder, fixture_weights, fixture_input, fixture_grad_output, "float32 --policy cuda");
  const auto [forward, backward] = differences(ours, reference);
  MESSAGE("cuda float32: output " << forward << ", gradients " << backward);
  CHECK(forward <= testing::tolerance<float>::forward);
  CHECK(backward <= testing::tolerance<float>::backward);
  const auto table = difftx_cli("bench --policy simd,cuda --module decoder_layer --batch 1 --seq 64 --d-model 64 --heads 2 "
                                "--backward --repeats 3 --json");
  REQUIRE(table.code == 0);
  CHECK(std::count(table.out.begin(), table.out.end(), '\n') == 2);  // one object per policy
  const auto check = difftx_cli("check");
  INFO(check.out);
  CHECK(check.code == 0);
  CHECK(check.out.find("| multihead             | cuda      | float32  | 6 |") != std::string::npos);
  CHECK(check.out.find("| decoder_layer_v2      | cuda      | float32  | 6 |") != std::string::npos);
  // V2 on the device: the fixture in float32 within float32's bars of the CPU's float64 run.
  const auto v2_reference = run_v2_fixture(folder, "multihead_v2_causal", "--dtype float64 --policy reference");
  const auto v2_ours = run_v2_fixture(folder, "multihead_v2_causal", "--dtype float32 --policy cuda");
  const auto [v2_forward, v2_backward] = differences(v2_ours, v2_reference);
  MESSAGE("cuda float32 multihead_v2: output " << v2_forward << ", gradients " << v2_backward);
  CHECK(v2_forward <= testing::tolerance<float>::forward);
  CHECK(v2_backward <= testing::tolerance<float>::backward);
}

// Gradients per tensor against at least a tenth of the largest gradient, as
// every suite compares them (testing::gradient_floor_fraction): the lambda
// gradients cancel to ~2e-3 of the case's scale (0.2 against 93 here).
TEST_CASE("cli: run in float32, bfloat16 and float16 stays within tolerance of a float64 run on the same files") {
  test_support::temp_folder folder;
  const auto x = io::read_npy(fixture_input), dy = io::read_npy(fixture_grad_output);
  const auto fixture = io::read_safetensors(fixture_weights);
  auto check_type = [&](auto tolerance, io::dtype type, const char* suffix) {
    INFO(io::dtype_name(type));
    const std::string weights = (data_dir / ("decoder_layer.weights." + std::string(suffix) + ".safetensors")).string();
    io::write_npy(folder / "x.npy", rounded_to(x, type));
    io::write_npy(folder / "dy.npy", rounded_to(dy, type));
    const auto reference = run_module(folder, weights, q(folder / "x.npy"), q(folder / "dy.npy"), "float64");
    const auto ours = run_module(folder, weights, q(folder / "x.npy"), q(folder / "dy.npy"), std::string(io::dtype_name(type)));
    CHECK(ours.output.type == io::dtype::f32);
    const auto [forward, backward] = differences(ours, reference);
    MESSAGE(io::dtype_name(type) << ": output " << forward << " (bar " << tolerance.forward << "), gradients " << backward
                                 << " (bar " << tolerance.backward << "); output vs the float64 fixture "
                                 << difference(ours.output, fixture.at("output", "test", "fixture")));
    CHECK(forward <= tolerance.forward);
    CHECK(backward <= tolerance.backward);
  };
  check_type(testing::tolerance<float>{}, io::dtype::f32, "f32");
  check_type(testing::tolerance<Eigen::bfloat16>{}, io::dtype::bf16, "bf16");
  check_type(testing::tolerance<Eigen::half>{}, io::dtype::f16, "f16");
}

TEST_CASE("cli: check passes on every policy built") {
  const auto r = difftx_cli("check");
  INFO(r.out << r.err);
  CHECK(r.code == 0);
  for (const char* module : {"rmsnorm", "swiglu", "multihead", "attention", "decoder_layer", "decoder_stack",
                             "multihead_v2 ", "multihead_v2 baseline", "decoder_layer_v2"})
    CHECK(r.out.find("| " + std::string(module)) != std::string::npos);
  CHECK(r.out.find("checks pass") != std::string::npos);
  CHECK(r.out.find("FAIL") == std::string::npos);
}

TEST_CASE("cli: bench prints medians, tokens/s and GFLOP/s, and --json the promised fields") {
  auto r = difftx_cli("bench --module decoder_layer --batch 1 --seq 8 --d-model 16 --heads 2 --backward --repeats 3");
  CHECK(r.code == 0);
  for (const char* word : {"forward+backward", "median ms", "tokens/s", "GFLOP/s"}) CHECK(r.out.find(word) != std::string::npos);

  r = difftx_cli("bench --module decoder_layer --batch 2 --seq 8 --d-model 16 --heads 2 --kv-heads 1 --backward --json "
                 "--repeats 3 --dtype bfloat16");
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j.at("forward_ms").get<double>() > 0);
  CHECK(j.at("forward_backward_ms").get<double>() > 0);
  CHECK(j.at("module") == "decoder_layer");
  CHECK(j.at("policy").is_string());
  CHECK(j.at("dtype") == "bfloat16");
  CHECK(j.at("threads").get<int>() >= 1);
  CHECK(j.at("batch") == 2);
  CHECK(j.at("seq") == 8);
  CHECK(j.at("d_model") == 16);
  CHECK(j.at("heads") == 2);
  CHECK(j.at("kv_heads") == 1);
  CHECK(j.at("head_dim") == 4);
  CHECK(j.at("ffn_dim") == 64);
  CHECK(difftx_cli("bench --module rmsnorm --batch 1 --seq 8 --d-model 16 --json").out.find("\"forward_gflops\":null") !=
        std::string::npos);
}

TEST_CASE("cli: bench names the path of bfloat16 products, and --bf16-product chooses it") {
  // On difftx's own products (--matmul difftx): where oneDNN takes them, its kernel is named instead (below).
  auto detail = [](const std::string& dtype, const std::string& product, const std::string& matmul = "difftx") {
    const auto r = difftx_cli("bench --module swiglu --batch 1 --seq 8 --d-model 16 --json --repeats 1 --policy simd "
                              "--dtype " + dtype + " --bf16-product " + product + " --matmul " + matmul);
    REQUIRE(r.code == 0);
    return nlohmann::json::parse(r.out).at("policy_detail").get<std::string>();
  };
  auto ends_with = [](const std::string& s, const std::string& end) {
    return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
  };
  CHECK(ends_with(detail("bfloat16", "converting"), ", converting)"));
  // Forced onto the instruction: it runs where the CPU has it, else the converting product does.
  CHECK(ends_with(detail("bfloat16", "dot_instructions"),
                  simd_detail::bf16_pair_instructions() ? ", vdpbf16ps)" : ", converting)"));
  const auto float_detail = detail("float32", "converting");  // no such choice for float
  CHECK(float_detail.find("converting") == std::string::npos);
  CHECK(float_detail.find("vdpbf16ps") == std::string::npos);
  expect_usage_error("bench --module swiglu --batch 1 --seq 8 --d-model 16 --bf16-product fast", {"--bf16-product", "fast"});
  // --matmul onednn: oneDNN's kernel named where this build has it, difftx's path otherwise.
#if defined(DIFFTX_ONEDNN)
  CHECK(detail("float32", "automatic", "onednn").find("onednn ") != std::string::npos);
  CHECK(detail("bfloat16", "automatic", "onednn").find("onednn ") != std::string::npos);
#else
  CHECK(detail("float32", "automatic", "onednn").find("onednn") == std::string::npos);
#endif
  expect_usage_error("bench --module swiglu --batch 1 --seq 8 --d-model 16 --matmul mkl", {"--matmul", "mkl"});
}

TEST_CASE("cli: bench counts FLOPs as documented (checked by hand on small shapes)") {
  auto flops = [](const std::string& args) {
    const auto r = difftx_cli("bench --batch 1 --seq 4 --d-model 8 --json --repeats 1 --backward " + args);
    REQUIRE(r.code == 0);
    const auto j = nlohmann::json::parse(r.out);
    return std::pair{j.at("forward_flops").get<double>(), j.at("backward_flops").get<double>()};
  };
  // Projections on 4 tokens, 8 -> 8: 2·4·8·8 = 512 forward, 1024 backward, four of them.
  // multihead h = g = 1, D = 4: P = 4·5/2 = 10 causal pairs, two maps with d = 4, dv = 8:
  //   forward 10·2·(2·4 + 2·8) = 480; backward 10·(4·8 + 2·4·4) = 640.
  CHECK(flops("--module multihead --heads 1") == std::pair{2048.0 + 480.0, 4096.0 + 640.0});
  // attention H = G = 2, D = 4, not causal: P = 16 per head, one map, d = dv = 4:
  //   forward 2·16·(2·4 + 2·4) = 512; backward 2·16·(4·4 + 4·4) = 1024.
  CHECK(flops("--module attention --heads 2 --no-causal") == std::pair{2048.0 + 512.0, 4096.0 + 1024.0});
  // swiglu F = 64 (8·8/3 rounded up to 64): three projections of 2·4·8·64 = 4096.
  CHECK(flops("--module swiglu") == std::pair{3 * 4096.0, 6 * 4096.0});
  CHECK(flops("--module decoder_layer --heads 1") == std::pair{2528.0 + 3 * 4096.0, 4736.0 + 6 * 4096.0});
}

// Issue 16's classes, each as a hostile user met it: sizes that overflow,
// unbounded counts, partial results, NaN from finite inputs, escaped
// messages, lenient headers, memory, signals and shared output paths.
namespace {

const std::string multihead_weights = (data_dir / "multihead_causal.safetensors").string();

// The multihead fixture's input as a float32 .npy in folder, with edit applied to its values.
template <class Edit>
std::string multihead_input(const test_support::temp_folder& folder, Edit&& edit) {
  const auto f = io::read_safetensors(multihead_weights);
  const auto& x = f.at("input", "test", "fixture");
  auto values = x.values();
  edit(values);
  io::write_npy(folder / "x.npy", io::stored_tensor::from_values(io::dtype::f32, x.shape, values));
  return q(folder / "x.npy");
}

void write_raw(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

TEST_CASE("cli hardening: sizes from files and counts from the command line cannot overflow") {
  test_support::temp_folder folder;
  // A .npy header whose dimensions multiply past 2^64 (wrapping to a small count) with 32 data bytes.
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (53695721, 687084323673, 8), }";
  header.append(63 - (10 + header.size()) % 64, ' ') += '\n';
  std::string npy = "\x93NUMPY\x01";
  npy += '\0';
  npy += {static_cast<char>(header.size() & 0xff), static_cast<char>(header.size() >> 8)};
  write_raw(folder / "huge.npy", npy + header + std::string(32, '\0'));
  for (const char* module : {"multihead", "rmsnorm"}) {
    INFO(module);
    const auto weights = std::string(module) == "rmsnorm" ? (data_dir / "rmsnorm.safetensors").string() : multihead_weights;
    const auto r = difftx_cli(std::string("run --module ") + module + " --weights " + weights + " --input " +
                              q(folder / "huge.npy") + " --output " + q(folder / "y.npy"));
    CHECK(r.code == 3);
    check_message(r.err, {"huge.npy: shape [53695721, 687084323673, 8]", "an element count of at most"});
    CHECK_FALSE(std::filesystem::exists(folder / "y.npy"));
  }
  const std::string run = "run --module multihead --weights " + multihead_weights + " --input " +
                          multihead_input(folder, [](auto&) {}) + " --output " + q(folder / "y.npy");
  expect_usage_error(run + " --heads 576460752303423489", {"--heads", "expected an integer from 1 to 16777216"});
  expect_usage_error(run + " --threads 100000", {"--threads", "100000", "1024"});
  expect_usage_error(run + " --threads 50000", {"--threads"});
  expect_usage_error("bench --module multihead --batch 1 --seq 99999999999 --d-model 16 --heads 2", {"--seq"});
  // Counts within their limits whose product is past any memory: bad input, not a crash.
  const auto r = difftx_cli("bench --module rmsnorm --batch 16777216 --seq 16777216 --d-model 16");
  CHECK(r.code == 3);
  check_message(r.err, {"an element count of at most"});
  CHECK(folder.files() == std::vector<std::string>{"huge.npy", "x.npy"});
}

TEST_CASE("cli hardening: a failure leaves every output as it was; outputs need distinct paths") {
  test_support::temp_folder folder;
  const std::string old = "an earlier result";
  for (const char* name : {"y.npy", "dx.npy"}) write_raw(folder / name, old);
  const std::string base = "run" + fixture_flags + " --kv-heads 1 --weights " + fixture_weights + " --input " + fixture_input +
                           " --grad-output " + fixture_grad_output + " --output " + q(folder / "y.npy");
  auto unchanged = [&] {
    CHECK(read_text(folder / "y.npy") == old);
    CHECK(read_text(folder / "dx.npy") == old);
    CHECK(folder.files() == std::vector<std::string>{"dx.npy", "y.npy"});  // no temporary left
  };
  auto r = difftx_cli(base + " --grad-input " + q(folder / "dx.npy") + " --grad-weights " + q(folder / "no" / "dw.safetensors"));
  CHECK(r.code == 3);
  check_message(r.err, {"dw.safetensors", "a path in an existing folder"});
  unchanged();
  r = difftx_cli(base + " --grad-input " + q(folder / "no" / "dx.npy"));
  CHECK(r.code == 3);
  unchanged();
  expect_usage_error(base + " --grad-input " + q(folder / "y.npy"), {"--grad-input", "the same file as --output"});
  expect_usage_error(base + " --grad-input " + q(folder / "sub" / ".." / "y.npy"), {"--grad-input", "the same file"});
  unchanged();
  // A NaN found only after the forward: still nothing written (λ entries of 30 make exp(λq1·λk1) overflow float64).
  const auto w = edited_weights(folder / "w.safetensors", [](auto& f) {
    for (const char* name : {"attn.lambda_q1", "attn.lambda_k1", "attn.lambda_q2", "attn.lambda_k2"}) {
      auto& t = f.tensors.at(name);
      t = io::stored_tensor::from_values(t.type, t.shape, std::vector<double>(static_cast<std::size_t>(t.size()), 30.0));
    }
  });
  r = difftx_cli("run" + fixture_flags + " --kv-heads 1 --dtype float64 --weights " + w + " --input " + fixture_input +
                 " --grad-output " + fixture_grad_output + " --output " + q(folder / "y.npy") + " --grad-input " +
                 q(folder / "dx.npy"));
  CHECK(r.code == 3);
  check_message(r.err, {"gradient of attn.lambda_", "the backward overflows float64"});
  CHECK(read_text(folder / "y.npy") == old);
  CHECK(read_text(folder / "dx.npy") == old);
}

TEST_CASE("cli hardening: non-finite results from finite inputs are reported, or avoided where the math allows") {
  test_support::temp_folder folder;
  SUBCASE("an input of 1e20 in float32: the attention scores overflow, named") {
    const auto x = multihead_input(folder, [](auto& v) { v[17] = 1e20; });
    const auto r = difftx_cli("run --module multihead --weights " + multihead_weights + " --input " + x + " --output " +
                              q(folder / "y.npy"));
    CHECK(r.code == 3);
    check_message(r.err, {"argument 'output'", "finite values from finite inputs", "first non-finite intermediate: attn.lse",
                          "log-sum-exp of the attention scores"});
    CHECK_FALSE(std::filesystem::exists(folder / "y.npy"));
  }
  SUBCASE("rmsnorm of 1e20 in float32: the sum of squares overflows float32, rescaled, right") {
    const auto f = io::read_safetensors(data_dir / "rmsnorm.safetensors");
    auto values = f.at("input", "test", "fixture").values();
    const auto shape = f.at("input", "test", "fixture").shape;
    for (auto& v : values) v *= 1e20;
    io::write_npy(folder / "x.npy", io::stored_tensor::from_values(io::dtype::f32, shape, values));
    const auto r = difftx_cli("run --module rmsnorm --weights " + (data_dir / "rmsnorm.safetensors").string() + " --input " +
                              q(folder / "x.npy") + " --output " + q(folder / "y.npy"));
    INFO(r.err);
    REQUIRE(r.code == 0);
    // RMSNorm is scale-invariant: with eps negligible at this scale, y = x / rms(x) · w, computed here in double.
    const auto w = f.at("weight", "test", "fixture").values();
    const auto x = f.at("input", "test", "fixture").values();
    const auto C = static_cast<std::size_t>(shape[2]);
    std::vector<double> expected(x.size());
    for (std::size_t row = 0; row < x.size() / C; ++row) {
      double sum_sq = 0;
      for (std::size_t c = 0; c < C; ++c) sum_sq += x[row * C + c] * x[row * C + c];
      for (std::size_t c = 0; c < C; ++c) expected[row * C + c] = x[row * C + c] / std::sqrt(sum_sq / double(C)) * w[c];
    }
    const auto y = io::read_npy(folder / "y.npy");
    CHECK(difference(y, io::stored_tensor::from_values(io::dtype::f64, shape, expected)) < testing::tolerance<float>::forward);
  }
  SUBCASE("lambda vectors of 30: exp overflows, but the difference of equal exponentials is exactly 0") {
    const auto w = edited_weights(folder / "w.safetensors", [](auto& file) {
      for (const char* name : {"attn.lambda_q1", "attn.lambda_k1", "attn.lambda_q2", "attn.lambda_k2"}) {
        auto& t = file.tensors.at(name);
        t = io::stored_tensor::from_values(t.type, t.shape, std::vector<double>(static_cast<std::size_t>(t.size()), 30.0));
      }
    });
    for (const char* dtype : {"float32", "float64"}) {
      INFO(dtype);
      const auto r = difftx_cli("run" + fixture_flags + " --kv-heads 1 --dtype " + dtype + " --weights " + w + " --input " +
                                fixture_input + " --output " + q(folder / "y.npy"));
      CHECK(r.code == 0);
      for (double v : io::read_npy(folder / "y.npy").values()) REQUIRE(std::isfinite(v));
    }
  }
}

TEST_CASE("cli hardening: strict headers and one-line, escaped messages") {
  test_support::temp_folder folder;
  auto safetensors = [&](const std::string& header_json, std::size_t data) {
    std::string s(8, '\0');
    const std::uint64_t n = header_json.size();
    std::memcpy(s.data(), &n, 8);
    write_raw(folder / "w.safetensors", s + header_json + std::string(data, '\0'));
    return difftx_cli("run --module rmsnorm --weights " + q(folder / "w.safetensors") + " --input " + fixture_input +
                      " --output " + q(folder / "y.npy"));
  };
  auto r = safetensors(R"({"weight":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"weight":{"dtype":"F32","shape":[16],"data_offsets":[0,64]}})", 64);
  CHECK(r.code == 3);
  check_message(r.err, {"w.safetensors: weight", "each name once"});
  r = safetensors(std::string(R"({"weight":{"dtype":"F32","shape":[16],"data_offsets":[0,64]}})") + '\0' + "junk", 64);
  CHECK(r.code == 3);
  check_message(r.err, {"w.safetensors: header", "NUL byte"});
  r = safetensors(R"({"x\n\u001b[2J":{"dtype":"U8","shape":[2],"data_offsets":[0,1]}})", 1);
  CHECK(r.code == 3);
  check_message(r.err, {"x\\n\\x1b[2J"});  // one line: the newline and the escape shown, not obeyed
  CHECK_FALSE(std::filesystem::exists(folder / "y.npy"));
}

TEST_CASE("cli hardening: running out of memory is bad input with a clear line") {
  // 1024 x 1024 x 4096 float32 (16 GiB) under a 2 GiB address-space limit.
  const auto r = shell_command("ulimit -v 2000000; " + std::string(DIFFTX_CLI) +
                               " bench --module rmsnorm --batch 1024 --seq 1024 --d-model 4096 --repeats 1");
  CHECK(r.code == 3);
  check_message(r.err, {"input needs 34359738368 bytes, more than can be allocated"});
}

TEST_CASE("cli hardening: SIGTERM while writing leaves no temporary behind") {
  test_support::temp_folder folder;
  // rmsnorm over 64 Mi float32 values (256 MiB): long enough to be inside the run when the signal comes.
  const auto f = io::read_safetensors(data_dir / "rmsnorm.safetensors");
  io::write_npy(folder / "x.npy", io::stored_tensor::from_values(io::dtype::f32, {8192, 1024, 8},
                                                                 std::vector<double>(std::size_t{8192} * 1024 * 8, 0.5)));
  for (const char* delay : {"0.3", "1", "2"}) {
    INFO("signal after " << delay << " s");
    const auto r = shell_command(std::string(DIFFTX_CLI) + " run --module rmsnorm --weights " +
                                 (data_dir / "rmsnorm.safetensors").string() + " --input " + q(folder / "x.npy") +
                                 " --output " + q(folder / "y.npy") + " --dtype float64 & sleep " + delay +
                                 "; kill -TERM $! 2>/dev/null; wait $!");
    CHECK((r.code == 0 || r.code == 128 + SIGTERM));  // finished first, or ended by the signal
    for (const auto& name : folder.files()) CHECK(name.find(".tmp") == std::string::npos);
    std::filesystem::remove(folder / "y.npy");
  }
}

TEST_CASE("cli hardening: numbers take any value their meaning allows, with short messages otherwise") {
  test_support::temp_folder folder;
  const auto f = io::read_safetensors(data_dir / "rmsnorm.safetensors");
  io::write_npy(folder / "x.npy", f.at("input", "test", "fixture"));
  const std::string run = "run --module rmsnorm --weights " + (data_dir / "rmsnorm.safetensors").string() + " --input " +
                          q(folder / "x.npy") + " --output " + q(folder / "y.npy");
  auto r = difftx_cli(run + " --eps 1e-320");  // a subnormal epsilon is still positive
  CHECK(r.code == 0);
  for (const char* eps : {"0", "-1", "inf", "nan", "1e999"}) {
    INFO(eps);
    r = difftx_cli(run + " --eps " + eps);
    CHECK(r.code == 2);
    check_message(r.err, {"--eps", "expected a finite number > 0"});
    CHECK(r.err.size() < 200);
  }
}

// difftx generate on a small random language model written from C++ (2 layers,
// V = 23, C = 16, h = 2, g = 1, D = 4, F = 32): the tool's greedy decoding with
// the KV cache against greedy decoding by full forwards over the growing
// sequence, computed here with the library.
namespace {

constexpr index_t lm_vocab = 23;
using lm_layer = DecoderLayer<double, dynamic, policy::reference>;

LanguageModel<lm_layer> small_language_model() {
  std::vector<lm_layer> layers;
  for (index_t l = 0; l < 2; ++l)
    layers.emplace_back(DecoderLayerConfig{{.d_model = 16, .heads = 2, .kv_heads = 1, .layer_index = l, .head_dim = 4}, 32});
  LanguageModel<lm_layer> model({lm_vocab, 16}, std::move(layers));
  random_stream rng(11);
  model.reset_parameters(rng);
  return model;
}

io::tensor_file language_model_weights(LanguageModel<lm_layer>& model) {
  io::tensor_file file;
  io::store_parameters(file, model, io::dtype::f64);
  return file;
}

// prompt, then each next token the largest last logit (the first of equal
// ones) of a stateless forward over everything so far.
std::vector<token_t> greedy_by_forwards(const LanguageModel<lm_layer>& model, std::vector<token_t> sequence,
                                        index_t new_tokens) {
  std::vector<token_t> generated;
  for (index_t t = 0; t < new_tokens; ++t) {
    const auto n = static_cast<index_t>(sequence.size());
    Tensor<token_t, 2> tokens({1, n});
    std::copy(sequence.begin(), sequence.end(), tokens.data());
    Tensor<double, 3> logits({1, n, lm_vocab});
    model.forward(tokens.const_view(), logits.view());
    const double* last = logits.data() + (n - 1) * lm_vocab;
    const auto next = static_cast<token_t>(std::max_element(last, last + lm_vocab) - last);
    generated.push_back(next);
    sequence.push_back(next);
  }
  return generated;
}

// The ids of the "tokens: 1,2,3" line of generate's output.
std::vector<token_t> printed_tokens(const std::string& out) {
  const auto at = out.find("\ntokens: ");
  REQUIRE(at != std::string::npos);
  std::stringstream line(out.substr(at + 9, out.find('\n', at + 1) - at - 9));
  std::vector<token_t> tokens;
  for (std::string id; std::getline(line, id, ',');) tokens.push_back(static_cast<token_t>(std::stoi(id)));
  return tokens;
}

}  // namespace

TEST_CASE("cli: generate decodes with the KV cache the tokens greedy full forwards give, and times both phases") {
  test_support::temp_folder folder;
  auto model = small_language_model();
  io::write_safetensors(folder / "lm.safetensors", language_model_weights(model));
  const std::string generate = "generate --weights " + q(folder / "lm.safetensors") + " --kv-heads 1";
  for (const auto& [prompt, ids] : {std::pair{std::string("5,0,17,3"), std::vector<token_t>{5, 0, 17, 3}},
                                    std::pair{std::string("22"), std::vector<token_t>{22}}}) {
    const auto expected = greedy_by_forwards(model, ids, 12);
    std::ostringstream shown;
    for (const auto t : expected) shown << t << ' ';
    MESSAGE("prompt " << prompt << ": greedy by full forwards " << shown.str());
    for (const std::string policy : {"reference", "simd"}) {
      INFO("prompt " << prompt << ", policy " << policy);
      const auto r = difftx_cli(generate + " --prompt " + prompt + " --max-new-tokens 12 --dtype float64 --policy " + policy);
      INFO("stdout: " << r.out << "stderr: " << r.err);
      REQUIRE(r.code == 0);
      CHECK(printed_tokens(r.out) == expected);
      CHECK(r.out.find("2 layers, V = 23, C = 16, h = 2, g = 1, D = 4, F = 32") != std::string::npos);
      CHECK(r.out.find("prefill: " + std::to_string(ids.size()) + " prompt tokens in ") != std::string::npos);
      CHECK(r.out.find("decode: 11 tokens in ") != std::string::npos);
      CHECK(r.out.find(" ms/token, ") != std::string::npos);
    }
  }
  // --json: the same tokens, and the timings as numbers.
  const auto r = difftx_cli(generate + " --prompt 5,0,17,3 --max-new-tokens 12 --dtype float64 --json");
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j.at("tokens").get<std::vector<token_t>>() == greedy_by_forwards(model, {5, 0, 17, 3}, 12));
  CHECK(j.at("prompt_tokens") == 4);
  CHECK(j.at("decode_steps") == 11);
  for (const char* field : {"prefill_ms", "prefill_tokens_per_s", "decode_ms", "decode_ms_per_token", "decode_tokens_per_s"})
    CHECK(j.at(field).get<double>() > 0);
  CHECK(j.at("layers") == 2);
  CHECK(j.at("vocab_size") == lm_vocab);
  // One new token comes from the prefill alone; float32 (the default) runs the same file.
  const auto one = difftx_cli(generate + " --prompt 5,0,17,3 --max-new-tokens 1");
  REQUIRE(one.code == 0);
  CHECK(printed_tokens(one.out).size() == 1);
  CHECK(one.out.find("decode: no steps") != std::string::npos);
}

TEST_CASE("cli: generate exits 3 on a missing or ill-shaped tensor and 2 on a token id outside the vocabulary") {
  test_support::temp_folder folder;
  auto model = small_language_model();
  const auto weights = language_model_weights(model);
  auto run = [&](const std::string& name, const std::string& prompt = "1,2") {
    return difftx_cli("generate --kv-heads 1 --weights " + q(folder / name) + " --prompt " + prompt);
  };
  auto expect_bad_input = [&](void (*edit)(io::tensor_file&), std::initializer_list<std::string> parts) {
    auto edited = weights;
    edit(edited);
    io::write_safetensors(folder / "w.safetensors", edited);
    const auto r = run("w.safetensors");
    CHECK(r.code == 3);
    check_message(r.err, parts);
    CHECK(r.out.empty());
  };
  expect_bad_input([](io::tensor_file& f) { f.tensors.erase("norm.weight"); },
                   {"w.safetensors", "norm.weight", "expected a tensor named"});
  expect_bad_input([](io::tensor_file& f) { f.tensors.erase("layers.1.attn.lambda_k2"); },
                   {"w.safetensors", "layers.1.attn.lambda_k2", "expected a tensor named"});
  expect_bad_input([](io::tensor_file& f) { f.tensors.erase("embed_tokens.weight"); },
                   {"w.safetensors", "embed_tokens.weight"});
  expect_bad_input([](io::tensor_file& f) {
    auto& t = f.tensors.at("embed_tokens.weight");
    t = io::stored_tensor::from_values(t.type, {lm_vocab, 8}, std::vector<double>(lm_vocab * 8, 0.5));
  }, {"w.safetensors: embed_tokens.weight", "shape [V, 16]", "[23, 8]"});
  expect_bad_input([](io::tensor_file& f) {
    auto& t = f.tensors.at("lm_head.weight");
    t = io::stored_tensor::from_values(t.type, {lm_vocab - 1, 16}, std::vector<double>((lm_vocab - 1) * 16, 0.5));
  }, {"w.safetensors", "lm_head.weight", "expected shape [23, 16]", "[22, 16]"});
  expect_bad_input([](io::tensor_file& f) {  // a file that records 2 layers and has tensors of layers 0 and 2
    f.tensors.erase("layers.1.ffn.gate_proj.weight");
  }, {"w.safetensors", "layers.1.ffn.gate_proj.weight", "expected a tensor named"});
  expect_bad_input([](io::tensor_file& f) {  // written elsewhere (no architecture): layer 1's tensors under layers.2.
    f.metadata.clear();
    std::vector<std::string> names;
    for (const auto& [name, t] : f.tensors)
      if (name.rfind("layers.1.", 0) == 0) names.push_back(name);
    for (const auto& name : names) {
      f.tensors["layers.2." + name.substr(9)] = f.tensors.at(name);
      f.tensors.erase(name);
    }
  }, {"w.safetensors: layers.1.*", "the tensors of every layer 0..2"});

  io::write_safetensors(folder / "lm.safetensors", weights);
  expect_usage_error("generate --kv-heads 1 --weights " + q(folder / "lm.safetensors") + " --prompt 1,23,2",
                     {"difftx generate: --prompt", "token id 23 (position 1)", "outside the vocabulary [0, 23)"});
  expect_usage_error("generate --kv-heads 1 --weights " + q(folder / "lm.safetensors") + " --prompt 1,x",
                     {"--prompt"});
  expect_usage_error("generate --kv-heads 1 --weights " + q(folder / "lm.safetensors") + " --prompt 1 --max-new-tokens 0",
                     {"--max-new-tokens"});
}

// Differential attention V2 (MultiHeadV2, DecoderLayerV2) through the tool: run
// on the PyTorch V2 fixtures, the sizes read from the weights, errors naming
// the tensor, bench (FLOPs by hand, --baseline, --decode).
namespace {
// f[name] replaced by a tensor of that shape (all 0.1).
void reshape(io::tensor_file& f, const std::string& name, const std::vector<index_t>& shape) {
  index_t n = 1;
  for (auto e : shape) n *= e;
  f.tensors[name] = io::stored_tensor::from_values(io::dtype::f64, shape, std::vector<double>(static_cast<std::size_t>(n), 0.1));
}
}  // namespace

TEST_CASE("cli v2: run reproduces every V2 PyTorch fixture to 1e-10 in float64 on every CPU policy, and float32 within its bars") {
  test_support::temp_folder folder;
  for (const auto& fx : v2_fixtures) {
    const std::string name = fx.name;
    const auto expected = v2_fixture_results(name);
    for (const std::string policy : {"reference", "simd"}) {
      INFO(name << " on " << policy);
      const auto r = run_v2_fixture(folder, name, "--dtype float64 --policy " + policy);
      CHECK(r.output.type == io::dtype::f64);
      CHECK(r.grad_weights.tensors.size() == expected.grad_weights.tensors.size());  // every parameter, by its name
      const auto [forward, backward] = differences(r, expected);
      MESSAGE(name << " on " << policy << ": output " << forward << ", gradients " << backward);
      CHECK(forward < 1e-10);
      CHECK(backward < 1e-10);
    }
    const auto r = run_v2_fixture(folder, name, "--dtype float32");
    CHECK(r.output.type == io::dtype::f32);
    const auto [forward, backward] = differences(r, expected);
    CHECK(forward <= testing::tolerance<float>::forward);
    CHECK(backward <= testing::tolerance<float>::backward);
  }
  // The differential fixtures' sizes come from the weights alone; a --heads or --kv-heads that agrees changes nothing.
  const auto r = run_v2_fixture(folder, "multihead_v2_gqa_noncausal", "--dtype float64 --heads 3 --kv-heads 2");
  CHECK(differences(r, v2_fixture_results("multihead_v2_gqa_noncausal")).first < 1e-10);
}

TEST_CASE("cli v2: a V2 weight file that does not fit exits 3 naming the tensor, writing nothing") {
  test_support::temp_folder folder;
  // multihead_v2_causal: h = 2, g = 2, D = 4, C = 16
  const auto fixture = io::read_safetensors(data_dir / "multihead_v2_causal.safetensors");
  io::write_npy(folder / "x.npy", fixture.at("input", "test", "fixture"));
  auto run = [&](void (*edit)(io::tensor_file&), const std::string& flags = "--module multihead_v2",
                 const std::string& source = "multihead_v2_causal") {
    auto f = io::read_safetensors(data_dir / (source + ".safetensors"));
    edit(f);
    io::write_safetensors(folder / "w.safetensors", f);
    const auto r = difftx_cli("run " + flags + " --weights " + q(folder / "w.safetensors") + " --input " +
                              q(folder / "x.npy") + " --output " + q(folder / "y.npy"));
    CHECK(r.code == 3);
    CHECK_FALSE(std::filesystem::exists(folder / "y.npy"));
    return r;
  };
  SUBCASE("o_proj transposed") {
    const auto r = run([](io::tensor_file& f) { reshape(f, "o_proj.weight", {8, 16}); });
    check_message(r.err, {"w.safetensors: o_proj.weight", "shape [16, 8] = [C, h·D] with h = 2 (from lambda_proj.weight) and D = 4",
                          "[8, 16]"});
  }
  SUBCASE("v_proj of the wrong shape") {
    const auto r = run([](io::tensor_file& f) { reshape(f, "v_proj.weight", {4, 16}); });
    check_message(r.err, {"w.safetensors", "v_proj.weight", "expected shape [8, 16]", "[4, 16]"});
  }
  SUBCASE("q_proj rows that are not 2·h·D") {
    const auto r = run([](io::tensor_file& f) { reshape(f, "q_proj.weight", {18, 16}); });
    check_message(r.err, {"w.safetensors: q_proj.weight", "2·h·D divisible by 4 with h = 2 (from lambda_proj.weight)", "[18, 16]"});
  }
  SUBCASE("key/value heads that do not divide the query heads") {
    const auto r = run([](io::tensor_file& f) {
      reshape(f, "k_proj.weight", {12, 16});
      reshape(f, "v_proj.weight", {12, 16});
    });
    check_message(r.err, {"w.safetensors: k_proj.weight", "g = 3 key/value heads dividing the 4 query heads", "[12, 16]"});
  }
  SUBCASE("flags that disagree with the weights") {
    auto r = run([](io::tensor_file&) {}, "--module multihead_v2 --heads 3");
    check_message(r.err, {"w.safetensors: lambda_proj.weight", "shape [h, C] with h = 3 (--heads)", "[2, 16]"});
    r = run([](io::tensor_file&) {}, "--module multihead_v2 --kv-heads 1");
    check_message(r.err, {"w.safetensors: k_proj.weight", "4 rows = g·D with g = 1 (--kv-heads) and D = 4", "[8, 16]"});
  }
  SUBCASE("no lambda_proj.weight and no --heads: the V2 baseline needs --heads") {
    const auto r = run([](io::tensor_file& f) { f.tensors.erase("lambda_proj.weight"); });
    check_message(r.err, {"w.safetensors: lambda_proj.weight", "or --heads to run the V2 baseline", "no tensor of that name"});
  }
  SUBCASE("decoder_layer_v2: a missing attn.lambda_proj.weight, an FFN of another width") {
    auto r = run([](io::tensor_file& f) { f.tensors.erase("attn.lambda_proj.weight"); }, "--module decoder_layer_v2",
                 "decoder_layer_v2");
    check_message(r.err, {"w.safetensors: attn.lambda_proj.weight", "--heads"});
    r = run([](io::tensor_file& f) { reshape(f, "ffn.down_proj.weight", {16, 20}); }, "--module decoder_layer_v2",
            "decoder_layer_v2");
    check_message(r.err, {"w.safetensors", "ffn.down_proj.weight", "expected shape [16, 24]", "[16, 20]"});
  }
  SUBCASE("V1 weights given as V2") {
    const auto r = difftx_cli("run --module decoder_layer_v2 --weights " + fixture_weights + " --input " + fixture_input +
                              " --output " + q(folder / "y.npy"));
    CHECK(r.code == 3);
    check_message(r.err, {"decoder_layer.safetensors: attn.lambda_proj.weight"});
  }
}

TEST_CASE("cli v2: bench times both V2 kinds, with --baseline and --decode, and counts their FLOPs as documented") {
  auto json = [](const std::string& args) {
    const auto r = difftx_cli("bench --json --repeats 1 " + args);
    INFO("difftx bench " << args << "\nstderr: " << r.err);
    REQUIRE(r.code == 0);
    return nlohmann::json::parse(r.out);
  };
  for (const char* module : {"multihead_v2", "decoder_layer_v2"})
    for (const char* baseline : {"", " --baseline"})
      for (const char* dtype : {"float32", "bfloat16"}) {
        const auto j = json(std::string("--module ") + module + baseline + " --dtype " + dtype +
                            " --batch 2 --seq 8 --d-model 16 --heads 2 --kv-heads 2 --backward");
        CHECK(j.at("module") == module);
        CHECK(j.at("differential") == (*baseline == '\0'));
        CHECK(j.at("head_dim") == 8);  // C / h
        CHECK(j.at("head_dim_compiled") == false);  // V2 runs on the run-time head size
        CHECK(j.at("forward_backward_ms").get<double>() > 0);
      }
  const auto decode = json("--module decoder_layer_v2 --batch 2 --context 8 --d-model 16 --heads 2 --kv-heads 1 --decode");
  CHECK(decode.at("decode_step_ms").get<double>() > 0);
  CHECK(json("--module multihead_v2 --baseline --batch 1 --context 5 --d-model 16 --heads 2 --decode")
            .at("decode_tokens_per_s")
            .get<double>() > 0);
  // g may divide the 2h query heads without dividing h.
  CHECK(json("--module multihead_v2 --batch 1 --seq 4 --d-model 16 --heads 1 --kv-heads 2").at("kv_heads") == 2);
  // D = 64 has its own instantiation for the V1 kinds; V2 runs it on the run-time one.
  CHECK(json("--module multihead_v2 --batch 1 --seq 4 --d-model 128 --heads 2").at("head_dim_compiled") == false);
  CHECK(json("--module multihead --batch 1 --seq 4 --d-model 256 --heads 2").at("head_dim_compiled") == true);

  auto flops = [&](const std::string& args) {
    const auto j = json("--batch 1 --seq 4 --d-model 8 --backward " + args);
    return std::pair{j.at("forward_flops").get<double>(), j.at("backward_flops").get<double>()};
  };
  // multihead_v2, h = g = 1, D = C / h = 8, 4 tokens, causal (P = 10 pairs per query head):
  // projections in: q 2·8 + k 8 + v 8 + lambda 1 = 33 rows: 2·4·33·8 = 2112 (backward 4224); o_proj 8 -> 8: 512 (1024);
  // attention: 2 query heads of one map, d = dv = 8: forward 2·10·(16 + 16) = 640, backward 2·10·(32 + 32) = 1280.
  CHECK(flops("--module multihead_v2 --heads 1") == std::pair{2112.0 + 512.0 + 640.0, 4224.0 + 1024.0 + 1280.0});
  // The baseline: q 8 + k 8 + v 8 = 24 rows (1536, 3072), o_proj 512 (1024), 1 query head: 320 (640);
  // exactly the standard attention of the same heads and size.
  CHECK(flops("--module multihead_v2 --heads 1 --baseline") == std::pair{1536.0 + 512.0 + 320.0, 3072.0 + 1024.0 + 640.0});
  CHECK(flops("--module multihead_v2 --heads 1 --baseline") == flops("--module attention --heads 1"));
  // decoder_layer_v2: plus SwiGLU's three projections (F = 64): 3·2·4·8·64 forward, twice that backward.
  CHECK(flops("--module decoder_layer_v2 --heads 1") == std::pair{3264.0 + 3 * 4096.0, 6528.0 + 6 * 4096.0});

  expect_usage_error("bench --module multihead --baseline --batch 1 --seq 4 --d-model 16 --heads 2",
                     {"--baseline", "multihead_v2 and decoder_layer_v2 only"});
  expect_usage_error("bench --module multihead_v2 --batch 1 --seq 4 --d-model 16 --heads 2 --kv-heads 3",
                     {"--kv-heads", "the 4 query heads"});
  expect_usage_error("bench --module multihead_v2 --baseline --batch 1 --seq 4 --d-model 16 --heads 2 --kv-heads 4",
                     {"--kv-heads", "must divide --heads 2"});
  expect_usage_error("bench --module multihead_v2 --batch 1 --seq 4 --d-model 18 --heads 4", {"--head-dim", "not divisible"});
}

// difftx retrieval --arch: V2 beside DIFF and the Transformer on the same data,
// in one report; the order of the list does not matter, its contents do.
TEST_CASE("cli: retrieval --arch diff,v2,baseline trains and reports three models, the same with one or two jobs") {
  test_support::temp_folder folder;
  const std::string tiny = "retrieval --steps 3 --batch 2 --eval-per-cell 1 --d-model 16 --heads 1 --ffn 16 --context 40 --quiet";
  auto r = difftx_cli(tiny + " --arch baseline,v2,diff --jobs 1 --out " + q(folder / "one"));
  INFO("stdout: " << r.out << "stderr: " << r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("of 12 checks agree") != std::string::npos);
  CHECK(r.out.find("DIFF and DIFF V2 against each other") != std::string::npos);
  r = difftx_cli(tiny + " --arch diff,v2,baseline --jobs 2 --out " + q(folder / "two"));
  REQUIRE(r.code == 0);
  for (const char* file : {"training.csv", "accuracy_by_cell.csv", "by_depth.csv", "attention_profile.csv"}) {
    INFO(file);
    CHECK(read_text(folder / "one" / file) == read_text(folder / "two" / file));
  }
  const auto j = nlohmann::json::parse(read_text(folder / "one" / "report.json"));
  for (const char* model : {"diff", "v2", "baseline"}) {
    INFO(model);
    REQUIRE(j.contains(model));
    for (const char* field : {"accuracy", "attention_to_answer", "attention_noise", "attention_logits", "hidden_states"})
      CHECK(j.at(model).contains(field));
  }
  // V2 against the Transformer it is matched to (2 output heads of 8, 2 key/value heads): 4 query heads, so per
  // layer a q_proj larger by C x C = 256 and a lambda_proj [2, 16] = 32; 2 layers.
  CHECK(j.at("v2").at("parameters").get<index_t>() - j.at("baseline").at("parameters").get<index_t>() == 2 * (256 + 32));
  CHECK(j.at("v2").at("lambda").size() == 2);
  CHECK(j.at("setup").at("architectures") == std::vector<std::string>{"diff", "v2", "baseline"});
  const auto md = read_text(folder / "one" / "report.md");
  CHECK(md.find("| DIFF V2 |") != std::string::npos);
  CHECK(md.find("| " + std::to_string(j.at("v2").at("parameters").get<index_t>()) + " |") != std::string::npos);

  // Two models, either differential one with the baseline; the default stays DIFF and the Transformer.
  r = difftx_cli(tiny + " --arch v2,baseline --out " + q(folder / "v2"));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("of 6 checks agree") != std::string::npos);
  const auto k = nlohmann::json::parse(read_text(folder / "v2" / "report.json"));
  CHECK(k.contains("v2"));
  CHECK_FALSE(k.contains("diff"));
  expect_usage_error(tiny + " --arch diff,v2 --out " + q(folder / "x"), {"--arch", "needs baseline"});
  expect_usage_error(tiny + " --arch baseline --out " + q(folder / "x"), {"--arch", "needs baseline and at least one"});
  expect_usage_error(tiny + " --arch diff,diff,baseline --out " + q(folder / "x"), {"--arch", "diff twice"});
  expect_usage_error(tiny + " --arch diff,v3,baseline --out " + q(folder / "x"), {"--arch", "v3"});
}

// Hugging Face DiffLlama folders (tests/data/hf/, written by transformers 5.23:
// checkpoint_test.cpp holds the library to them) through every command that
// takes a model: run --model, generate --model and --text, bench --model,
// convert both ways; and the malformed folder's one line and untouched output.
namespace {

const auto hf_data = data_dir / "hf";

struct hf_expected {
  std::vector<long long> tokens, prompt, greedy;
  std::map<std::string, std::string> metadata;
  io::tensor_file file;
  explicit hf_expected(const std::string& name) {
    const auto path = hf_data / name / "expected.safetensors";
    file = io::read_safetensors(path);
    metadata = file.metadata;
    const io::mapped_safetensors mapped(path);
    auto ids = [&](const std::string& key) {
      const auto t = mapped.at(key);
      std::vector<long long> v(static_cast<std::size_t>(t.size()));
      std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
      return v;
    };
    tokens = ids("tokens");
    prompt = ids("prompt");
    greedy = ids("greedy");
  }
  std::string joined(const std::vector<long long>& ids) const {
    std::string s;
    for (const auto id : ids) (s += s.empty() ? "" : ",") += std::to_string(id);
    return s;
  }
};

// token ids as an .npy of int64 (or int32), shape [2, N].
void write_token_npy(const std::filesystem::path& path, const std::vector<long long>& ids, bool wide) {
  const std::string descr = wide ? "<i8" : "<i4";
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (2, " + std::to_string(ids.size() / 2) + "), }";
  header.append(64 - (10 + header.size() + 1) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  out << std::string("\x93NUMPY\x01\x00", 8);
  out.put(static_cast<char>(header.size() & 0xff)).put(static_cast<char>(header.size() >> 8));
  out << header;
  for (const auto id : ids) {
    if (wide) {
      out.write(reinterpret_cast<const char*>(&id), 8);
    } else {
      const auto narrow = static_cast<std::int32_t>(id);
      out.write(reinterpret_cast<const char*>(&narrow), 4);
    }
  }
}

double relative_to(const io::stored_tensor& got, const io::stored_tensor& expected) {
  const auto a = got.values(), b = expected.values();
  REQUIRE(a.size() == b.size());
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

}  // namespace

TEST_CASE("cli models: run --model gives transformers' logits for a DiffLlama folder, int32 or int64 token ids") {
  test_support::temp_folder folder;
  for (const std::string name : {"unusual", "sharded", "tied", "bf16", "llama3", "llama3_legacy"}) {
    INFO(name);
    const hf_expected e(name);
    write_token_npy(folder / "ids64.npy", e.tokens, true);
    write_token_npy(folder / "ids32.npy", e.tokens, false);
    const std::string base = "run --model " + q(hf_data / name) + " --output " + q(folder / "logits.npy");
    auto r = difftx_cli(base + " --tokens " + q(folder / "ids64.npy") + " --dtype float64");
    INFO("stderr: " << r.err);
    REQUIRE(r.code == 0);
    auto logits = io::read_npy(folder / "logits.npy");
    CHECK(logits.type == io::dtype::f64);
    CHECK(logits.shape[2] == e.file.at("logits.f64", "test", name).shape[2]);
    // The bars of checkpoint_test.cpp: 2e-6 against transformers' float64 run, 1e-12 against the float64 oracle.
    CHECK(relative_to(logits, e.file.at("logits.f64", "test", name)) <= 2e-6);
    CHECK(relative_to(logits, e.file.at("logits.exact", "test", name)) <= 1e-12);
    r = difftx_cli(base + " --tokens " + q(folder / "ids32.npy"));
    REQUIRE(r.code == 0);
    logits = io::read_npy(folder / "logits.npy");
    CHECK(logits.type == io::dtype::f32);
    CHECK(relative_to(logits, e.file.at("logits.f32", "test", name)) <= 2e-4);
  }
  // Token ids outside the vocabulary, or not ids at all: exit 3, one line, no output file.
  const hf_expected e("plain");
  auto ids = e.tokens;
  ids[3] = 80;  // V = 80
  write_token_npy(folder / "bad.npy", ids, true);
  std::filesystem::remove(folder / "logits.npy");
  auto r = difftx_cli("run --model " + q(hf_data / "plain") + " --tokens " + q(folder / "bad.npy") + " --output " +
                      q(folder / "logits.npy"));
  CHECK(r.code == 3);
  check_message(r.err, {"bad.npy", "token ids in [0, 80)", "80 at flat index 3"});
  CHECK_FALSE(std::filesystem::exists(folder / "logits.npy"));
  r = difftx_cli("run --model " + q(hf_data / "plain") + " --tokens " + q(data_dir / "npy" / "decoder_layer.input.f64.npy") +
                 " --output " + q(folder / "logits.npy"));
  CHECK(r.code == 3);
  check_message(r.err, {"decoder_layer.input.f64.npy", "int32 or int64", "'<f8'"});
  expect_usage_error("run --model " + q(hf_data / "plain") + " --output x.npy", {"--tokens"});
  expect_usage_error("run --model " + q(hf_data / "plain") + " --module multihead --tokens t.npy --output x.npy",
                     {"--model", "--module"});
}

TEST_CASE("cli models: generate --model gives transformers' greedy tokens, and --text its text") {
  for (const std::string name : {"plain", "gqa", "tied", "sharded", "unusual", "llama3", "llama3_legacy"}) {
    INFO(name);
    const hf_expected e(name);
    const auto r = difftx_cli("generate --model " + q(hf_data / name) + " --prompt " + e.joined(e.prompt) +
                              " --max-new-tokens " + std::to_string(e.greedy.size()) + " --dtype float64 --json");
    INFO("stderr: " << r.err);
    REQUIRE(r.code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j.at("tokens").get<std::vector<long long>>() == e.greedy);
    CHECK(j.at("model_kind") == "DiffLlama folder");
  }
  const hf_expected e("tokenizer");
  // The folder's tokenizer.model (SentencePiece), and the same model as a tokenizer.json in its place
  // (tests/data/tokenizer/sp_converted): the same prompt, tokens and text.
  test_support::temp_folder folder;
  std::filesystem::copy(hf_data / "tokenizer", folder / "json", std::filesystem::copy_options::recursive);
  std::filesystem::remove(folder / "json" / "tokenizer.model");
  std::filesystem::copy(data_dir / "tokenizer" / "sp_converted" / "tokenizer.json", folder / "json" / "tokenizer.json");
  for (const auto& model : {hf_data / "tokenizer", folder / "json"}) {
    INFO(model);
    const auto r = difftx_cli("generate --model " + q(model) + " --text '" + e.metadata.at("prompt.text") +
                              "' --max-new-tokens " + std::to_string(e.greedy.size()));
    INFO("stdout: " << r.out << "stderr: " << r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("prompt: " + e.joined(e.prompt) + "\n") != std::string::npos);  // BOS once, then the text's ids
    CHECK(r.out.find("tokens: " + e.joined(e.greedy) + "\n") != std::string::npos);
    CHECK(r.out.find("text: " + e.metadata.at("text.decoded") + "\n") != std::string::npos);
  }
  // Without a tokenizer: a usage error that says why; the ids still work.
  expect_usage_error("generate --model " + q(hf_data / "plain") + " --text hello", {"--text", "tokenizer.json", "tokenizer.model"});
  // A malformed tokenizer.json: bad input, one line naming the file and the key.
  std::filesystem::copy(hf_data / "plain", folder / "plain", std::filesystem::copy_options::recursive);
  std::ofstream(folder / "plain" / "tokenizer.json") << "{}";
  const auto r = difftx_cli("generate --model " + q(folder / "plain") + " --text hello");
  CHECK(r.code == 3);
  check_message(r.err, {"plain/tokenizer.json: model'", "required"});
  expect_usage_error("generate --model " + q(hf_data / "plain") + " --prompt 1 --text hello", {"--prompt", "--text"});
}

// llama3's parameters survive both conversions: in the difftx file's metadata and in the folder written back.
void check_llama3_conversion(const std::filesystem::path& ours, const std::filesystem::path& back) {
  const auto meta = io::read_safetensors(ours).metadata;
  CHECK(meta.at("layers.1.attn.rope_type") == "llama3");
  CHECK(meta.at("layers.1.attn.rope_factor") == "32");
  CHECK(meta.at("layers.1.attn.rope_original_max_positions") == "64");
  const auto config = nlohmann::json::parse(read_text(back / "config.json"));
  for (const auto& scaling : {config.at("rope_parameters"), config.at("rope_scaling")}) {
    CHECK(scaling.at("rope_type") == "llama3");
    CHECK(scaling.at("factor") == 32.0);
    CHECK(scaling.at("low_freq_factor") == 1.0);
    CHECK(scaling.at("high_freq_factor") == 4.0);
    CHECK(scaling.at("original_max_position_embeddings") == 64);
  }
  CHECK(config.at("rope_theta") == 500000.0);
}

TEST_CASE("cli models: convert a DiffLlama folder to one difftx file and back; run and generate need no flags") {
  for (const std::string name : {"unusual", "llama3"}) {
    INFO(name);
    test_support::temp_folder folder;
    const hf_expected e(name);
    auto r = difftx_cli("convert --input " + q(hf_data / name) + " --output " + q(folder / "ours.safetensors"));
    INFO("stderr: " << r.err);
    REQUIRE(r.code == 0);
    const auto ours = io::read_safetensors(folder / "ours.safetensors");
    CHECK(ours.contains("layers.1.attn.subln.weight"));
    if (name == "unusual") CHECK(ours.metadata.at("layers.2.attn.rope_factor") == "2");
    // The converted file decodes as the folder does, with no flag.
    r = difftx_cli("generate --model " + q(folder / "ours.safetensors") + " --prompt " + e.joined(e.prompt) +
                   " --max-new-tokens " + std::to_string(e.greedy.size()) + " --dtype float64 --json");
    REQUIRE(r.code == 0);
    CHECK(nlohmann::json::parse(r.out).at("tokens").get<std::vector<long long>>() == e.greedy);
    expect_usage_error("generate --model " + q(folder / "ours.safetensors") + " --prompt 1 --heads 3",
                       {"--heads", "disagrees", "h = 2"});
    // Back to a folder: the same logits as the original, bit for bit.
    r = difftx_cli("convert --input " + q(folder / "ours.safetensors") + " --output " + q(folder / "back"));
    REQUIRE(r.code == 0);
    write_token_npy(folder / "ids.npy", e.tokens, true);
    if (name == "llama3") check_llama3_conversion(folder / "ours.safetensors", folder / "back");
    for (const auto& model : {hf_data / name, folder / "back", folder / "ours.safetensors"}) {
      r = difftx_cli("run --model " + q(model) + " --tokens " + q(folder / "ids.npy") + " --dtype float64 --output " +
                     q(folder / "logits.npy"));
      REQUIRE(r.code == 0);
      std::filesystem::rename(folder / "logits.npy", folder / ("logits_" + model.filename().string() + ".npy"));
    }
    CHECK(read_text(folder / ("logits_" + name + ".npy")) == read_text(folder / "logits_back.npy"));
    CHECK(read_text(folder / ("logits_" + name + ".npy")) == read_text(folder / "logits_ours.safetensors.npy"));
    // A folder that is not empty is never written into.
    r = difftx_cli("convert --input " + q(folder / "ours.safetensors") + " --output " + q(folder / "back"));
    CHECK(r.code == 3);
    check_message(r.err, {"back", "a new folder", "files in it"});
  }
}

TEST_CASE("cli models: a malformed folder exits 3 with one line naming the file and key, and writes nothing") {
  test_support::temp_folder folder;
  const auto dir = folder / "sharded";
  std::filesystem::copy(hf_data / "sharded", dir, std::filesystem::copy_options::recursive);
  const auto index = nlohmann::json::parse(read_text(dir / "model.safetensors.index.json"));
  const std::string shard = index.at("weight_map").at("model.norm.weight");
  std::filesystem::remove(dir / shard);
  write_token_npy(folder / "ids.npy", hf_expected("sharded").tokens, true);
  for (const auto& command : {"run --model " + q(dir) + " --tokens " + q(folder / "ids.npy") + " --output " + q(folder / "y.npy"),
                              "generate --model " + q(dir) + " --prompt 1,2",
                              "convert --input " + q(dir) + " --output " + q(folder / "out.safetensors")}) {
    INFO(command);
    const auto r = difftx_cli(command);
    CHECK(r.code == 3);
    check_message(r.err, {"model.safetensors.index.json: weight_map.", shard, "no such file"});
    CHECK(r.out.empty());
  }
  CHECK(folder.files() == std::vector<std::string>{"ids.npy", "sharded"});
  auto config = nlohmann::json::parse(read_text(dir / "config.json"));
  config["model_type"] = "llama";
  std::ofstream(dir / "config.json") << config.dump();
  const auto r = difftx_cli("generate --model " + q(dir) + " --prompt 1,2");
  CHECK(r.code == 3);
  check_message(r.err, {"config.json: model_type", "diffllama", "'llama'"});
}

// The bytes of float32 weights one decode step reads, from bench's row: every
// parameter but the embedding table, which is the head where it is tied (the
// same count either way). h differential heads of 2D, g groups.
double decode_weight_bytes(const nlohmann::json& j) {
  const double C = j.at("d_model"), h = j.at("heads"), g = j.at("kv_heads"), D = j.at("head_dim"), F = j.at("ffn_dim"),
               V = j.at("vocab_size"), layers = j.at("layers");
  const double layer = 2 * C + C * 2 * h * D * 2 + C * 2 * g * D * 2 + 4 * D + 2 * D + 3 * C * F;
  return 4 * (layers * layer + C + V * C);
}

TEST_CASE("cli models: bench --model times the real model's prefill and decode against the read time of its weights and cache") {
  for (const char* folder : {"gqa", "tied"}) {
    INFO(folder);
    const auto r = difftx_cli("bench --model " + q(hf_data / folder) +
                              " --seq 6 --new-tokens 3 --repeats 1 --policy reference,simd --json");
    INFO("stderr: " << r.err);
    REQUIRE(r.code == 0);
    std::stringstream lines(r.out);
    int rows = 0;
    for (std::string line; std::getline(lines, line); ++rows) {
      const auto j = nlohmann::json::parse(line);
      CHECK(j.at("prompt_tokens") == 6);
      CHECK(j.at("new_tokens") == 3);
      CHECK(j.at("layers") == 2);
      for (const char* field : {"prefill_ms", "prefill_tokens_per_s", "decode_ms_per_token", "decode_tokens_per_s",
                                "bound_read_ms", "read_GBps", "decode_share_of_bound", "decode_share_of_weights_bound"})
        CHECK(j.at(field).get<double>() > 0);
      CHECK(j.at("weights_read_per_token_bytes").get<double>() == decode_weight_bytes(j));
      // The steps read caches of 7, 8 and 9 tokens: a median of 8 tokens' keys
      // (2 maps of D) and values (2D) in each of g groups, float32, per layer.
      const double g = j.at("kv_heads"), D = j.at("head_dim"), layers = j.at("layers");
      CHECK(j.at("cache_read_per_token_bytes").get<double>() == layers * 8 * g * (2 * D + 2 * D) * 4);
      CHECK(j.at("decode_share_of_weights_bound").get<double>() < j.at("decode_share_of_bound").get<double>());
    }
    CHECK(rows == 2);
  }
  expect_usage_error("bench --model " + q(hf_data / "gqa") + " --backward", {"--backward", "--model"});
}

TEST_CASE("cli models: generate and bench --model take int8 weights and an int8 KV cache, and say so") {
  const hf_expected e("plain");
  const std::string generate = "generate --model " + q(hf_data / "plain") + " --prompt " + e.joined(e.prompt) +
                               " --max-new-tokens " + std::to_string(e.greedy.size()) + " --json";
  for (const std::string storage : {" --weights-dtype int8", " --kv-dtype int8", " --weights-dtype int8 --kv-dtype int8"}) {
    INFO(storage);
    const auto r = difftx_cli(generate + storage);
    INFO("stderr: " << r.err);
    REQUIRE(r.code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j.at("tokens").size() == e.greedy.size());
    CHECK(j.at("weights_dtype") == (storage.find("--weights-dtype") != std::string::npos ? "int8" : "same"));
    CHECK(j.at("kv_dtype") == (storage.find("--kv-dtype") != std::string::npos ? "int8" : "same"));
  }
  const hf_expected tied("tied");  // the head reads an int8 copy of the embedding table
  const auto t = difftx_cli("generate --model " + q(hf_data / "tied") + " --prompt " + tied.joined(tied.prompt) +
                            " --max-new-tokens 3 --weights-dtype int8 --json");
  INFO("stderr: " << t.err);
  CHECK(t.code == 0);
  const auto r = difftx_cli("bench --model " + q(hf_data / "gqa") +
                            " --seq 6 --new-tokens 3 --repeats 1 --weights-dtype int8 --kv-dtype int8 --json");
  INFO("stderr: " << r.err);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j.at("weights_dtype") == "int8");
  CHECK(j.at("kv_dtype") == "int8");
  CHECK(j.at("decode_tokens_per_s").get<double>() > 0);
  for (const char* field : {"weights_read_per_token_bytes", "cache_read_per_token_bytes", "read_GBps",
                            "decode_share_of_bound", "decode_share_of_weights_bound"})
    CHECK(j.at(field).is_null());  // int8 weights: decoding reads their int8 copy, not the parameters' bytes
  expect_usage_error(generate + " --kv-dtype int4", {"--kv-dtype", "int4"});
}

TEST_CASE("cli low-bit: bench and run take --logit-bits, --qk-dtype, --weights-dtype and --kv-dtype; rows say which ran") {
  auto json = [](const std::string& args) {
    const auto r = difftx_cli("bench --json --repeats 1 " + args);
    INFO("difftx bench " << args << "\nstderr: " << r.err);
    REQUIRE(r.code == 0);
    return nlohmann::json::parse(r.out);
  };
  for (const char* storage : {"--weights-dtype int8", "--kv-dtype int8", "--weights-dtype int8 --kv-dtype int8"}) {
    const auto j = json(std::string("--module decoder_layer --batch 2 --context 9 --d-model 16 --heads 2 --decode ") + storage);
    CHECK(j.at("decode_step_ms").get<double>() > 0);
    CHECK(j.at("weights_dtype") == (std::string(storage).find("--weights-dtype") != std::string::npos ? "int8" : "same"));
    CHECK(j.at("kv_dtype") == (std::string(storage).find("--kv-dtype") != std::string::npos ? "int8" : "same"));
  }
  const auto q = json("--module attention --batch 1 --seq 9 --d-model 16 --heads 2 --logit-bits 6 --qk-dtype int8");
  CHECK(q.at("logit_bits") == 6);
  CHECK(q.at("qk_dtype") == "int8");
  expect_usage_error("bench --module multihead --batch 1 --seq 4 --d-model 16 --heads 2 --logit-bits 3", {"--logit-bits", "3"});
  expect_usage_error("bench --module multihead --batch 1 --seq 4 --d-model 16 --heads 2 --kv-dtype int8",
                     {"--kv-dtype", "--decode"});
  expect_usage_error("bench --module multihead --batch 1 --seq 4 --d-model 16 --heads 2 --qk-dtype int4", {"--qk-dtype"});
  // run: quantized logits change the output; a backward through them is bad input, nothing written.
  const std::string run = "run" + fixture_flags + " --kv-heads 1 --weights " + fixture_weights + " --input " + fixture_input;
  test_support::temp_folder folder;
  const auto plain = folder.path() / "plain.npy", four = folder.path() / "four.npy", never = folder.path() / "never.npy";
  REQUIRE(difftx_cli(run + " --output " + plain.string()).code == 0);
  REQUIRE(difftx_cli(run + " --logit-bits 4 --output " + four.string()).code == 0);
  CHECK(io::read_npy(plain.string()).values() != io::read_npy(four.string()).values());
  const auto r = difftx_cli(run + " --logit-bits 4 --output " + never.string() + " --grad-output " + fixture_input +
                            " --grad-input " + (folder.path() / "dx.npy").string());
  CHECK(r.code == 3);
  CHECK(r.err.find("logit_bits") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(never));
}
