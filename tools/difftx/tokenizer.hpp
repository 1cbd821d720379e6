// Text in and out of `difftx generate --text`: the SentencePiece model
// (tokenizer.model, as Llama-family checkpoints ship it) beside the weights.
// SentencePiece is an optional dependency of the tool (Debian:
// libsentencepiece-dev); without it, or without a tokenizer.model, --text is
// a usage error saying which, and token ids (--prompt) still work.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <difftx/ops/common.hpp>

namespace difftx::cli {

class text_tokenizer {
 public:
  virtual ~text_tokenizer() = default;
  virtual std::vector<token_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<token_t>& ids) const = 0;
  // The model's beginning-of-sequence id, if it has one.
  virtual std::optional<token_t> bos() const = 0;
};

// The tokenizer in `folder`; a CLI::ValidationError for --text when there is
// none this build can read (none at all, only a tokenizer.json, or no
// SentencePiece in this build), input_error when tokenizer.model is malformed.
std::unique_ptr<text_tokenizer> open_tokenizer(const std::filesystem::path& folder);

}  // namespace difftx::cli
