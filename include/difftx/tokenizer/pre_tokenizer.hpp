// tokenizer.json's "pre_tokenizer": how the text between added tokens is cut
// into words before BPE. Split (a regex or a literal, each behaviour, invert),
// ByteLevel (GPT-2's pattern or none, add_prefix_space, then every byte mapped
// to its printable stand-in), Metaspace (spaces to ▁, prepend_scheme, split)
// and Sequence. Others (Whitespace, Digits, BertPreTokenizer, ...) are refused.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "difftx/tokenizer/json_section.hpp"
#include "difftx/tokenizer/pieces.hpp"
#include "difftx/tokenizer/regex.hpp"
#include "difftx/tokenizer/utf8.hpp"

namespace difftx::tokenizer {

// GPT-2's byte-to-character table: printable bytes stand for themselves, the
// other 68 (controls, space, DEL, NBSP, soft hyphen, ...) for U+0100 onwards,
// so every byte is a visible character of the vocabulary.
class byte_alphabet {
 public:
  static const byte_alphabet& get() {
    static const byte_alphabet table;
    return table;
  }
  const std::string& char_of(unsigned char b) const noexcept { return chars_[b]; }
  // The byte c stands for, or -1.
  int byte_of(char32_t c) const noexcept { return c < bytes_.size() ? bytes_[c] : -1; }

 private:
  byte_alphabet() {
    bytes_.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t c = printable ? static_cast<char32_t>(b) : next++;
      chars_[static_cast<std::size_t>(b)] = utf8::encode(c);
      bytes_[c] = static_cast<short>(b);
    }
  }
  std::array<std::string, 256> chars_;
  std::array<short, 324> bytes_{};  // 256 + 68 stand-ins
};

class pre_tokenizer {
 public:
  virtual ~pre_tokenizer() = default;
  // Replaces the pieces with what this pre-tokenizer makes of them.
  virtual void pre_tokenize(pieces& list) const = 0;
};

namespace detail {

// Cuts each piece at the matches of pattern, as behavior says.
inline void split_at_matches(const regex& pattern, split_behavior behavior, bool invert, pieces& list) {
  pieces out;
  out.reserve(list.size() * 2);
  for (const auto& p : list) {
    stretch_builder stretches(p.text.size(), invert);
    pattern.for_each_match(p.text, [&](std::size_t begin, std::size_t end) { stretches.add(begin, end); });
    cut(p, stretches.finish(), behavior, out);
  }
  list.swap(out);
}

class split_pre_tokenizer final : public pre_tokenizer {
 public:
  explicit split_pre_tokenizer(const json_section& s)
      : pattern_(pattern_of(s.at("pattern"))),
        behavior_(split_behavior_of(s.at("behavior"))),
        invert_(s.at("invert").boolean()) {}
  void pre_tokenize(pieces& list) const override { split_at_matches(*pattern_, behavior_, invert_, list); }

 private:
  std::unique_ptr<regex> pattern_;
  split_behavior behavior_;
  bool invert_;
};

class byte_level_pre_tokenizer final : public pre_tokenizer {
 public:
  // GPT-2's pattern, as tokenizers' ByteLevel applies it with use_regex.
  static constexpr std::string_view gpt2_pattern =
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

  explicit byte_level_pre_tokenizer(const json_section& s)
      : add_prefix_space_(s.flag("add_prefix_space", true)), use_regex_(s.flag("use_regex", true)) {
    if (use_regex_) pattern_ = std::make_unique<regex>(gpt2_pattern, s.label() + " (GPT-2's pattern)");
  }
  void pre_tokenize(pieces& list) const override {
    if (add_prefix_space_)
      for (auto& p : list)
        if (p.text.empty() || p.text[0] != ' ') p.text.insert(0, 1, ' ');
    if (pattern_) split_at_matches(*pattern_, split_behavior::isolated, false, list);
    const auto& alphabet = byte_alphabet::get();
    for (auto& p : list) {
      std::string mapped;
      mapped.reserve(p.text.size() * 2);
      for (const char c : p.text) mapped += alphabet.char_of(static_cast<unsigned char>(c));
      p.text = std::move(mapped);
    }
  }

 private:
  bool add_prefix_space_, use_regex_;
  std::unique_ptr<regex> pattern_;
};

enum class prepend_scheme { always, first, never };

// Metaspace's prepend scheme, from prepend_scheme or the older add_prefix_space, as tokenizers reads them.
inline prepend_scheme prepend_scheme_of(const json_section& s) {
  auto scheme = prepend_scheme::always;
  if (const auto p = s.find("prepend_scheme")) {
    const auto& name = p->string();
    if (name == "always") scheme = prepend_scheme::always;
    else if (name == "first") scheme = prepend_scheme::first;
    else if (name == "never") scheme = prepend_scheme::never;
    else p->fail("always, first or never");
  }
  if (const auto legacy = s.find("add_prefix_space"); legacy && !legacy->boolean()) {
    if (scheme != prepend_scheme::never) legacy->fail("true, or prepend_scheme 'never' beside it", "false");
    scheme = prepend_scheme::never;
  }
  return scheme;
}

class metaspace_pre_tokenizer final : public pre_tokenizer {
 public:
  explicit metaspace_pre_tokenizer(const json_section& s)
      : replacement_(utf8::encode(s.at("replacement").character())),
        scheme_(prepend_scheme_of(s)),
        split_(s.flag("split", true)) {}
  void pre_tokenize(pieces& list) const override {
    pieces out;
    out.reserve(list.size());
    for (auto& p : list) {
      std::string text;
      text.reserve(p.text.size() + replacement_.size());
      for (const char c : p.text) {
        if (c == ' ') text += replacement_;
        else text += c;
      }
      const bool starts = text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == prepend_scheme::always || (scheme_ == prepend_scheme::first && p.at_start)))
        text.insert(0, replacement_);
      piece replaced{std::move(text), p.at_start};
      if (!split_) {
        if (!replaced.text.empty()) out.push_back(std::move(replaced));
        continue;
      }
      stretch_builder stretches(replaced.text.size());
      for (auto at = replaced.text.find(replacement_); at != std::string::npos;
           at = replaced.text.find(replacement_, at + replacement_.size()))
        stretches.add(at, at + replacement_.size());
      cut(replaced, stretches.finish(), split_behavior::merged_with_next, out);
    }
    list.swap(out);
  }

 private:
  std::string replacement_;
  prepend_scheme scheme_;
  bool split_;
};

}  // namespace detail

using pre_tokenizers = std::vector<std::unique_ptr<pre_tokenizer>>;

// The pre-tokenizers section s describes (a Sequence's, flattened).
inline pre_tokenizers make_pre_tokenizers(const detail::json_section& s) {
  return detail::parts_of<pre_tokenizer>(s, "pretokenizers", [](const detail::json_section& part) -> std::unique_ptr<pre_tokenizer> {
    const auto& type = part.type();
    if (type == "Split") return std::make_unique<detail::split_pre_tokenizer>(part);
    if (type == "ByteLevel") return std::make_unique<detail::byte_level_pre_tokenizer>(part);
    if (type == "Metaspace") return std::make_unique<detail::metaspace_pre_tokenizer>(part);
    part.unsupported("Split, ByteLevel, Metaspace or Sequence");
  });
}

}  // namespace difftx::tokenizer
