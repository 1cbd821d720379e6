// open_tokenizer and prompt_ids (tokenizer.hpp).
#include "tokenizer.hpp"

#include <cstdint>

#include <CLI/CLI.hpp>

#include <difftx/io/checkpoint_folder.hpp>
#include <difftx/tokenizer/open.hpp>

namespace difftx::cli {

std::unique_ptr<text_tokenizer> open_tokenizer(const std::filesystem::path& folder, const std::string& option) {
  const auto file = tokenizer::find_tokenizer_file(folder);
  if (!file)
    throw CLI::ValidationError(option, "needs a tokenizer beside the weights (tokenizer.json, or a SentencePiece "
                                       "tokenizer.model; none in " + folder.string() + "): give the prompt as token ids (--prompt)");
  if (file->filename() == "tokenizer.model" && !tokenizer::reads_sentencepiece)
    throw CLI::ValidationError(option, file->string() + " is a SentencePiece model and this difftx was built without "
                                       "SentencePiece (Debian: libsentencepiece-dev, then reconfigure): give the prompt "
                                       "as token ids (--prompt)");
  return tokenizer::open_tokenizer(folder);
}

std::filesystem::path tokenizer_folder(const std::filesystem::path& model) {
  std::error_code ec;
  return std::filesystem::is_directory(model, ec) ? model : model.parent_path();
}

namespace {

// config.json's bos_token_id, where model is a folder whose config.json says one.
std::optional<token_t> config_bos_token_id(const std::filesystem::path& model) {
  std::error_code ec;
  const auto path = model / "config.json";
  if (!std::filesystem::is_directory(model, ec) || !std::filesystem::exists(path, ec)) return std::nullopt;
  const auto config = io::read_json_file(path, "read_diffllama");
  const auto bos = config.is_object() ? config.find("bos_token_id") : config.end();
  if (bos == config.end() || bos->is_null()) return std::nullopt;
  if (!bos->is_number_integer() || bos->get<std::int64_t>() < 0 || bos->get<std::int64_t>() > INT32_MAX)
    throw input_error("read_diffllama", path.string() + ": bos_token_id", "a token id in [0, 2^31)", bos->dump());
  return static_cast<token_t>(bos->get<std::int64_t>());
}

}  // namespace

std::vector<token_t> prompt_ids(const std::filesystem::path& model, const text_tokenizer& tokenizer, std::string_view text) {
  auto ids = tokenizer.encode(text, true);
  if (tokenizer.adds_bos()) return ids;
  const auto config_bos = config_bos_token_id(model);
  if (const auto bos = config_bos ? config_bos : tokenizer.bos_id()) ids.insert(ids.begin(), *bos);
  return ids;
}

std::string joined_ids(const std::vector<token_t>& ids) {
  std::string out;
  for (const auto id : ids) out.append(out.empty() ? "" : ",").append(std::to_string(id));
  return out;
}

}  // namespace difftx::cli
