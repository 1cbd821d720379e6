// open_tokenizer (tokenizer.hpp): SentencePiece where the build has it.
#include "tokenizer.hpp"

#include <CLI/CLI.hpp>

#include <difftx/core/error.hpp>

#if defined(DIFFTX_CLI_SENTENCEPIECE)
#include <sentencepiece_processor.h>
#endif

namespace difftx::cli {

namespace {

#if defined(DIFFTX_CLI_SENTENCEPIECE)
class sentencepiece_tokenizer final : public text_tokenizer {
 public:
  explicit sentencepiece_tokenizer(const std::filesystem::path& path) {
    const auto status = processor_.Load(path.string());
    if (!status.ok())
      throw input_error("tokenizer", path.string(), "a SentencePiece model", std::string(status.message()));
  }
  std::vector<token_t> encode(const std::string& text) const override {
    std::vector<int> ids;
    const auto status = processor_.Encode(text, &ids);
    if (!status.ok()) throw input_error("tokenizer", "--text", "text SentencePiece encodes", std::string(status.message()));
    return {ids.begin(), ids.end()};
  }
  std::string decode(const std::vector<token_t>& ids) const override {
    std::string text;
    const auto status = processor_.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
    if (!status.ok()) throw input_error("tokenizer", "tokens", "ids of the SentencePiece model", std::string(status.message()));
    return text;
  }
  std::optional<token_t> bos() const override {
    const int id = processor_.bos_id();
    return id >= 0 ? std::optional<token_t>(id) : std::nullopt;
  }

 private:
  sentencepiece::SentencePieceProcessor processor_;
};
#endif

}  // namespace

std::unique_ptr<text_tokenizer> open_tokenizer(const std::filesystem::path& folder) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto model = folder / "tokenizer.model";
  if (!fs::exists(model, ec)) {
    if (fs::exists(folder / "tokenizer.json", ec))
      throw CLI::ValidationError("--text", (folder / "tokenizer.json").string() +
                                               " is a Hugging Face tokenizers file; difftx reads SentencePiece models "
                                               "(tokenizer.model) only: give the prompt as token ids (--prompt)");
    throw CLI::ValidationError("--text", "needs a SentencePiece tokenizer.model beside the weights (none in " +
                                             folder.string() + "): give the prompt as token ids (--prompt)");
  }
#if defined(DIFFTX_CLI_SENTENCEPIECE)
  return std::make_unique<sentencepiece_tokenizer>(model);
#else
  throw CLI::ValidationError("--text", "this difftx was built without SentencePiece (Debian: libsentencepiece-dev, "
                                       "then reconfigure): give the prompt as token ids (--prompt)");
#endif
}

}  // namespace difftx::cli
