// difftx tokenize: the token ids `generate --text` feeds the model for a text
// (prompt_ids: BOS once, where the tokenizer or config.json names one), and the
// text of token ids (--decode), through the tokenizer beside the weights
// (tokenizer.json, else tokenizer.model). Needs no weights.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <difftx/io/atomic_file.hpp>

#include "commands.hpp"
#include "tokenizer.hpp"

namespace difftx::cli {

namespace {

struct tokenize_options {
  std::string model, text, text_file;
  std::vector<long long> decode;
  bool json = false;
};

void tokenize(const tokenize_options& o, bool has_text) {
  const auto option = o.text_file.empty() ? "--text" : "--text-file";
  const auto tokenizer = open_tokenizer(tokenizer_folder(o.model), has_text ? option : "--decode");
  std::vector<token_t> decode_ids;
  for (std::size_t i = 0; i < o.decode.size(); ++i) {
    if (o.decode[i] >= tokenizer->vocab_size())
      throw CLI::ValidationError("--decode", "token id " + std::to_string(o.decode[i]) + " (position " + std::to_string(i) +
                                                 ") is outside the vocabulary [0, " + std::to_string(tokenizer->vocab_size()) +
                                                 ") of " + tokenizer->description());
    decode_ids.push_back(static_cast<token_t>(o.decode[i]));
  }
  std::string text = o.text;
  if (!o.text_file.empty()) {
    const auto bytes = io::read_file_bytes(o.text_file, "tokenize");
    text.assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  std::vector<token_t> ids;
  if (has_text) ids = prompt_ids(o.model, *tokenizer, text);
  const auto decoded = o.decode.empty() ? std::string() : tokenizer->decode(decode_ids);

  if (o.json) {
    nlohmann::json j{{"tokenizer", tokenizer->description()}};
    if (has_text) {
      j["ids"] = ids;
      j["count"] = ids.size();
    }
    if (!o.decode.empty()) j["text"] = decoded;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return;
  }
  std::printf("difftx tokenize: %s\n", tokenizer->description().c_str());
  if (has_text) std::printf("ids: %s\ncount: %zu\n", joined_ids(ids).c_str(), ids.size());
  if (!o.decode.empty()) std::printf("text: %s\n", decoded.c_str());
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto o = std::make_shared<tokenize_options>();
  auto* cmd = app.add_subcommand("tokenize", "the token ids of a text, as generate --text feeds them, and the text of ids");
  cmd->add_option("--model,--weights", o->model,
                  "a model folder with tokenizer.json or tokenizer.model (and config.json for bos_token_id), or a model "
                  "file beside them; the weights are not read")
      ->required()
      ->check(CLI::ExistingPath);
  auto* text = cmd->add_option("--text", o->text, "the text to encode (UTF-8)");
  auto* file = cmd->add_option("--text-file", o->text_file, "a file whose bytes are the text to encode (UTF-8)")
                   ->check(CLI::ExistingFile);
  text->excludes(file);
  auto* decode = cmd->add_option("--decode", o->decode, "token ids to print as text, comma-separated (e.g. 1,2,3)")
                     ->delimiter(',')
                     ->check(count_in(0));
  cmd->add_flag("--json", o->json,
                "print one JSON object: ids and count (with --text or --text-file), text (with --decode), tokenizer");
  cmd->footer(
      "The ids are those generate --text feeds the model: the tokenizer's, with the special tokens its post-processor\n"
      "adds (tokenizer.json's template, e.g. <|begin_of_text|> first); where it adds no beginning-of-sequence token,\n"
      "config.json's bos_token_id (else SentencePiece's BOS) goes first. --decode prints the text of ids, special\n"
      "tokens included.\n" +
      exit_codes_help);
  cmd->callback([o, text, file, decode] {
    if (!text->count() && !file->count() && !decode->count()) throw CLI::RequiredError("--text, --text-file or --decode");
    if (decode->count() && o->decode.empty()) throw CLI::ValidationError("--decode", "needs at least one token id");
    tokenize(*o, text->count() || file->count());
  });
}

}  // namespace difftx::cli
