// Hugging Face DiffLlama checkpoints (io/diffllama.hpp) against transformers
// itself: the folders under tests/data/hf/ were written by transformers 5.23's
// save_pretrained, with its logits, an independent float64 evaluation and its
// greedy generate beside them (tools/make_fixtures.py --hf). Every refusal of
// a folder difftx cannot read exactly, the architecture recorded in the files
// difftx writes, and the conversion both ways.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <difftx/difftx.hpp>
#include <difftx/io/diffllama.hpp>
#include <difftx/io/mapped_safetensors.hpp>
#include <difftx/policy/simd.hpp>
#include <difftx/testing/tolerance.hpp>

#include "support/helpers.hpp"
#include "support/temp_folder.hpp"

using namespace difftx;
using test_support::expect_input_error;
namespace fs = std::filesystem;

namespace {

const fs::path hf_data = fs::path(DIFFTX_TEST_DATA) / "hf";
const std::vector<std::string> cases{"plain",         "gqa",       "tied",   "sharded",      "bf16",
                                     "unusual",       "legacy_config", "tokenizer", "llama3", "llama3_legacy"};

// A fixture's expected.safetensors: tokens, logits, the greedy continuation.
struct expected {
  Tensor<token_t, 2> tokens;
  std::vector<double> exact, transformers_f64, transformers_f32;
  std::vector<token_t> prompt, greedy;

  explicit expected(const std::string& name) {
    const io::mapped_safetensors file(hf_data / name / "expected.safetensors");
    const auto ids = [&](const std::string& key) {
      const auto t = file.at(key);
      REQUIRE(t.dtype_name == "I64");
      std::vector<long long> raw(static_cast<std::size_t>(t.size()));
      std::memcpy(raw.data(), t.bytes.data(), t.bytes.size());
      return std::vector<token_t>(raw.begin(), raw.end());
    };
    const auto values = [&](const std::string& key) {
      std::vector<double> v(static_cast<std::size_t>(file.at(key).size()));
      file.at(key).decode_into(v.data());
      return v;
    };
    const auto shape = file.at("tokens").shape;
    tokens = Tensor<token_t, 2>({shape[0], shape[1]});
    const auto all = ids("tokens");
    std::copy(all.begin(), all.end(), tokens.data());
    exact = values("logits.exact");
    transformers_f64 = values("logits.f64");
    transformers_f32 = values("logits.f32");
    prompt = ids("prompt");
    greedy = ids("greedy");
  }
};

// max |a - b| / max |b|
template <class T>
double relative_difference(const Tensor<T, 3>& a, const std::vector<double>& b) {
  REQUIRE(static_cast<std::size_t>(a.size()) == b.size());
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::abs(scalar_traits<T>::to_double(a.data()[i]) - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

template <class T, class Policy>
Tensor<T, 3> logits_of(const io::diffllama_model<T, Policy>& model, const Tensor<token_t, 2>& tokens) {
  Tensor<T, 3> logits(model.output_shape(tokens.shape()));
  model.forward(tokens, logits);
  return logits;
}

// Greedy decoding through the KV cache: the prompt in one prefill, then a token at a time.
template <class Model>
std::vector<token_t> greedy_tokens(const Model& model, const std::vector<token_t>& prompt, std::size_t count) {
  using T = typename Model::value_type;
  Tensor<token_t, 2> tokens({1, static_cast<index_t>(prompt.size())});
  std::copy(prompt.begin(), prompt.end(), tokens.data());
  auto cache = model.make_cache(1, static_cast<index_t>(prompt.size() + count));
  Tensor<T, 3> logits(model.output_shape(tokens.shape()));
  model.prefill(tokens, cache, logits);
  std::vector<token_t> out;
  while (true) {
    const index_t V = logits.extent(2);
    const T* last = logits.data() + (logits.extent(1) - 1) * V;
    out.push_back(static_cast<token_t>(std::max_element(last, last + V) - last));
    if (out.size() == count) return out;
    Tensor<token_t, 2> next({1, 1});
    next(0, 0) = out.back();
    logits = Tensor<T, 3>(model.output_shape(next.shape()));
    model.decode(next, cache, logits);
  }
}

// A copy of fixture `name` in a temporary folder, for a test to break.
fs::path copy_of(const std::string& name, const test_support::temp_folder& folder) {
  const auto to = folder / name;
  fs::copy(hf_data / name, to, fs::copy_options::recursive);
  return to;
}

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}
void write_json(const fs::path& path, const nlohmann::json& j) { std::ofstream(path) << j.dump(2); }

}  // namespace

// The bars. transformers' "float64" run keeps RMSNorm, the RoPE tables, the
// softmax and lambda in float32 (measured by the fixture script: 1.3e-7 to
// 2.7e-7 from the exact float64 evaluation), so difftx in float64 is held to
// 2e-6 against it and to 1e-12 against the independent float64 evaluation
// (float64 sums over at most 64 products through 3 layers: ~1e-14; measured
// 1.6e-15). In float32 (policy::simd) both sides round every operation to
// float: 2e-4 against transformers' float32 logits (the bar) and
// tolerance<float>::forward (8 u + 64 u, 4.3e-6) against the exact values.
TEST_CASE("DiffLlama checkpoints: difftx's logits are transformers' in float64 and float32") {
  for (const auto& name : cases) {
    CAPTURE(name);
    const expected e(name);
    const auto reference = io::load_diffllama<double>(hf_data / name);
    const auto logits64 = logits_of(reference, e.tokens);
    CHECK(relative_difference(logits64, e.exact) <= 1e-12);
    CHECK(relative_difference(logits64, e.transformers_f64) <= 2e-6);

    const auto simd64 = io::load_diffllama<double>(hf_data / name, policy::simd{});
    CHECK(relative_difference(logits_of(simd64, e.tokens), e.exact) <= 1e-12);

    const auto simd32 = io::load_diffllama<float>(hf_data / name, policy::simd{});
    const auto logits32 = logits_of(simd32, e.tokens);
    CHECK(relative_difference(logits32, e.transformers_f32) <= 2e-4);
    CHECK(relative_difference(logits32, e.exact) <= testing::tolerance<float>::forward);
  }
}

TEST_CASE("DiffLlama checkpoints: greedy decoding with the KV cache gives transformers' generate") {
  for (const auto& name : cases) {
    CAPTURE(name);
    const expected e(name);
    CHECK(greedy_tokens(io::load_diffllama<double>(hf_data / name), e.prompt, e.greedy.size()) == e.greedy);
    CHECK(greedy_tokens(io::load_diffllama<float>(hf_data / name, policy::simd{}), e.prompt, e.greedy.size()) ==
          e.greedy);
  }
}

TEST_CASE("DiffLlama checkpoints: the config is followed, not assumed") {
  const auto unusual = io::read_diffllama_config(hf_data / "unusual");
  CHECK(unusual.rms_norm_eps == 1e-6);
  CHECK(unusual.rope_theta == 500000.0);
  CHECK(unusual.rope == rope_scaling{.type = rope_type::linear, .factor = 2.0});
  CHECK(unusual.head_dim == 16);
  CHECK(unusual.hidden_size / unusual.attention_heads != unusual.head_dim);
  const auto legacy = io::read_diffllama_config(hf_data / "legacy_config");  // rope_theta and rope_scaling, 4.x keys
  CHECK(legacy.rope_theta == 50000.0);
  CHECK(legacy.rope == rope_scaling{.type = rope_type::linear, .factor = 4.0});
  // llama3 RoPE in both spellings: 5.x's rope_parameters and 4.x's rope_scaling with a top-level rope_theta.
  const auto llama3 = io::read_diffllama_config(hf_data / "llama3");
  CHECK(llama3.rope_theta == 500000.0);
  CHECK(llama3.rope == rope_scaling{.type = rope_type::llama3, .factor = 32.0, .low_freq_factor = 1.0,
                                    .high_freq_factor = 4.0, .original_max_positions = 64.0});
  const auto llama3_legacy = io::read_diffllama_config(hf_data / "llama3_legacy");
  CHECK(llama3_legacy.rope_theta == 200000.0);
  CHECK(llama3_legacy.rope == rope_scaling{.type = rope_type::llama3, .factor = 8.0, .low_freq_factor = 1.0,
                                           .high_freq_factor = 8.0, .original_max_positions = 512.0});
  CHECK(io::read_diffllama_config(hf_data / "tied").tie_word_embeddings);
  CHECK(io::read_diffllama_config(hf_data / "bf16").dtype == "bfloat16");

  // The model built from it carries every value into the layers.
  const auto model = io::load_diffllama<double>(hf_data / "unusual");
  const auto& layer = model.layers()[2].config();
  CHECK(layer.eps == 1e-6);
  CHECK(layer.attention.subln_eps == 1e-6);
  CHECK(layer.attention.rope_scaling.factor == 2.0);
  CHECK(layer.attention.layer_index == 2);
  CHECK(layer.attention.heads == 2);
  CHECK(layer.attention.kv_heads == 1);
  CHECK(model.config().eps == 1e-6);

  // A tied model has no lm_head: its head is the embedding table.
  auto tied = io::load_diffllama<double>(hf_data / "tied");
  for (const auto& p : tied.parameters()) CHECK(p.name != "lm_head.weight");
}

TEST_CASE("DiffLlama checkpoints: what difftx cannot run exactly is refused, naming the file and the key") {
  test_support::temp_folder folder;
  const auto dir = copy_of("plain", folder);
  const auto config_path = dir / "config.json";
  const auto config = read_json(config_path);
  const std::string label = config_path.string();
  auto refused = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& key,
                     const std::string& expected, const std::string& got) {
    auto edited = config;
    edit(edited);
    write_json(config_path, edited);
    expect_input_error([&] { io::load_diffllama<double>(dir); }, "read_diffllama", label + ": " + key, expected, got);
  };
  refused([](auto& j) { j["model_type"] = "llama"; }, "model_type", "diffllama", "'llama'");
  refused([](auto& j) { j.erase("model_type"); }, "model_type", "diffllama", "none");
  refused([](auto& j) { j["hidden_act"] = "gelu"; }, "hidden_act", "silu", "'gelu'");
  refused([](auto& j) { j["attention_bias"] = true; }, "attention_bias", "false", "true");
  refused([](auto& j) { j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; }, "rope_parameters.rope_type",
          "default, linear or llama3", "'yarn'");
  refused([](auto& j) { j["rope_parameters"] = {{"rope_type", "linear"}}; }, "rope_parameters.factor",
          "the linear scaling factor", "none");
  refused([](auto& j) {
            j.erase("rope_parameters");
            j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
          },
          "rope_scaling.type", "default, linear or llama3", "'dynamic'");
  refused([](auto& j) { j["rope_parameters"] = {{"rope_type", "longrope"}, {"factor", 4.0}}; },
          "rope_parameters.rope_type", "default, linear or llama3", "'longrope'");
  const nlohmann::json llama3 = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 32.0},
                                 {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                                 {"original_max_position_embeddings", 8192}};
  refused([&](auto& j) { j["rope_parameters"] = llama3; j["rope_parameters"].erase("low_freq_factor"); },
          "rope_parameters.low_freq_factor", "llama3's low_freq_factor", "none");
  refused([&](auto& j) { j["rope_parameters"] = llama3; j["rope_parameters"]["high_freq_factor"] = 0.5; },
          "rope_parameters.high_freq_factor", "more than low_freq_factor", "0.5");
  refused([&](auto& j) { j["rope_parameters"] = llama3; j["rope_parameters"]["factor"] = -1; },
          "rope_parameters.factor", "a finite number > 0", "-1");
  refused([](auto& j) { j["rope_parameters"]["partial_rotary_factor"] = 0.5; }, "rope_parameters.partial_rotary_factor",
          "1", "0.5");
  refused([](auto& j) { j["num_key_value_heads"] = 1; }, "num_key_value_heads", "an even count", "1");
  refused([](auto& j) { j["num_key_value_heads"] = 3; }, "num_key_value_heads", "an even count", "3");
  refused([](auto& j) { j["num_attention_heads"] = 6; j["num_key_value_heads"] = 4; }, "num_key_value_heads",
          "a divisor of num_attention_heads", "4");
  refused([](auto& j) { j["head_dim"] = 7; }, "head_dim", "an even size", "7");
  refused([](auto& j) { j["vocab_size"] = "80"; }, "vocab_size", "a whole number", "\"80\"");
  refused([](auto& j) { j.erase("hidden_size"); }, "hidden_size", "required", "none");
  refused([](auto& j) { j["rms_norm_eps"] = -1; }, "rms_norm_eps", "a finite number > 0", "-1");

}

TEST_CASE("DiffLlama checkpoints: malformed folders are refused before anything is built") {
  test_support::temp_folder folder;
  SUBCASE("config and tensor shapes disagree") {
    const auto dir = copy_of("plain", folder);
    auto j = read_json(dir / "config.json");
    j["intermediate_size"] = 65;
    write_json(dir / "config.json", j);
    expect_input_error([&] { io::load_diffllama<double>(dir); }, "read_diffllama",
                       (dir / "model.safetensors").string() + ": model.layers.0.mlp.gate_proj.weight",
                       "shape [65, 32]", "shape [64, 32]");
  }
  SUBCASE("a tensor the config implies is missing") {
    const auto dir = copy_of("plain", folder);
    auto j = read_json(dir / "config.json");
    j["num_hidden_layers"] = 3;
    write_json(dir / "config.json", j);
    expect_input_error([&] { io::load_diffllama<double>(dir); }, "read_diffllama",
                       (dir / "model.safetensors").string() + ": model.layers.2.input_layernorm.weight",
                       "a tensor named", "none");
  }
  SUBCASE("a shard the index names is missing") {
    const auto dir = copy_of("sharded", folder);
    const auto index = read_json(dir / "model.safetensors.index.json");
    const auto [tensor, shard] = *index["weight_map"].items().begin();
    fs::remove(dir / shard.get<std::string>());
    expect_input_error([&] { io::load_diffllama<double>(dir); }, "read_checkpoint",
                       (dir / "model.safetensors.index.json").string() + ": weight_map." + tensor, "the shard file",
                       "no such file");
  }
  SUBCASE("the index names a tensor its shard lacks") {
    const auto dir = copy_of("sharded", folder);
    auto index = read_json(dir / "model.safetensors.index.json");
    const std::string shard = index["weight_map"]["model.norm.weight"];
    index["weight_map"]["model.extra.weight"] = shard;
    write_json(dir / "model.safetensors.index.json", index);
    expect_input_error([&] { io::load_diffllama<double>(dir); }, "read_checkpoint",
                       (dir / shard).string() + ": model.extra.weight", "the tensor that", "no such tensor");
  }
  SUBCASE("the index points out of the folder") {
    const auto dir = copy_of("sharded", folder);
    auto index = read_json(dir / "model.safetensors.index.json");
    index["weight_map"]["model.norm.weight"] = "../model.safetensors";
    write_json(dir / "model.safetensors.index.json", index);
    expect_input_error([&] { io::load_diffllama<double>(dir); }, "read_checkpoint",
                       (dir / "model.safetensors.index.json").string() + ": weight_map.model.norm.weight",
                       "a file name in the checkpoint folder", "'../model.safetensors'");
  }
  SUBCASE("no weights, no config, no folder") {
    const auto dir = copy_of("plain", folder);
    fs::remove(dir / "model.safetensors");
    expect_input_error([&] { io::load_diffllama<double>(dir); }, "read_checkpoint", dir.string(),
                       "model.safetensors or model.safetensors.index.json", "neither");
    fs::remove(dir / "config.json");
    expect_input_error([&] { io::load_diffllama<double>(dir); }, "read_diffllama", (dir / "config.json").string(),
                       "a readable file", "no such file");
    expect_input_error([&] { io::load_diffllama<double>(folder / "none"); }, "read_diffllama",
                       (folder / "none" / "config.json").string(), "a readable file", "no such file");
  }
}

TEST_CASE("DiffLlama checkpoints: converted to difftx's names and back, the same logits bit for bit") {
  test_support::temp_folder folder;
  for (const auto& name : {"plain", "tied", "sharded", "bf16", "unusual"}) {
    CAPTURE(name);
    const expected e(name);
    const io::diffllama_checkpoint checkpoint(hf_data / name);
    const auto ours = checkpoint.to_difftx_file();
    // Stored dtypes are kept: a bf16 checkpoint stays bf16.
    CHECK(ours.at("layers.0.attn.q_proj.weight", "test", name).type ==
          (std::string(name) == "bf16" ? io::dtype::bf16 : io::dtype::f32));
    // Its architecture is in its metadata, and a model built from the config loads it.
    CHECK(ours.metadata.at("layers.1.attn.layer_index") == "1");
    auto model = io::make_diffllama_model<double>(checkpoint.config());
    io::load_parameters(model, ours, name);
    const auto direct = logits_of(io::load_diffllama<double>(hf_data / name), e.tokens);
    const auto via_file = logits_of(model, e.tokens);
    CHECK(std::equal(direct.data(), direct.data() + direct.size(), via_file.data()));

    const auto back = folder / (std::string(name) + "_back");
    io::write_diffllama(ours, name, back);
    const auto again = logits_of(io::load_diffllama<double>(back), e.tokens);
    CHECK(std::equal(direct.data(), direct.data() + direct.size(), again.data()));
    CHECK(io::read_diffllama_config(back).tie_word_embeddings == checkpoint.config().tie_word_embeddings);
  }
}

TEST_CASE("DiffLlama checkpoints: what transformers cannot express is not written, and nothing is") {
  test_support::temp_folder folder;
  const io::diffllama_checkpoint checkpoint(hf_data / "plain");
  auto refused = [&](const std::function<void(io::tensor_file&)>& edit, const std::string& argument,
                     const std::string& expected) {
    auto file = checkpoint.to_difftx_file();
    edit(file);
    expect_input_error([&] { io::write_diffllama(file, "ours", folder / "out"); }, "write_diffllama", argument, expected,
                       "");
    CHECK(folder.files().empty());
  };
  refused([](auto& f) { f.metadata["layers.1.attn.layer_index"] = "0"; },
          "ours: __metadata__.layers.1.attn.layer_index", "lambda_init from the layer's position");
  refused([](auto& f) { f.metadata["layers.0.ffn_norm.eps"] = "1e-06"; }, "ours: __metadata__.layers.0.ffn_norm.eps",
          "one rms_norm_eps");
  refused([](auto& f) { f.metadata["layers.1.attn.causal"] = "false"; }, "ours: __metadata__.layers.1.attn.causal",
          "a causal language model");
  refused([](auto& f) { f.metadata.erase("layers"); }, "ours: __metadata__.layers", "the architecture");
  refused(
      [](auto& f) {
        f.tensors["layers.0.attn.subln.weight"] =
            io::stored_tensor::from_values(io::dtype::f32, {16}, std::vector<double>(16, 0.5));
      },
      "ours: layers.0.attn.subln.weight", "all ones");
  // An existing folder with files in it is never overwritten.
  fs::create_directory(folder / "taken");
  std::ofstream(folder / "taken" / "keep.txt") << "mine";
  expect_input_error([&] { io::write_diffllama(checkpoint.to_difftx_file(), "ours", folder / "taken"); },
                     "write_diffllama", (folder / "taken").string(), "a new folder", "a folder with files in it");
  CHECK(fs::exists(folder / "taken" / "keep.txt"));
}

TEST_CASE("model files record the architecture; a module built otherwise refuses them") {
  using Layer = DecoderLayer<double, dynamic>;
  auto make = [](index_t first_index, index_t kv_heads) {
    std::vector<Layer> layers;
    for (index_t i = 0; i < 2; ++i)
      layers.emplace_back(DecoderLayerConfig{{.d_model = 16, .heads = 2, .kv_heads = kv_heads,
                                              .layer_index = first_index * i, .head_dim = 4}, 24});
    return LanguageModel<Layer>({.vocab_size = 9, .d_model = 16}, std::move(layers));
  };
  auto saved = make(1, 2);
  io::tensor_file file;
  io::store_parameters(file, saved, io::dtype::f64);
  CHECK(file.metadata.at("layers") == "2");
  CHECK(file.metadata.at("layers.1.attn.layer_index") == "1");
  CHECK(file.metadata.at("layers.1.attn.subln.eps") == "1e-05");
  CHECK(file.metadata.at("tie_word_embeddings") == "false");

  auto same = make(1, 2);
  io::load_parameters(same, file, "lm.safetensors");  // loads
  auto every_layer_zero = make(0, 2);  // the mistake: every layer kept layer_index 0
  const auto before = every_layer_zero.parameters().front().value[0];
  expect_input_error([&] { io::load_parameters(every_layer_zero, file, "lm.safetensors"); }, "load_parameters",
                     "layers.1.attn.layer_index", "0 (the module's)", "1");
  CHECK(every_layer_zero.parameters().front().value[0] == before);  // nothing changed
  // One layer of the file, at its prefix: its own keys are checked.
  Layer layer1({{.d_model = 16, .heads = 2, .layer_index = 1, .head_dim = 4}, 24});
  io::load_parameters(layer1, file, "lm.safetensors", "layers.1.");
  Layer layer1_as_3({{.d_model = 16, .heads = 2, .layer_index = 3, .head_dim = 4}, 24});
  expect_input_error([&] { io::load_parameters(layer1_as_3, file, "lm.safetensors", "layers.1."); }, "load_parameters",
                     "layers.1.attn.layer_index", "3", "1");
  // A file written elsewhere (no metadata) loads as before.
  file.metadata.clear();
  io::load_parameters(every_layer_zero, file, "lm.safetensors");
}

TEST_CASE("LanguageModel: a d_model the layers do not have is refused at construction") {
  std::vector<DecoderLayer<double, 2>> layers;
  layers.emplace_back(DecoderLayerConfig{{.d_model = 8, .heads = 2}, 16});
  expect_input_error([&] { LanguageModel<DecoderLayer<double, 2>>({.vocab_size = 5, .d_model = 12}, layers); },
                     "LanguageModel", "config.d_model", "the width of every layer (layer 0: 8)", "12");
}
