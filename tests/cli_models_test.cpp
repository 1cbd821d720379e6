// Hugging Face DiffLlama folders (tests/data/hf/, written by transformers 5.23:
// checkpoint_test.cpp holds the library to them) through every command that
// takes a model: run --model, generate --model and --text, bench --model,
// convert both ways; and the malformed folder's one line and untouched output.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <difftx/io/mapped_safetensors.hpp>

#include "support/cli_fixtures.hpp"
#include "support/simd_kernels.hpp"

using namespace cli_fixtures;  // difftx, the fixtures, test_support's tool runners

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

// The same with int8 weights (float32 model, untied head): each projection
// [out, in] reads its int8 rows (in padded to 64), a float step and an int32
// sum per row; the norms and λ vectors stay float32.
double decode_int8_weight_bytes(const nlohmann::json& j) {
  const double C = j.at("d_model"), h = j.at("heads"), g = j.at("kv_heads"), D = j.at("head_dim"), F = j.at("ffn_dim"),
               V = j.at("vocab_size"), layers = j.at("layers");
  const auto projection = [](double out, double in) { return out * std::ceil(in / 64) * 64 + out * 8; };
  const double layer = 4 * (2 * C + 4 * D + 2 * D) + projection(2 * h * D, C) + projection(C, 2 * h * D) +
                       2 * projection(2 * g * D, C) + 2 * projection(F, C) + projection(C, F);
  return layers * layer + 4 * C + projection(V, C);
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

TEST_CASE("cli models: generate and bench --model --packed-weights pack the layers' weights for oneDNN, and say so") {
  // The prompt's products read the packed copy: the same greedy tokens as without it.
  const hf_expected e("plain");
  const std::string generate = "generate --model " + q(hf_data / "plain") + " --prompt " + e.joined(e.prompt) +
                               " --max-new-tokens " + std::to_string(e.greedy.size()) + " --dtype float32 --json";
  const auto plain = difftx_cli(generate), packed = difftx_cli(generate + " --packed-weights");
  INFO("stderr: " << plain.err << packed.err);
  REQUIRE(plain.code == 0);
  REQUIRE(packed.code == 0);
  CHECK(nlohmann::json::parse(packed.out).at("packed_weights") == true);
  CHECK(nlohmann::json::parse(packed.out).at("tokens") == nlohmann::json::parse(plain.out).at("tokens"));
  for (const std::string weights : {"", " --weights-dtype int8"}) {
    INFO(weights);
    const auto r = difftx_cli("bench --model " + q(hf_data / "gqa") +
                              " --seq 6 --new-tokens 2 --repeats 1 --policy simd --packed-weights --json" + weights);
    INFO("stderr: " << r.err);
    REQUIRE(r.code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j.at("packed_weights") == true);
    CHECK(j.at("prefill_ms").get<double>() > 0);
  }
  expect_usage_error("bench --module multihead --batch 1 --seq 4 --d-model 16 --heads 2 --packed-weights",
                     {"--packed-weights", "--model"});
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
  for (const char* field : {"cache_read_per_token_bytes", "read_GBps", "decode_share_of_bound",
                            "decode_share_of_weights_bound"})
    CHECK(j.at(field).get<double>() > 0);
  // int8 weights: decoding's bound reads their int8 copy, not the parameters' bytes.
  CHECK(j.at("weights_read_per_token_bytes").get<double>() == decode_int8_weight_bytes(j));
  // bench --json names what the int8 products of many rows ran on: what policy::simd says its int8 products
  // run on here (oneDNN's int8 kernel where forced and exact on this CPU; difftx's own otherwise).
  for (const auto& [matmul, library] : {std::pair{std::string("onednn"), policy::simd::matmul_library::onednn},
                                        std::pair{std::string("difftx"), policy::simd::matmul_library::difftx}}) {
    const auto b = difftx_cli("bench --model " + q(hf_data / "gqa") +
                              " --seq 6 --new-tokens 1 --repeats 1 --weights-dtype int8 --json --policy simd --matmul " +
                              matmul);
    INFO("--matmul " << matmul << "; stderr: " << b.err);
    REQUIRE(b.code == 0);
    const auto expected = test_support::simd_kernels_of<float, std::int8_t>(policy::simd{.matmuls = library});
    CHECK(nlohmann::json::parse(b.out).at("product_kernel") == expected.products);
  }
  expect_usage_error(generate + " --kv-dtype int4", {"--kv-dtype", "int4"});
}

// Language models on the GPU through the tool (ctest -L gpu runs it where a
// device is): the same fixtures and bars as the CPU cases above, since
// policy::cuda computes float32 in float32 and float64 in double throughout.
TEST_CASE("cli gpu: run, generate and bench --model on --policy cuda give what the CPU gives") {
  const hf_expected e("llama3_legacy");  // bfloat16 file, GQA, tied head, llama3 RoPE from 4.x keys
  const std::string prompt = " --prompt " + e.joined(e.prompt) + " --max-new-tokens " + std::to_string(e.greedy.size());
  const std::string generate = "generate --model " + q(hf_data / "llama3_legacy") + prompt + " --json --policy cuda";
  const auto cuda = probe_cuda();
  if (cuda != cuda_in_tool::ready) {
    const bool built = cuda == cuda_in_tool::no_device;
    MESSAGE((built ? "no CUDA device" : "this difftx is built without CUDA"));
    expect_usage_error(generate, {"--policy", built ? "no CUDA device was found" : "is not built into"});
    return;
  }
  test_support::temp_folder folder;
  for (const std::string name : {"llama3", "llama3_legacy", "sharded"}) {
    INFO(name);
    const hf_expected expected(name);
    write_token_npy(folder / "ids.npy", expected.tokens, true);
    const std::string base = "run --model " + q(hf_data / name) + " --tokens " + q(folder / "ids.npy") + " --output " +
                             q(folder / "logits.npy") + " --policy cuda";
    auto r = difftx_cli(base + " --dtype float64");
    INFO("stderr: " << r.err);
    REQUIRE(r.code == 0);
    CHECK(relative_to(io::read_npy(folder / "logits.npy"), expected.file.at("logits.f64", "test", name)) <= 2e-6);
    CHECK(relative_to(io::read_npy(folder / "logits.npy"), expected.file.at("logits.exact", "test", name)) <= 1e-12);
    r = difftx_cli(base + " --dtype float32");
    REQUIRE(r.code == 0);
    CHECK(relative_to(io::read_npy(folder / "logits.npy"), expected.file.at("logits.f32", "test", name)) <= 2e-4);
  }
  // Greedy: transformers' tokens. Sampled: the reference policy's tokens for the same seed.
  auto r = difftx_cli(generate + " --dtype float64");
  INFO("stderr: " << r.err);
  REQUIRE(r.code == 0);
  CHECK(nlohmann::json::parse(r.out).at("tokens").get<std::vector<long long>>() == e.greedy);
  const std::string sampled = " --dtype float64 --temperature 0.8 --top-k 20 --top-p 0.9 --seed 7";
  const auto on_cpu = difftx_cli("generate --model " + q(hf_data / "llama3_legacy") + prompt + " --json --policy reference" + sampled);
  r = difftx_cli(generate + sampled);
  REQUIRE(on_cpu.code == 0);
  REQUIRE(r.code == 0);
  CHECK(nlohmann::json::parse(r.out).at("tokens") == nlohmann::json::parse(on_cpu.out).at("tokens"));
  // Text in, text out, on the GPU.
  const hf_expected text("tokenizer");
  r = difftx_cli("generate --model " + q(hf_data / "tokenizer") + " --text '" + text.metadata.at("prompt.text") +
                 "' --max-new-tokens " + std::to_string(text.greedy.size()) + " --dtype float64 --policy cuda");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("tokens: " + text.joined(text.greedy) + "\n") != std::string::npos);
  CHECK(r.out.find("text: " + text.metadata.at("text.decoded") + "\n") != std::string::npos);
  // One table of CPU and GPU for the same folder; the GPU's bound read by the device.
  r = difftx_cli("bench --model " + q(hf_data / "gqa") + " --seq 6 --new-tokens 3 --repeats 1 --policy simd,cuda --json");
  REQUIRE(r.code == 0);
  std::stringstream lines(r.out);
  std::vector<std::string> policies;
  for (std::string line; std::getline(lines, line);) {
    const auto j = nlohmann::json::parse(line);
    policies.push_back(j.at("policy"));
    for (const char* field : {"prefill_ms", "decode_ms_per_token", "bound_read_ms", "read_GBps", "decode_share_of_bound"})
      CHECK(j.at(field).get<double>() > 0);
  }
  CHECK(policies == std::vector<std::string>{"simd", "cuda"});
  // int8 storage is the CPU policies': bad input, one line, before any decoding.
  r = difftx_cli(generate + " --weights-dtype int8");
  CHECK(r.code == 3);
  check_message(r.err, {"policy", "int8"});
  r = difftx_cli(generate + " --kv-dtype int8");
  CHECK(r.code == 3);
  check_message(r.err, {"storage", "a policy with int8 caches", "policy::cuda"});
}
