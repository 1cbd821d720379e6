// difftx::tokenizer against Hugging Face tokenizers: the ids and decodes that
// tokenizers 0.23.3 gave for every fixture (tools/tokenizer_fixtures.py:
// Llama-3 and GPT-2 byte-level BPE, Llama-2 SentencePiece-style BPE in three
// layouts, the hf fixture's tokenizer.model converted) on every text, round
// trips, the accessors, and every refusal with its file, key and one line:
// unsupported components, merges naming unknown tokens, bad and catastrophic
// regular expressions, invalid UTF-8, deep nesting, malformed JSON; the
// incremental detokenizer: its pieces make decode(all) for every fixture and
// text, it holds back incomplete characters, and its work is linear.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <difftx/tokenizer/incremental_detokenizer.hpp>
#include <difftx/tokenizer/open.hpp>

#include "support/helpers.hpp"
#include "support/temp_folder.hpp"

using difftx::token_t;
using difftx::tokenizer::hf_tokenizer;
using test_support::expect_input_error;

namespace {

const std::filesystem::path data_dir = std::filesystem::path(DIFFTX_TEST_DATA) / "tokenizer";
const char* const cases[] = {"llama3", "gpt2", "llama2", "llama2_legacy", "metaspace_split", "sp_converted"};

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

const nlohmann::json& expected() {
  static const auto j = nlohmann::json::parse(read_text(data_dir / "expected.json"));
  return j;
}

const hf_tokenizer& fixture(const std::string& name) {
  static std::map<std::string, hf_tokenizer> loaded;
  auto it = loaded.find(name);
  if (it == loaded.end()) it = loaded.emplace(name, hf_tokenizer::from_file(data_dir / name / "tokenizer.json")).first;
  return it->second;
}

nlohmann::json fixture_json(const std::string& name) { return nlohmann::json::parse(read_text(data_dir / name / "tokenizer.json")); }

// The llama3 fixture with edit applied, as text.
std::string edited(const std::function<void(nlohmann::json&)>& edit, const std::string& name = "llama3") {
  auto j = fixture_json(name);
  edit(j);
  return j.dump();
}

// hf_tokenizer(json) refuses it: read_tokenizer, naming "tokenizer.json: <key>".
void expect_refused(const std::string& json, const std::string& key, const std::string& expected_part, const std::string& got_part) {
  expect_input_error([&] { hf_tokenizer t(json); }, "read_tokenizer", key.empty() ? "tokenizer.json" : "tokenizer.json: " + key,
                     expected_part, got_part);
  try {
    hf_tokenizer t(json);
  } catch (const difftx::input_error& e) {
    const std::string message = e.what();
    CHECK(message.find('\n') == std::string::npos);
  }
}

std::vector<token_t> ids_of(const nlohmann::json& j) { return j.get<std::vector<token_t>>(); }

}  // namespace

TEST_CASE("tokenizer: every fixture encodes and decodes every text as Hugging Face tokenizers does") {
  const auto& texts = expected().at("texts");
  for (const auto* name : cases) {
    const auto& tok = fixture(name);
    for (const auto& [text_name, e] : expected().at("cases").at(name).items()) {
      INFO(name << ", text " << text_name);
      const auto text = texts.at(text_name).get<std::string>();
      const auto ids = tok.encode(text);
      CHECK(ids == ids_of(e.at("ids")));
      CHECK(tok.encode(text, false) == ids_of(e.at("ids_plain")));
      CHECK(tok.decode(ids) == e.at("decoded").get<std::string>());
      CHECK(tok.decode(ids, true) == e.at("decoded_skip").get<std::string>());
    }
  }
}

TEST_CASE("tokenizer: byte-level BPE round-trips any text; SentencePiece-style BPE round-trips text it knows") {
  const auto& texts = expected().at("texts");
  for (const auto& [text_name, text] : texts.items()) {
    INFO("text " << text_name);
    const auto t = text.get<std::string>();
    CHECK(fixture("llama3").decode(fixture("llama3").encode(t, false)) == t);
    // GPT-2's ByteLevel with add_prefix_space puts a space before each piece between added tokens.
    if (t.find('<') == std::string::npos && !t.empty())
      CHECK(fixture("gpt2").decode(fixture("gpt2").encode(t, false)) == (t[0] == ' ' ? t : " " + t));
  }
  const auto corpus = texts.at("corpus").get<std::string>();
  for (const auto* name : {"llama2", "llama2_legacy"}) CHECK(fixture(name).decode(fixture(name).encode(corpus, false)) == corpus);
}

TEST_CASE("tokenizer: accessors say what the file says") {
  const auto& llama3 = fixture("llama3");
  const auto bos = llama3.id_of("<|begin_of_text|>");
  REQUIRE(bos);
  CHECK(llama3.bos_id() == bos);
  CHECK(llama3.adds_bos());
  CHECK_FALSE(llama3.eos_id());
  CHECK(llama3.token_of(*bos) == "<|begin_of_text|>");
  CHECK(llama3.is_special(*bos));
  CHECK(llama3.vocab_size() == 1011);  // 1000 BPE tokens, then 11 special ones
  CHECK(llama3.token_of(1011) == std::nullopt);
  CHECK(llama3.id_of("no such token") == std::nullopt);
  CHECK(llama3.encode("") == std::vector<token_t>{*bos});
  CHECK(llama3.encode("", false).empty());
  CHECK(llama3.description().find("1011 ids") != std::string::npos);

  const auto& gpt2 = fixture("gpt2");
  CHECK_FALSE(gpt2.bos_id());
  CHECK_FALSE(gpt2.adds_bos());
  CHECK(gpt2.id_of("<mask>"));
  CHECK_FALSE(gpt2.is_special(*gpt2.id_of("[rs]")));  // added, not special: decode keeps it
  CHECK(fixture("llama2").bos_id() == 1);
  CHECK(fixture("llama2").id_of("<0x0A>") == 13);
  CHECK_FALSE(fixture("metaspace_split").bos_id());

  // Unknown ids: one line naming the position.
  const std::vector<token_t> ids{*bos, 5000};
  expect_input_error([&] { (void)llama3.decode(ids); }, "tokenizer::decode", "ids[1]", "vocabulary [0, 1011)", "5000");
  const std::vector<token_t> negative{-1};
  expect_input_error([&] { (void)llama3.decode(negative); }, "tokenizer::decode", "ids[0]", "has a token", "-1");
}

TEST_CASE("tokenizer: invalid UTF-8 is refused with the offset of the first bad byte") {
  const auto& tok = fixture("llama3");
  expect_input_error([&] { (void)tok.encode("ok \xff here"); }, "tokenizer::encode", "text", "valid UTF-8", "byte 0xff at offset 3");
  expect_input_error([&] { (void)tok.encode("abc\xc3"); }, "tokenizer::encode", "text", "valid UTF-8", "byte 0xc3 at offset 3");
  expect_input_error([&] { (void)tok.encode("\xed\xa0\x80"); }, "tokenizer::encode", "text", "valid UTF-8", "offset 0");  // a surrogate
  expect_input_error([&] { (void)tok.encode("\xc0\xaf"); }, "tokenizer::encode", "text", "valid UTF-8", "offset 0");  // overlong
  expect_input_error([&] { (void)tok.encode("\xf4\x90\x80\x80"); }, "tokenizer::encode", "text", "valid UTF-8", "offset 0");
  CHECK(tok.encode(std::string("a\0b", 3), false).size() == 3);  // NUL is valid UTF-8
}

TEST_CASE("tokenizer: unsupported components are refused naming the file and the key") {
  expect_refused(edited([](auto& j) { j["model"]["type"] = "WordPiece"; }), "model.type", "BPE", "'WordPiece'");
  expect_refused(edited([](auto& j) { j["model"]["type"] = "Unigram"; }), "model.type", "BPE", "'Unigram'");
  expect_refused(edited([](auto& j) { j["normalizer"] = {{"type", "NFKC"}}; }), "normalizer.type", "Prepend, Replace or Sequence", "'NFKC'");
  expect_refused(edited([](auto& j) { j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "Lowercase"}}}}}; }),
                 "normalizer.normalizers[0].type", "Prepend", "'Lowercase'");
  expect_refused(edited([](auto& j) { j["pre_tokenizer"]["pretokenizers"][1] = {{"type", "Whitespace"}}; }),
                 "pre_tokenizer.pretokenizers[1].type", "Split, ByteLevel, Metaspace or Sequence", "'Whitespace'");
  expect_refused(edited([](auto& j) { j["decoder"] = {{"type", "WordPiece"}, {"prefix", "##"}}; }), "decoder.type", "ByteLevel",
                 "'WordPiece'");
  expect_refused(edited([](auto& j) { j["post_processor"] = {{"type", "BertProcessing"}}; }), "post_processor.type",
                 "TemplateProcessing", "'BertProcessing'");
  expect_refused(edited([](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Around"; }),
                 "pre_tokenizer.pretokenizers[0].behavior", "Isolated", "'Around'");
  expect_refused(edited([](auto& j) { j["truncation"] = {{"max_length", 8}}; }), "truncation", "null", "an object");
  expect_refused(edited([](auto& j) { j["padding"] = {{"strategy", "BatchLongest"}}; }), "padding", "null", "an object");
  expect_refused(edited([](auto& j) { j["model"]["dropout"] = 0.1; }), "model.dropout", "deterministic", "0.1");
  expect_refused(edited([](auto& j) { j["model"]["continuing_subword_prefix"] = "##"; }), "model.continuing_subword_prefix",
                 "null or \"\"", "'##'");
  expect_refused(edited([](auto& j) { j["model"]["unk_token"] = "<nope>"; }), "model.unk_token", "a token of model.vocab", "'<nope>'");
  expect_refused(edited([](auto& j) { j["version"] = "2.0"; }), "version", "'1.0'", "'2.0'");
  expect_refused(edited([](auto& j) { j["post_processor"]["processors"][1]["special_tokens"]["<|begin_of_text|>"]["ids"][0] = 4000; }),
                 "post_processor", "special tokens whose ids are tokens", "id 4000");
  expect_refused(edited([](auto& j) { j["post_processor"]["processors"][1]["single"][1] = {{"Sequence", {{"id", "B"}, {"type_id", 0}}}}; }),
                 "post_processor.processors[1].single[1].Sequence.id", "A", "'B'");
  expect_refused(edited([](auto& j) { j.erase("model"); }), "model", "required", "null");
  expect_refused(edited([](auto& j) { j["model"]["vocab"]["Ġthe"] = -3; }), "model.vocab.Ġthe", "[0, ", "-3");
  expect_refused(edited([](auto& j) { j["model"]["vocab"]["zzz"] = 5; }), "model.vocab.zzz", "an id no other token has", "5");
  expect_refused(edited([](auto& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "ab"}}; }),
                 "pre_tokenizer.replacement", "one character", "'ab'");
  expect_refused("[1, 2]", "", "an object", "an array of 2");
}

TEST_CASE("tokenizer: merges must name tokens of the vocabulary, in either spelling") {
  expect_refused(edited([](auto& j) { j["model"]["merges"][3] = {"Ġ", "nosuchtoken"}; }), "model.merges[3]", "two tokens of model.vocab",
                 "'nosuchtoken', not in the vocabulary");
  expect_refused(edited([](auto& j) { j["model"]["merges"][0] = "x y"; }), "model.merges[0]", "a merge whose result is in model.vocab",
                 "'xy'");
  expect_refused(edited([](auto& j) { j["model"]["merges"][2] = "a b c"; }), "model.merges[2]", "two tokens separated by one space",
                 "'a b c'");
  expect_refused(edited([](auto& j) { j["model"]["merges"][1] = 7; }), "model.merges[1]", "\"a b\" or", "7");
  // The "a b" spelling reads as the pairs do.
  const hf_tokenizer spelled(edited([](auto& j) {
    for (auto& m : j["model"]["merges"]) m = m[0].template get<std::string>() + " " + m[1].template get<std::string>();
  }));
  const auto text = expected().at("texts").at("stress").get<std::string>();
  CHECK(spelled.encode(text) == fixture("llama3").encode(text));
}

TEST_CASE("tokenizer: a regular expression PCRE2 cannot compile is refused with PCRE2's message") {
  expect_refused(edited([](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; }),
                 "pre_tokenizer.pretokenizers[0].pattern.Regex", "a regular expression PCRE2 compiles", "missing closing parenthesis");
  expect_refused(edited([](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Glob", "*"}}; }),
                 "pre_tokenizer.pretokenizers[0].pattern", "{\"String\": ...} or {\"Regex\": ...}", "an object");
  // A literal pattern with regex characters in it matches them literally.
  const hf_tokenizer literal(edited([](auto& j) {
    j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Split"}, {"pattern", {{"String", "a.b\\E*"}}}, {"behavior", "Removed"}, {"invert", false}};
  }));
  CHECK(literal.decode(literal.encode("xa.b\\E*yaxb", false)) == "xyaxb");
}

TEST_CASE("tokenizer: a catastrophically backtracking regular expression ends with an error, not a hang") {
  const hf_tokenizer slow(edited([](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(a+)+$"; }));
  const auto start = std::chrono::steady_clock::now();
  expect_input_error([&] { (void)slow.encode(std::string(64, 'a') + "!"); }, "tokenizer::encode",
                     "tokenizer.json: pre_tokenizer.pretokenizers[0].pattern.Regex", "within PCRE2's limits", "limit");
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
  CHECK(slow.encode("aaa", false).size() >= 1);  // short input: fine
}

TEST_CASE("tokenizer: malformed JSON, deep nesting and oversized files are refused before they are parsed") {
  expect_refused("{\"model\": ", "", "valid JSON", "parse error");
  expect_refused("", "", "valid JSON", "parse error");
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  expect_refused(deep, "", "JSON nested at most 64 deep", "depth 65 at byte 64");
  // Brackets inside strings do not count.
  expect_refused("{\"x\": \"" + std::string(1000, '[') + "\"}", "model", "required", "null");
  test_support::temp_folder folder;
  const auto big = folder / "tokenizer.json";
  std::ofstream(big).put('{');
  std::filesystem::resize_file(big, difftx::tokenizer::max_file_bytes + 1);  // sparse: nothing is written
  expect_input_error([&] { (void)hf_tokenizer::from_file(big); }, "read_tokenizer", big.string(), "at most 268435456 bytes",
                     "268435457 bytes");
  expect_input_error([&] { (void)hf_tokenizer::from_file(folder / "none.json"); }, "read_tokenizer", (folder / "none.json").string(),
                     "a tokenizer file", "no such file");
}

TEST_CASE("tokenizer: a text of 100k characters encodes, and decodes back") {
  const auto stress = expected().at("texts").at("stress").get<std::string>();
  std::string text;
  while (text.size() < 200000) text += stress;  // about 100k characters: the text is half multi-byte
  const auto& tok = fixture("llama3");
  const auto ids = tok.encode(text, false);
  CHECK(ids.size() > 50000);
  CHECK(tok.decode(ids) == text);
  // One word of 100k characters (Metaspace without split: the whole text one BPE word).
  const auto& llama2 = fixture("llama2");
  const std::string words = [&] {
    std::string s;
    while (s.size() < 100000) s += expected().at("texts").at("corpus").get<std::string>();
    return s;
  }();
  CHECK(llama2.decode(llama2.encode(words, false)) == words);
}

TEST_CASE("tokenizer: encoding from several threads gives the same ids") {
  const auto text = expected().at("texts").at("stress").get<std::string>();
  const auto& tok = fixture("gpt2");
  const auto reference = tok.encode(text);
  std::vector<std::vector<token_t>> results(4);
  std::vector<std::thread> threads;
  for (auto& r : results)
    threads.emplace_back([&] {
      for (int k = 0; k < 20; ++k) r = tok.encode(text);
    });
  for (auto& t : threads) t.join();
  for (const auto& r : results) CHECK(r == reference);
}

TEST_CASE("tokenizer: open_tokenizer prefers tokenizer.json and falls back to tokenizer.model") {
  const auto hf = std::filesystem::path(DIFFTX_TEST_DATA) / "hf" / "tokenizer";
  test_support::temp_folder folder;
  std::filesystem::copy(data_dir / "sp_converted" / "tokenizer.json", folder / "tokenizer.json");
  std::filesystem::copy(hf / "tokenizer.model", folder / "tokenizer.model");
  const auto text = expected().at("texts").at("corpus").get<std::string>();
  const auto json = difftx::tokenizer::open_tokenizer(folder.path());
  CHECK(json->description().find("tokenizer.json") != std::string::npos);
  CHECK(json->encode(text) == fixture("sp_converted").encode(text));
  expect_input_error([&] { (void)difftx::tokenizer::open_tokenizer(folder / "none"); }, "open_tokenizer",
                     (folder / "none").string(), "tokenizer.json or tokenizer.model", "neither");
#if defined(DIFFTX_SENTENCEPIECE)
  // The SentencePiece model and its conversion agree; SentencePiece leaves BOS to the caller.
  const auto sp = difftx::tokenizer::open_tokenizer(hf);
  CHECK(sp->description().find("SentencePiece") != std::string::npos);
  CHECK_FALSE(sp->adds_bos());
  CHECK(sp->bos_id() == 1);
  const auto prompt = fixture("sp_converted").encode(text, false);
  CHECK(sp->encode(text) == prompt);
  auto known = prompt;  // SentencePiece decodes <unk> as " ⁇ ", tokenizers as "<unk>"
  std::erase(known, 0);
  CHECK(sp->decode(known) == fixture("sp_converted").decode(known));
  CHECK(sp->vocab_size() == fixture("sp_converted").vocab_size());
  CHECK(sp->id_of("<s>") == 1);
  CHECK_FALSE(sp->id_of("no such piece"));
  const std::vector<token_t> bad{3, 128};
  expect_input_error([&] { (void)sp->decode(bad); }, "tokenizer::decode", "ids[1]", "[0, 128)", "128");
  expect_input_error([&] { (void)sp->encode("\xff"); }, "tokenizer::encode", "text", "valid UTF-8", "offset 0");
#else
  expect_input_error([&] { (void)difftx::tokenizer::open_tokenizer(hf); }, "open_tokenizer", (hf / "tokenizer.model").string(),
                     "difftx::sentencepiece", "without SentencePiece");
#endif
}

namespace {

// The pieces of a stream of ids, each push's and finish's.
std::vector<std::string> stream_pieces(const difftx::tokenizer::text_tokenizer& tok, const std::vector<token_t>& ids,
                                       bool skip_special) {
  difftx::tokenizer::incremental_detokenizer stream(tok, skip_special);
  std::vector<std::string> pieces;
  for (const token_t t : ids) pieces.push_back(stream.push(t));
  pieces.push_back(stream.finish());
  return pieces;
}

std::string joined(const std::vector<std::string>& pieces) {
  std::string all;
  for (const auto& p : pieces) all += p;
  return all;
}

// A tokenizer that counts the ids it is asked to decode.
class counting_tokenizer final : public difftx::tokenizer::text_tokenizer {
 public:
  explicit counting_tokenizer(const difftx::tokenizer::text_tokenizer& inner) : inner_(inner) {}
  std::optional<token_t> id_of(std::string_view token) const override { return inner_.id_of(token); }
  std::optional<std::string> token_of(token_t id) const override { return inner_.token_of(id); }
  token_t vocab_size() const override { return inner_.vocab_size(); }
  std::optional<token_t> bos_id() const override { return inner_.bos_id(); }
  std::optional<token_t> eos_id() const override { return inner_.eos_id(); }
  bool adds_bos() const override { return inner_.adds_bos(); }
  std::string description() const override { return inner_.description(); }
  mutable std::size_t decoded = 0;

 protected:
  std::vector<token_t> encode_valid(std::string_view text, bool add_special_tokens) const override {
    return inner_.encode(text, add_special_tokens);
  }
  std::string decode_ids(std::span<const token_t> ids, bool skip_special_tokens) const override {
    decoded += ids.size();
    return inner_.decode(ids, skip_special_tokens);
  }

 private:
  const difftx::tokenizer::text_tokenizer& inner_;
};

bool valid_utf8(const std::string& s) { return difftx::tokenizer::utf8::first_invalid(s) == std::string::npos; }

}  // namespace

TEST_CASE("incremental detokenizer: for every fixture and text, the pieces make decode(all), each whole characters") {
  const auto& texts = expected().at("texts");
  std::vector<const difftx::tokenizer::text_tokenizer*> tokenizers;
  for (const auto* name : cases) tokenizers.push_back(&fixture(name));
#if defined(DIFFTX_SENTENCEPIECE)
  const auto sp = difftx::tokenizer::open_tokenizer(std::filesystem::path(DIFFTX_TEST_DATA) / "hf" / "tokenizer");
  tokenizers.push_back(sp.get());
#endif
  for (const auto* tok : tokenizers)
    for (const auto& [text_name, text] : texts.items())
      for (const bool special : {true, false})
        for (const bool skip : {false, true}) {
          INFO(tok->description() << ", text " << text_name << std::string(special ? ", with" : ", without")
                                  << " special tokens, skip_special_tokens " << skip);
          auto ids = tok->encode(text.get<std::string>(), special);
          if (tok->description().find("SentencePiece") != std::string::npos) std::erase(ids, 0);  // <unk>: " ⁇ "
          const auto pieces = stream_pieces(*tok, ids, skip);
          CHECK(joined(pieces) == tok->decode(ids, skip));
          // Each piece is whole characters where the text is (a byte-level text that is not: U+FFFD, once, at the end).
          if (valid_utf8(tok->decode(ids, skip)))
            for (const auto& p : pieces) CHECK(valid_utf8(p));
        }
}

TEST_CASE("incremental detokenizer: bytes of a character wait for the token that completes it") {
  // Byte-level BPE (llama3) and byte fallback (llama2: <0xF0><0x9F>...) spell
  // an emoji the fixtures have no token for a byte or two at a time.
  const std::string text = "a\xF0\x9F\xA6\x80 b";  // U+1F980
  for (const auto* name : {"llama3", "llama2"}) {
    INFO(name);
    const auto& tok = fixture(name);
    const auto ids = tok.encode(text, false);
    const auto pieces = stream_pieces(tok, ids, false);
    CHECK(joined(pieces) == tok.decode(ids));
    CHECK(std::ranges::count(pieces, std::string()) >= 2);  // held back, then given whole
    CHECK(std::ranges::any_of(pieces, [](const std::string& p) { return p.find("\xF0\x9F\xA6\x80") != std::string::npos; }));
    for (const auto& p : pieces) CHECK(valid_utf8(p));
  }
  // Bytes that never form a character: given as the decoder writes them (U+FFFD) once the
  // stream has held them long enough, or at finish.
  const auto& llama2 = fixture("llama2");
  const token_t f0 = *llama2.id_of("<0xF0>");
  std::vector<token_t> broken(20, f0);
  CHECK(joined(stream_pieces(llama2, broken, false)) == llama2.decode(broken));
  difftx::tokenizer::incremental_detokenizer stream(llama2);
  CHECK(stream.push(f0).empty());
  CHECK(stream.finish() == llama2.decode(std::vector<token_t>{f0}));
  // An unknown id is decode's error, and the stream goes on as if it had not come.
  const auto ids = llama2.encode("Hello world", false);
  CHECK(stream.push(ids[0]) == llama2.decode(std::vector<token_t>{ids[0]}));
  expect_input_error([&] { (void)stream.push(100000); }, "tokenizer::decode", "ids[1]", "has a token", "100000");
  std::string rest;
  for (std::size_t i = 1; i < ids.size(); ++i) rest += stream.push(ids[i]);
  CHECK(llama2.decode(std::vector<token_t>{ids[0]}) + rest + stream.finish() == llama2.decode(ids));
}

TEST_CASE("incremental detokenizer: linear work, a few ids decoded per id pushed") {
  const auto stress = expected().at("texts").at("stress").get<std::string>();
  std::string text;
  while (text.size() < 20000) text += stress;
  for (const auto* name : {"llama3", "llama2"}) {
    INFO(name);
    const counting_tokenizer tok(fixture(name));
    const auto ids = tok.encode(text, false);
    REQUIRE(ids.size() > 4000);
    tok.decoded = 0;
    CHECK(joined(stream_pieces(tok, ids, false)) == fixture(name).decode(ids));
    // Each push decodes its window (the last piece's tokens and those since)
    // and, when it gives text, the new piece's tokens: a dozen ids per id at
    // most here, where re-decoding the sequence would be thousands.
    CHECK(tok.decoded < 12 * ids.size());
  }
}
