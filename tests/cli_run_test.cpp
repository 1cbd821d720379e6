// difftx run on one module: the PyTorch fixtures reproduced (V1, a head size no
// policy compiles, every dtype within its bars, every V2 fixture), and bad
// input exiting 3 with one line naming the file and tensor, writing nothing.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "support/cli_fixtures.hpp"

using namespace cli_fixtures;  // difftx, the fixtures, test_support's tool runners

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
  check_message(r.err, {"odd.safetensors: attn.lambda_q1", "positive even head size D", "MultiHead's config.head_dim",
                        "got 5 (shape [5])"});
  CHECK_FALSE(std::filesystem::exists(folder / "odd_y.npy"));
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
    check_message(r.err, {"w.safetensors: k_proj.weight", "a group count dividing the 4 query heads",
                          "MultiHeadV2's config.kv_heads", "got 3 (shape [12, 16])"});
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
