// What every tokenizer offers a program that turns text into token ids and
// back: hf_tokenizer (tokenizer.json) and, where SentencePiece is linked,
// sentencepiece_tokenizer (tokenizer.model). open_tokenizer (open.hpp) picks
// the one a checkpoint folder has.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <difftx/ops/common.hpp>

#include "difftx/core/error.hpp"
#include "difftx/tokenizer/utf8.hpp"

namespace difftx::tokenizer {

class text_tokenizer {
 public:
  virtual ~text_tokenizer() = default;

  // The ids of text (valid UTF-8, else input_error naming the first bad byte);
  // with add_special_tokens, what the tokenizer's post-processor puts around
  // them (tokenizers' encode(text, add_special_tokens=True)).
  std::vector<token_t> encode(std::string_view text, bool add_special_tokens = true) const {
    if (const auto at = utf8::first_invalid(text); at != std::string_view::npos) {
      static constexpr char hex[] = "0123456789abcdef";
      const auto b = static_cast<unsigned char>(text[at]);
      throw input_error("tokenizer::encode", "text", "valid UTF-8",
                        std::string("byte 0x") + hex[b >> 4] + hex[b & 15] + " at offset " + std::to_string(at));
    }
    return encode_valid(text, add_special_tokens);
  }
  // The text of ids; skip_special_tokens leaves out special tokens (BOS, EOS,
  // ...). An id with no token is an input_error naming its position.
  std::string decode(std::span<const token_t> ids, bool skip_special_tokens = false) const {
    return decode_ids(ids, skip_special_tokens);
  }

  virtual std::optional<token_t> id_of(std::string_view token) const = 0;
  virtual std::optional<std::string> token_of(token_t id) const = 0;
  // One more than the largest id.
  virtual token_t vocab_size() const = 0;
  // The beginning-of-sequence id, where the tokenizer names one.
  virtual std::optional<token_t> bos_id() const = 0;
  // The end-of-sequence id, where the tokenizer names one.
  virtual std::optional<token_t> eos_id() const = 0;
  // Whether encode(text, true) starts with bos_id() (tokenizer.json's template
  // adds it; SentencePiece leaves it to the caller).
  virtual bool adds_bos() const = 0;
  // One line for a report: the file and what it holds.
  virtual std::string description() const = 0;

 protected:
  virtual std::vector<token_t> encode_valid(std::string_view text, bool add_special_tokens) const = 0;
  virtual std::string decode_ids(std::span<const token_t> ids, bool skip_special_tokens) const = 0;

  [[noreturn]] static void unknown_id(std::span<const token_t> ids, std::size_t i, token_t vocab_size) {
    throw input_error("tokenizer::decode", "ids[" + std::to_string(i) + "]",
                      "an id of the vocabulary [0, " + std::to_string(vocab_size) + ") that has a token",
                      std::to_string(ids[i]));
  }
};

}  // namespace difftx::tokenizer
