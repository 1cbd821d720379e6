// `difftx tokenize` as a user runs it (the built binary, DIFFTX_CLI): the ids
// of every tokenizer.json fixture match Hugging Face tokenizers'
// (tests/data/tokenizer/expected.json), BOS once whether the template, the
// folder's config.json or SentencePiece names it, --decode, --json's last
// line, and the exit codes: a malformed tokenizer.json is bad input (3) with
// one line naming the file and the key; usage errors are 2.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <difftx/ops/common.hpp>

#include "support/cli_run.hpp"
#include "support/temp_folder.hpp"

using difftx::token_t;
using test_support::check_message;
using test_support::difftx_cli;
using test_support::expect_usage_error;
using test_support::q;
using test_support::read_text;

namespace {

const std::filesystem::path data_dir = DIFFTX_TEST_DATA;
const auto tokenizer_data = data_dir / "tokenizer";

const nlohmann::json& expected() {
  static const auto j = nlohmann::json::parse(read_text(tokenizer_data / "expected.json"));
  return j;
}

std::string text_of(const std::string& name) { return expected().at("texts").at(name).get<std::string>(); }

std::vector<token_t> expected_ids(const std::string& fixture, const std::string& text) {
  return expected().at("cases").at(fixture).at(text).at("ids").get<std::vector<token_t>>();
}

std::string joined(const std::vector<token_t>& ids) {
  std::string s;
  for (const auto id : ids) s.append(s.empty() ? "" : ",").append(std::to_string(id));
  return s;
}

// The JSON object on the last line of out.
nlohmann::json last_line(std::string out) {
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return nlohmann::json::parse(out.substr(out.rfind('\n') + 1));  // npos + 1: the whole of a one-line output
}

// A model folder holding only the fixture's tokenizer.json (and config.json with bos, if given).
std::filesystem::path folder_with(const test_support::temp_folder& tmp, const std::string& fixture, int config_bos = -1) {
  const auto dir = tmp / (fixture + (config_bos >= 0 ? "_bos" : ""));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(tokenizer_data / fixture / "tokenizer.json", dir / "tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  if (config_bos >= 0) std::ofstream(dir / "config.json") << "{\"bos_token_id\": " << config_bos << "}";
  return dir;
}

}  // namespace

TEST_CASE("cli tokenize: the ids of every tokenizer.json fixture are Hugging Face tokenizers'") {
  test_support::temp_folder tmp;
  for (const std::string text_name : {"stress", "corpus", "specials"}) {
    std::ofstream(tmp / (text_name + ".txt"), std::ios::binary) << text_of(text_name);
  }
  for (const std::string fixture : {"llama3", "gpt2", "llama2", "llama2_legacy", "metaspace_split", "sp_converted"}) {
    const auto dir = folder_with(tmp, fixture);
    for (const std::string text_name : {"stress", "corpus", "specials"}) {
      INFO(fixture << ", " << text_name);
      const auto r = difftx_cli("tokenize --model " + q(dir) + " --text-file " + q(tmp / (text_name + ".txt")) + " --json");
      INFO("stderr: " << r.err);
      REQUIRE(r.code == 0);
      const auto j = last_line(r.out);
      CHECK(j.at("ids").get<std::vector<token_t>>() == expected_ids(fixture, text_name));
      CHECK(j.at("count") == expected_ids(fixture, text_name).size());
    }
  }
  // --text on the command line, plain output.
  const auto r = difftx_cli("tokenize --model " + q(folder_with(tmp, "llama3")) + " --text a");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("ids: " + joined(expected_ids("llama3", "one")) + "\ncount: 2\n") != std::string::npos);
  CHECK(r.out.rfind("difftx tokenize: ", 0) == 0);
}

TEST_CASE("cli tokenize: BOS once, from the template, else config.json, else SentencePiece") {
  test_support::temp_folder tmp;
  // llama3's template puts <|begin_of_text|> (1000) first; config.json's bos is not added again.
  auto r = difftx_cli("tokenize --model " + q(folder_with(tmp, "llama3", 1000)) + " --text a --json");
  REQUIRE(r.code == 0);
  CHECK(last_line(r.out).at("ids").get<std::vector<token_t>>() == expected_ids("llama3", "one"));
  // gpt2 has no template: config.json's bos goes first, and the text's ids follow.
  r = difftx_cli("tokenize --model " + q(folder_with(tmp, "gpt2", 0)) + " --text a --json");
  REQUIRE(r.code == 0);
  auto ids = expected_ids("gpt2", "one");
  ids.insert(ids.begin(), 0);
  CHECK(last_line(r.out).at("ids").get<std::vector<token_t>>() == ids);
#if defined(DIFFTX_TEST_SENTENCEPIECE)
  // tokenizer.model: config.json's bos (1), then SentencePiece's ids: what the converted tokenizer.json gives.
  std::ofstream(tmp / "corpus.txt", std::ios::binary) << text_of("corpus");
  r = difftx_cli("tokenize --model " + q(data_dir / "hf" / "tokenizer") + " --text-file " + q(tmp / "corpus.txt") + " --json");
  INFO("stderr: " << r.err);
  REQUIRE(r.code == 0);
  CHECK(last_line(r.out).at("ids").get<std::vector<token_t>>() == expected_ids("sp_converted", "corpus"));
  CHECK(last_line(r.out).at("tokenizer").get<std::string>().find("SentencePiece") != std::string::npos);
#endif
}

TEST_CASE("cli tokenize: --decode prints the text of ids, special tokens included") {
  test_support::temp_folder tmp;
  const auto dir = folder_with(tmp, "llama3");
  const auto& e = expected().at("cases").at("llama3").at("specials");
  const auto ids = joined(e.at("ids").get<std::vector<token_t>>());
  auto r = difftx_cli("tokenize --model " + q(dir) + " --decode " + ids + " --json");
  INFO("stderr: " << r.err);
  REQUIRE(r.code == 0);
  CHECK(last_line(r.out).at("text") == e.at("decoded"));
  CHECK_FALSE(last_line(r.out).contains("ids"));
  r = difftx_cli("tokenize --model " + q(dir) + " --text a --decode 1000,64");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("\ntext: <|begin_of_text|>a\n") != std::string::npos);
}

TEST_CASE("cli tokenize: a malformed or unsupported tokenizer.json is bad input, one line naming the file and the key") {
  test_support::temp_folder tmp;
  const auto dir = tmp / "model";
  std::filesystem::create_directories(dir);
  auto j = nlohmann::json::parse(read_text(tokenizer_data / "llama3" / "tokenizer.json"));
  j["model"]["type"] = "WordPiece";
  std::ofstream(dir / "tokenizer.json") << j.dump();
  auto r = difftx_cli("tokenize --model " + q(dir) + " --text hello");
  CHECK(r.code == 3);
  CHECK(r.out.empty());
  check_message(r.err, {(dir / "tokenizer.json").string() + ": model.type", "expected BPE", "'WordPiece'"});
  std::ofstream(dir / "tokenizer.json") << "{\"model\": [";
  r = difftx_cli("tokenize --model " + q(dir) + " --text hello");
  CHECK(r.code == 3);
  check_message(r.err, {"tokenizer.json", "valid JSON"});
  // Text that is not UTF-8.
  std::filesystem::copy_file(tokenizer_data / "llama3" / "tokenizer.json", dir / "tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::ofstream(tmp / "bad.txt", std::ios::binary) << "ok\xff";
  r = difftx_cli("tokenize --model " + q(dir) + " --text-file " + q(tmp / "bad.txt"));
  CHECK(r.code == 3);
  check_message(r.err, {"valid UTF-8", "byte 0xff at offset 2"});
}

TEST_CASE("cli tokenize: usage errors exit 2 with one line") {
  test_support::temp_folder tmp;
  const auto dir = folder_with(tmp, "llama3");
  expect_usage_error("tokenize --model " + q(dir), {"--text, --text-file or --decode"});
  expect_usage_error("tokenize --model " + q(dir) + " --text a --text-file " + q(dir / "tokenizer.json"), {"--text", "--text-file"});
  expect_usage_error("tokenize --model " + q(dir) + " --decode 1,5000", {"--decode", "5000", "position 1", "[0, 1011)"});
  expect_usage_error("tokenize --model " + q(tmp / "nowhere") + " --text a", {"--model"});
  expect_usage_error("tokenize --model " + q(data_dir / "hf" / "plain") + " --text a", {"--text", "tokenizer.json", "tokenizer.model"});
}
