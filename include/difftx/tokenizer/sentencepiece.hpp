// A SentencePiece tokenizer.model as a text_tokenizer. Only for programs that
// link SentencePiece: the CMake target difftx::sentencepiece (made where
// pkg-config finds sentencepiece; Debian: libsentencepiece-dev) adds the library
// and defines DIFFTX_SENTENCEPIECE, which also lets open_tokenizer fall back to
// tokenizer.model. Link it into every translation unit of a program or none.
//
// encode(text, add_special_tokens) gives SentencePiece's ids of the text
// alone: a SentencePiece model has no post-processor, so the caller adds BOS
// (bos_id(); adds_bos() is false).
#pragma once

#if !defined(DIFFTX_SENTENCEPIECE)
#error "difftx/tokenizer/sentencepiece.hpp needs SentencePiece: link difftx::sentencepiece (it defines DIFFTX_SENTENCEPIECE)"
#endif

#include <sentencepiece_processor.h>

#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "difftx/core/error.hpp"
#include "difftx/tokenizer/text_tokenizer.hpp"

namespace difftx::tokenizer {

class sentencepiece_tokenizer final : public text_tokenizer {
 public:
  explicit sentencepiece_tokenizer(const std::filesystem::path& path) : label_(path.string()) {
    const auto status = processor_.Load(label_);
    if (!status.ok()) throw input_error("read_tokenizer", label_, "a SentencePiece model", std::string(status.message()));
  }

  std::optional<token_t> id_of(std::string_view token) const override {
    const int id = processor_.PieceToId(token);  // the unknown piece's id for anything it does not know
    return id >= 0 && processor_.IdToPiece(id) == token ? std::optional<token_t>(id) : std::nullopt;
  }
  std::optional<std::string> token_of(token_t id) const override {
    return id >= 0 && id < vocab_size() ? std::optional<std::string>(processor_.IdToPiece(id)) : std::nullopt;
  }
  token_t vocab_size() const override { return processor_.GetPieceSize(); }
  std::optional<token_t> bos_id() const override { return present(processor_.bos_id()); }
  std::optional<token_t> eos_id() const override { return present(processor_.eos_id()); }
  bool adds_bos() const override { return false; }
  std::string description() const override {
    return label_ + " (SentencePiece, " + std::to_string(vocab_size()) + " ids)";
  }

 protected:
  std::vector<token_t> encode_valid(std::string_view text, bool) const override {
    std::vector<int> ids;
    const auto status = processor_.Encode(text, &ids);
    if (!status.ok()) throw input_error("tokenizer::encode", "text", "text SentencePiece encodes", std::string(status.message()));
    return {ids.begin(), ids.end()};
  }
  // SentencePiece decodes control tokens (BOS, EOS) to nothing either way.
  std::string decode_ids(std::span<const token_t> ids, bool) const override {
    for (std::size_t i = 0; i < ids.size(); ++i)
      if (ids[i] < 0 || ids[i] >= vocab_size()) unknown_id(ids, i, vocab_size());
    std::string text;
    const auto status = processor_.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
    if (!status.ok()) throw input_error("tokenizer::decode", "ids", "ids SentencePiece decodes", std::string(status.message()));
    return text;
  }

 private:
  static std::optional<token_t> present(int id) { return id >= 0 ? std::optional<token_t>(id) : std::nullopt; }
  std::string label_;
  sentencepiece::SentencePieceProcessor processor_;
};

}  // namespace difftx::tokenizer
