// The difftx tool run as a user runs it (the built binary, DIFFTX_CLI), one
// executable of several files, by command: this one holds what spans the
// commands (--help, usage errors exit 2 with one line, policy::cuda through
// run, bench and check); cli_run_test.cpp `run` (V1 and V2 fixtures, bad
// input), cli_bench_test.cpp `bench` (FLOPs by hand, low-bit flags),
// cli_check_test.cpp `check`, cli_generate_test.cpp `generate`,
// cli_models_test.cpp --model (DiffLlama folders and difftx files through run,
// generate, bench and convert), cli_retrieval_test.cpp `retrieval --arch`,
// cli_hardening_test.cpp issue 16's hostile inputs. support/cli_fixtures.hpp
// holds the fixtures and comparisons they share.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "support/cli_fixtures.hpp"

using namespace cli_fixtures;  // difftx, the fixtures, test_support's tool runners

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
                     {"--kv-heads", "dividing heads = 4", "got 3"});
  expect_usage_error(run + " --grad-input dx.npy", {"--grad-input", "--grad-output"});
  expect_usage_error("run --module attention --weights w --input x --output y", {"--heads", "attention"});
  expect_usage_error("bench --module multihead --batch 1 --seq 4 --d-model 20 --heads 2", {"--head-dim", "positive even head size D", "got 5", "20 / 4"});
  expect_usage_error("bench --module multihead --batch 1 --seq 4 --d-model 20 --heads 3", {"--head-dim", "not divisible"});
  expect_usage_error("bench --module multihead --batch 1 --seq 4 --d-model 16", {"--heads"});
  CHECK_FALSE(std::filesystem::exists("/tmp/difftx_never_written.npy"));
}

// policy::cuda through the tool. Where the tool has it and a device is
// present, this reproduces the fixture on the GPU (ctest -L gpu runs it:
// tests/CMakeLists.txt); elsewhere it asserts what a user without one sees.
TEST_CASE("cli gpu: --policy cuda reproduces the PyTorch fixture, or says in one line why it cannot run") {
  const std::string run = "run" + fixture_flags + " --kv-heads 1 --weights " + fixture_weights + " --input " +
                          fixture_input + " --output /tmp/difftx_never_written.npy --policy cuda";
  const auto cuda = probe_cuda();
  if (cuda == cuda_in_tool::not_built) {
    MESSAGE("this difftx is built without CUDA");
    expect_usage_error(run, {"--policy", "policy 'cuda' is not built into this difftx"});
    return;
  }
  if (cuda == cuda_in_tool::no_device) {
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
