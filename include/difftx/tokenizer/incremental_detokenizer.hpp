// The text of generated tokens as they come, each token's text given once, in
// time linear in the tokens: each push decodes only a short window (the last
// piece of text given, which decoders such as SentencePiece's need as context
// for a leading space, and the tokens since), never the whole sequence.
// Bytes that do not yet form whole UTF-8 characters are held back (a
// byte-level BPE token, or a byte-fallback <0xNN> token, may carry part of a
// character: the decoder then ends the window with U+FFFD) until the tokens
// that complete them come, or finish().
//
//   difftx::tokenizer::incremental_detokenizer stream(*tok);
//   for (token_t t : new_tokens) std::cout << stream.push(t) << std::flush;
//   std::cout << stream.finish();
//
// For the ids of any text the tokenizer encodes, the pieces put together are
// decode(all ids) (tests/tokenizer_test.cpp holds every fixture to it). Where
// decoding is not that regular (ids that spell invalid UTF-8, which a
// byte-fallback decoder replaces run by run), each piece is the window's text
// as it stood.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "difftx/tokenizer/text_tokenizer.hpp"
#include "difftx/tokenizer/utf8.hpp"

namespace difftx::tokenizer {

class incremental_detokenizer {
 public:
  // tokenizer must outlive this; skip_special_tokens as decode's.
  explicit incremental_detokenizer(const text_tokenizer& tokenizer, bool skip_special_tokens = false)
      : tokenizer_(&tokenizer), skip_special_(skip_special_tokens) {}

  // The text t completes: "" while it ends inside a character (or adds no
  // text), else everything after what was given before. An id with no token
  // is decode's input_error, and changes nothing.
  std::string push(token_t t) {
    window_.push_back(t);
    std::string text;
    try {
      text = decode(window_);
    } catch (...) {
      window_.pop_back();
      throw;
    }
    if (pending() <= max_pending &&
        (text.ends_with(utf8::replacement_character) || text.size() <= given_.size() || !text.starts_with(given_)))
      return {};
    // Held this long, the window spells no character (UTF-8 needs at most
    // four bytes), or its tokens add nothing (skipped special tokens), or it
    // decodes irregularly: so that it stays short, tokens that add nothing
    // leave it, anything else is given as it stands.
    if (text == given_) {
      window_.resize(context_);
      return {};
    }
    return advance(text);
  }

  // What push held back: the rest of the text, U+FFFD for bytes that never
  // formed a character. The stream then starts anew.
  std::string finish() {
    const auto rest = pending() > 0 ? advance(decode(window_)) : std::string();
    window_.clear();
    given_.clear();
    context_ = 0;
    return rest;
  }

 private:
  static constexpr std::size_t max_pending = 8;

  std::string decode(std::span<const token_t> ids) const { return tokenizer_->decode(ids, skip_special_); }
  // Tokens pushed since the last text given.
  std::size_t pending() const noexcept { return window_.size() - context_; }

  // The text past what the window had given; the tokens just given become
  // the next window's context.
  std::string advance(const std::string& text) {
    std::string piece = text.size() > given_.size() ? text.substr(given_.size()) : std::string();
    window_.erase(window_.begin(), window_.begin() + static_cast<std::ptrdiff_t>(context_));
    context_ = window_.size();
    given_ = decode(window_);
    return piece;
  }

  const text_tokenizer* tokenizer_;
  bool skip_special_;
  std::vector<token_t> window_;  // the context (tokens of the last text given), then the pending tokens
  std::size_t context_ = 0;      // window_'s first context_ ids are the context
  std::string given_;            // decode(context): the text of the window already given
};

}  // namespace difftx::tokenizer
