// Issue 16's classes, each as a hostile user met it: sizes that overflow,
// unbounded counts, partial results, NaN from finite inputs, escaped
// messages, lenient headers, memory, signals and shared output paths.
#include <doctest/doctest.h>

#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/cli_fixtures.hpp"

using namespace cli_fixtures;  // difftx, the fixtures, test_support's tool runners

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
