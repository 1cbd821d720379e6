// difftx generate on a small random language model written from C++ (2 layers,
// V = 23, C = 16, h = 2, g = 1, D = 4, F = 32): the tool's greedy decoding with
// the KV cache against greedy decoding by full forwards over the growing
// sequence, computed here with the library; the sampler's flags against the
// library's generate; the llama3 fixture folder stopping at its EOS where
// transformers' generate stops (tests/data/sampling.json); --prompts-file
// against one prompt at a time; its bad input and usage errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <difftx/difftx.hpp>
#include <difftx/generation/generate.hpp>
#include <difftx/io/parameters.hpp>

#include "support/cli_fixtures.hpp"

using namespace cli_fixtures;  // difftx, the fixtures, test_support's tool runners

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

TEST_CASE("cli: generate's sampler flags are the library's chain: penalties, min-p, the same draws for a seed") {
  test_support::temp_folder folder;
  auto model = small_language_model();
  io::write_safetensors(folder / "lm.safetensors", language_model_weights(model));
  const std::string generate = "generate --weights " + q(folder / "lm.safetensors") +
                               " --prompt 5,0,17,3 --max-new-tokens 12 --dtype float64 --policy reference --json";
  const std::vector<token_t> prompt{5, 0, 17, 3};
  const std::vector<std::pair<std::string, sampling_options>> cases{
      {" --repetition-penalty 1.8", {.repetition_penalty = 1.8}},
      {" --presence-penalty 0.7 --frequency-penalty 0.4", {.presence_penalty = 0.7, .frequency_penalty = 0.4}},
      {" --temperature 0.9 --min-p 0.1 --seed 4", {.temperature = 0.9, .min_p = 0.1, .seed = 4}},
      {" --temperature 1.1 --top-k 9 --top-p 0.9 --min-p 0.02 --repetition-penalty 1.2 --presence-penalty 0.1"
       " --frequency-penalty 0.2 --seed 8",
       {.temperature = 1.1, .top_k = 9, .top_p = 0.9, .min_p = 0.02, .repetition_penalty = 1.2,
        .presence_penalty = 0.1, .frequency_penalty = 0.2, .seed = 8}}};
  for (const auto& [flags, sampling] : cases) {
    INFO(flags);
    const auto r = difftx_cli(generate + flags);
    INFO("stderr: " << r.err);
    REQUIRE(r.code == 0);
    const auto j = nlohmann::json::parse(r.out);
    const auto expected = difftx::generate(model, prompt, {.max_new_tokens = 12, .sampling = sampling});
    CHECK(j.at("tokens").get<std::vector<token_t>>() == expected);
    CHECK(j.at("min_p") == sampling.min_p);
    CHECK(j.at("repetition_penalty") == sampling.repetition_penalty);
  }
  // The penalties change greedy's tokens (else the cases above would test nothing).
  CHECK(difftx::generate(model, prompt, {.max_new_tokens = 12, .sampling = {.repetition_penalty = 1.8}}) !=
        difftx::generate(model, prompt, {.max_new_tokens = 12}));
  const std::string base = "generate --weights " + q(folder / "lm.safetensors") + " --prompt 1";
  expect_usage_error(base + " --min-p 0.1", {"--min-p", "--temperature"});
  expect_usage_error(base + " --temperature 1 --min-p 1.5", {"--min-p"});
  expect_usage_error(base + " --repetition-penalty 0", {"--repetition-penalty"});
  expect_usage_error(base + " --presence-penalty x", {"--presence-penalty"});
}

TEST_CASE("cli: generate stops at the llama3 folder's EOS where transformers' generate stops") {
  const auto fixture = nlohmann::json::parse(read_text(data_dir / "sampling.json"));
  for (const auto& stop : fixture.at("stops")) {
    const auto prompt = stop.at("prompt").get<std::vector<token_t>>();
    const auto tokens = stop.at("tokens").get<std::vector<token_t>>();
    std::string ids;
    for (const auto t : prompt) ids.append(ids.empty() ? "" : ",").append(std::to_string(t));
    for (const std::string dtype : {"float64", "float32"}) {
      INFO("prompt " << ids << ", " << dtype);
      const auto r = difftx_cli("generate --model " + q(data_dir / stop.at("folder").get<std::string>()) + " --prompt " +
                                ids + " --max-new-tokens " + std::to_string(stop.at("max_new_tokens").get<int>()) +
                                " --dtype " + dtype + " --json");
      INFO("stderr: " << r.err);
      REQUIRE(r.code == 0);
      const auto j = nlohmann::json::parse(r.out);
      CHECK(j.at("tokens").get<std::vector<token_t>>() == tokens);
      CHECK(j.at("stop") == "eos");
      CHECK(j.at("eos_token_ids") == stop.at("eos_token_ids"));
    }
  }
}

TEST_CASE("cli: generate --prompts-file decodes every line at once: one JSON line each, in order, as alone") {
  // The hf tokenizer fixture's model with the tokenizer.json its tokenizer.model converts to.
  test_support::temp_folder folder;
  const auto model = folder / "model";
  std::filesystem::create_directories(model);
  for (const char* file : {"config.json", "generation_config.json", "model.safetensors"})
    std::filesystem::copy(data_dir / "hf" / "tokenizer" / file, model / file);
  std::filesystem::copy(data_dir / "tokenizer" / "sp_converted" / "tokenizer.json", model / "tokenizer.json");
  const std::vector<std::string> lines{"The river ran past the", "In the spring", "The teacher drew a map of the valley",
                                       "Every morning the miller"};
  {
    std::ofstream out(folder / "prompts.txt");
    for (const auto& line : lines) out << line << "\r\n";
  }
  const std::string common = " --max-new-tokens 10 --dtype float64 --temperature 0.8 --top-k 20";
  const auto r = difftx_cli("generate --model " + q(model) + " --prompts-file " + q(folder / "prompts.txt") + common +
                            " --seed 3");
  INFO("stdout: " << r.out << "stderr: " << r.err);
  REQUIRE(r.code == 0);
  std::stringstream out(r.out);
  std::vector<nlohmann::json> each;
  for (std::string line; std::getline(out, line);) each.push_back(nlohmann::json::parse(line));
  REQUIRE(each.size() == lines.size());
  for (std::size_t i = 0; i < lines.size(); ++i) {
    INFO("line " << i + 1);
    CHECK(each[i].at("line") == i + 1);
    CHECK(each[i].at("seed") == 3 + i);
    CHECK(each[i].at("prompts") == lines.size());
    const auto alone = difftx_cli("generate --model " + q(model) + " --text '" + lines[i] + "' --json" + common +
                                  " --seed " + std::to_string(3 + i));
    REQUIRE(alone.code == 0);
    const auto j = nlohmann::json::parse(alone.out);
    CHECK(each[i].at("prompt") == j.at("prompt"));
    CHECK(each[i].at("tokens") == j.at("tokens"));
    CHECK(each[i].at("text") == j.at("text"));
    CHECK(each[i].at("stop") == j.at("stop"));
  }
  // Bad input: one line naming the file and line, nothing printed.
  std::ofstream(folder / "gap.txt") << "first\n\nthird\n";
  auto bad = difftx_cli("generate --model " + q(model) + " --prompts-file " + q(folder / "gap.txt"));
  CHECK(bad.code == 3);
  check_message(bad.err, {"gap.txt: line 2", "an empty line"});
  CHECK(bad.out.empty());
  std::ofstream(folder / "empty.txt") << "";
  bad = difftx_cli("generate --model " + q(model) + " --prompts-file " + q(folder / "empty.txt"));
  CHECK(bad.code == 3);
  check_message(bad.err, {"empty.txt", "at least one prompt"});
  bad = difftx_cli("generate --model " + q(model) + " --prompts-file " + q(folder / "none.txt"));
  CHECK(bad.code == 3);
  check_message(bad.err, {"none.txt", "readable file", "no such file"});
  std::ofstream(folder / "latin1.txt") << "fine\ncaf\xe9\n";
  bad = difftx_cli("generate --model " + q(model) + " --prompts-file " + q(folder / "latin1.txt"));
  CHECK(bad.code == 3);
  check_message(bad.err, {"latin1.txt: line 2", "valid UTF-8", "byte 0xe9 at offset 3"});
  expect_usage_error("generate --model " + q(model) + " --prompts-file " + q(folder / "prompts.txt") + " --prompt 1",
                     {"--prompts-file", "--prompt"});
  expect_usage_error("generate --model " + q(data_dir / "hf" / "plain") + " --prompts-file " + q(folder / "prompts.txt"),
                     {"--prompts-file", "tokenizer.json"});
}
