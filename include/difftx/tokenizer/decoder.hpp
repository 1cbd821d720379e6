// tokenizer.json's "decoder": from tokens back to text, each step a pass over
// the list of token strings as tokenizers chains them. ByteLevel (stand-in
// characters back to bytes, invalid UTF-8 as U+FFFD); for SentencePiece-style
// files Replace, ByteFallback (<0xNN> runs back to bytes), Fuse, Strip and
// Metaspace; and Sequence. WordPiece, BPEDecoder and CTC are refused.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "difftx/tokenizer/json_section.hpp"
#include "difftx/tokenizer/pre_tokenizer.hpp"
#include "difftx/tokenizer/regex.hpp"
#include "difftx/tokenizer/utf8.hpp"

namespace difftx::tokenizer {

class decoder {
 public:
  virtual ~decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

namespace detail {

class byte_level_decoder final : public decoder {
 public:
  // A token with a character outside the table (an added token such as "<|eot_id|>" is all inside; one
  // with a space is not) goes in as its own bytes.
  void decode_chain(std::vector<std::string>& tokens) const override {
    const auto& alphabet = byte_alphabet::get();
    std::string bytes, mapped;
    for (const auto& token : tokens) {
      mapped.clear();
      bool all = true;
      for (std::size_t i = 0; i < token.size() && all; i += utf8::char_length(token[i])) {
        const int b = alphabet.byte_of(utf8::decode_at(token, i));
        if (b < 0) all = false;
        else mapped += static_cast<char>(b);
      }
      bytes += all ? mapped : token;
    }
    tokens.assign(1, utf8::lossy(bytes));
  }
};

class replace_decoder final : public decoder {
 public:
  explicit replace_decoder(const json_section& s) : pattern_(pattern_of(s.at("pattern"))), content_(s.at("content").string()) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& token : tokens) token = replace_all(*pattern_, token, content_);
  }

 private:
  std::unique_ptr<regex> pattern_;
  std::string content_;
};

class byte_fallback_decoder final : public decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string run;  // the bytes of consecutive <0xNN> tokens
    std::size_t run_tokens = 0;
    const auto flush = [&] {
      if (run_tokens == 0) return;
      if (utf8::first_invalid(run) == std::string::npos) out.push_back(run);
      else out.insert(out.end(), run_tokens, std::string(utf8::replacement_character));  // one per byte token
      run.clear();
      run_tokens = 0;
    };
    for (auto& token : tokens) {
      if (const int b = byte_of(token); b >= 0) {
        run += static_cast<char>(b);
        ++run_tokens;
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    tokens = std::move(out);
  }

 private:
  static int hex_digit(char c) noexcept {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  // The byte of "<0xNN>" (N upper or lower case; "+N" too, which Rust's from_str_radix takes), else -1.
  static int byte_of(const std::string& token) noexcept {
    if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
    const int low = hex_digit(token[4]);
    if (low < 0) return -1;
    if (token[3] == '+') return low;
    const int high = hex_digit(token[3]);
    return high < 0 ? -1 : high * 16 + low;
  }
};

class fuse_decoder final : public decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& token : tokens) all += token;
    tokens.assign(1, std::move(all));
  }
};

class strip_decoder final : public decoder {
 public:
  explicit strip_decoder(const json_section& s)
      : content_(s.at("content").character()),
        start_(static_cast<std::size_t>(s.at("start").integer(0, max_token_id))),
        stop_(static_cast<std::size_t>(s.at("stop").integer(0, max_token_id))) {}
  // Up to start_ leading and stop_ trailing characters equal to content_ removed from each token.
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& token : tokens) {
      std::size_t begin = 0, end = token.size();
      for (std::size_t n = 0; n < start_ && begin < end && utf8::decode_at(token, begin) == content_; ++n)
        begin += utf8::char_length(token[begin]);
      for (std::size_t n = 0; n < stop_ && end > begin; ++n) {
        std::size_t previous = 0;
        if (utf8::decode_before(token, end, &previous) != content_) break;
        end = previous;
      }
      token = token.substr(begin, end - begin);
    }
  }

 private:
  char32_t content_;
  std::size_t start_, stop_;
};

class metaspace_decoder final : public decoder {
 public:
  explicit metaspace_decoder(const json_section& s)
      : replacement_(utf8::encode(s.at("replacement").character())), scheme_(prepend_scheme_of(s)) {}
  // The replacement becomes a space; in the first token it goes (every one, as tokenizers does) unless
  // the scheme is never.
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const auto with = i == 0 && scheme_ != prepend_scheme::never ? std::string() : std::string(" ");
      std::string out;
      const auto& token = tokens[i];
      for (std::size_t at = 0;;) {
        const auto next = token.find(replacement_, at);
        out.append(token, at, next == std::string::npos ? std::string::npos : next - at);
        if (next == std::string::npos) break;
        out += with;
        at = next + replacement_.size();
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  prepend_scheme scheme_;
};

}  // namespace detail

using decoders = std::vector<std::unique_ptr<decoder>>;

// The decoders section s describes (a Sequence's, flattened).
inline decoders make_decoders(const detail::json_section& s) {
  return detail::parts_of<decoder>(s, "decoders", [](const detail::json_section& part) -> std::unique_ptr<decoder> {
    const auto& type = part.type();
    if (type == "ByteLevel") return std::make_unique<detail::byte_level_decoder>();
    if (type == "Replace") return std::make_unique<detail::replace_decoder>(part);
    if (type == "ByteFallback") return std::make_unique<detail::byte_fallback_decoder>();
    if (type == "Fuse") return std::make_unique<detail::fuse_decoder>();
    if (type == "Strip") return std::make_unique<detail::strip_decoder>(part);
    if (type == "Metaspace") return std::make_unique<detail::metaspace_decoder>(part);
    part.unsupported("ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace or Sequence");
  });
}

}  // namespace difftx::tokenizer
