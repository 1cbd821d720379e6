// difftx bench: what it reports (medians, tokens/s, GFLOP/s, --json's fields),
// the FLOPs it counts (by hand on small shapes, V1 and V2), the kernels that
// ran (against policy::simd's own report), the policy flags every command
// shares, and the low-bit flags it and run take.
#include <doctest/doctest.h>

#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "support/cli_fixtures.hpp"
#include "support/simd_kernels.hpp"

using namespace cli_fixtures;  // difftx, the fixtures, test_support's tool runners

namespace {
// The JSON of `difftx bench --json --repeats 1 <args>`, which must succeed.
nlohmann::json json(const std::string& args) {
  const auto r = difftx_cli("bench --json --repeats 1 " + args);
  INFO("difftx bench " << args << "\nstderr: " << r.err);
  REQUIRE(r.code == 0);
  return nlohmann::json::parse(r.out);
}
}  // namespace

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

// The kernels bench reports are the ones policy::simd says it runs on this CPU
// (support/simd_kernels.hpp), for every choice its flags make: so the same
// expectation holds on an AMX Xeon, a Zen 4 and a Zen 3, and under
// ONEDNN_MAX_CPU_ISA (.ci/run runs this suite again with oneDNN capped).
TEST_CASE("cli: bench --json reports the kernels policy::simd runs here, for each choice of its flags") {
  using library = policy::simd::matmul_library;
  using path = policy::bf16_product;
  const std::pair<std::string, library> matmuls[] = {
      {"automatic", library::automatic}, {"difftx", library::difftx}, {"onednn", library::onednn}};
  const std::pair<std::string, path> products[] = {
      {"automatic", path::automatic}, {"converting", path::converting}, {"dot_instructions", path::dot_instructions}};
  auto check = [](const nlohmann::json& j, const test_support::simd_kernels& expected) {
    CHECK(j.at("product_kernel") == expected.products);
    if (expected.decoding_products.empty())
      CHECK(j.at("decode_product_kernel").is_null());
    else
      CHECK(j.at("decode_product_kernel") == expected.decoding_products);
    CHECK(j.at("score_tile_kernel") == expected.score_tiles);
    CHECK(j.at("amx_tiles") == expected.amx_tiles);
    // The policy column says "amx tiles" exactly where they ran, after the products' kernel where it is not plain.
    const auto detail = j.at("policy_detail").get<std::string>();
    CHECK((detail.find(", amx tiles)") != std::string::npos) == expected.amx_tiles);
    if (expected.products != "difftx") CHECK(detail.find(expected.products) != std::string::npos);
    CHECK((detail.find("decoding " + expected.decoding_products) != std::string::npos) ==
          (!expected.decoding_products.empty() && expected.decoding_products != expected.products));
  };
  for (const auto& [matmul, library_choice] : matmuls)
    for (const std::string amx_flag : {"", " --amx", " --no-amx"}) {
      const bool amx = amx_flag != " --no-amx";  // on by default
      const std::string flags =
          "--module multihead --batch 1 --seq 70 --d-model 32 --heads 2 --policy simd --matmul " + matmul + amx_flag;
      const policy::simd p{.matmuls = library_choice, .amx_tiles = amx};
      INFO(flags);
      check(json(flags + " --dtype float32"), test_support::simd_kernels_of<float>(p));
      check(json(flags + " --dtype float16"), test_support::simd_kernels_of<Eigen::half>(p));
      check(json(flags + " --dtype float32 --qk-dtype int8"),
            test_support::simd_kernels_of<float>(p, logits_unquantized, inference_dtype::int8));
      for (const auto& [product, path_choice] : products) {
        INFO("--bf16-product " << product);
        policy::simd with_path = p;
        with_path.bf16_products = path_choice;
        check(json(flags + " --dtype bfloat16 --bf16-product " + product),
              test_support::simd_kernels_of<Eigen::bfloat16>(with_path));
        check(json(flags + " --dtype bfloat16 --logit-bits 6 --bf16-product " + product),
              test_support::simd_kernels_of<Eigen::bfloat16>(with_path, 6));
      }
    }
  // AMX tiles by default where this CPU grants them; forced, converting is difftx's own bfloat16 product everywhere.
  const auto plain = json("--module swiglu --batch 1 --seq 8 --d-model 16 --policy simd --dtype bfloat16 "
                          "--bf16-product converting --matmul difftx");
  CHECK(plain.at("amx_tiles") == policy::simd{}.amx_tiles_used());
  CHECK(plain.at("product_kernel") == "converting");
  CHECK(plain.at("decode_product_kernel") == "converting");
  CHECK(plain.at("score_tile_kernel").is_null());  // no attention in swiglu
  // The reference policy makes none of these choices.
  const auto reference = json("--module multihead --batch 1 --seq 4 --d-model 16 --heads 2 --policy reference");
  CHECK(reference.at("product_kernel").is_null());
  CHECK(reference.at("score_tile_kernel").is_null());
  CHECK(reference.at("amx_tiles") == false);
}

TEST_CASE("cli: every command takes the policy flags once, and refuses a value that is not one of a flag's names") {
  const std::string module = "bench --module swiglu --batch 1 --seq 8 --d-model 16";
  const std::string model = " --model " + (data_dir / "hf" / "gqa").string();
  for (const std::string& command : {module, "run" + model + " --tokens x.npy --output y.npy",
                                    "generate" + model + " --prompt 1,2", std::string("check")}) {
    expect_usage_error(command + " --bf16-product fast", {"--bf16-product", "fast"});
    expect_usage_error(command + " --matmul mkl", {"--matmul", "mkl"});
    expect_usage_error(command + " --cuda-attention flash", {"--cuda-attention", "flash"});
    expect_usage_error(command + " --threads 0", {"--threads", "0"});
  }
  // --packed-weights is the language models' (bench --model, generate, run --model).
  expect_usage_error(module + " --packed-weights", {"--packed-weights", "--model"});
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

TEST_CASE("cli v2: bench times both V2 kinds, with --baseline and --decode, and counts their FLOPs as documented") {
  for (const char* module : {"multihead_v2", "decoder_layer_v2"})
    for (const char* baseline : {"", " --baseline"})
      for (const char* dtype : {"float32", "bfloat16"}) {
        const auto j = json(std::string("--module ") + module + baseline + " --dtype " + dtype +
                            " --batch 2 --seq 8 --d-model 16 --heads 2 --kv-heads 2 --backward");
        CHECK(j.at("module") == module);
        CHECK(j.at("differential") == (*baseline == '\0'));
        CHECK(j.at("head_dim") == 8);  // C / h
        CHECK(j.at("forward_backward_ms").get<double>() > 0);
      }
  const auto decode = json("--module decoder_layer_v2 --batch 2 --context 8 --d-model 16 --heads 2 --kv-heads 1 --decode");
  CHECK(decode.at("decode_step_ms").get<double>() > 0);
  CHECK(json("--module multihead_v2 --baseline --batch 1 --context 5 --d-model 16 --heads 2 --decode")
            .at("decode_tokens_per_s")
            .get<double>() > 0);
  // g may divide the 2h query heads without dividing h.
  CHECK(json("--module multihead_v2 --batch 1 --seq 4 --d-model 16 --heads 1 --kv-heads 2").at("kv_heads") == 2);
  // The usual head sizes run on the run-time instantiation like any other (V1's half head 64, V2's head 64).
  CHECK(json("--module multihead_v2 --batch 1 --seq 4 --d-model 128 --heads 2").at("head_dim") == 64);
  CHECK(json("--module multihead --batch 1 --seq 4 --d-model 256 --heads 2").at("head_dim") == 64);

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
                     {"--kv-heads", "dividing the 2 query heads", "got 4"});
  expect_usage_error("bench --module multihead_v2 --batch 1 --seq 4 --d-model 18 --heads 4", {"--head-dim", "not divisible"});
}

TEST_CASE("cli low-bit: bench and run take --logit-bits, --qk-dtype, --weights-dtype and --kv-dtype; rows say which ran") {
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
