// tokenizer.json's "normalizer", as SentencePiece-style files use it: Prepend,
// Replace and a Sequence of them (older Llama-2 files: Sequence[Prepend("▁"),
// Replace(" ", "▁")]). Unicode normalizations (NFC, NFKC, ...), Lowercase,
// Strip and the rest are refused: they would change what the model sees.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "difftx/tokenizer/json_section.hpp"
#include "difftx/tokenizer/regex.hpp"

namespace difftx::tokenizer {

class normalizer {
 public:
  virtual ~normalizer() = default;
  // text normalized; empty text stays empty.
  virtual std::string normalize(std::string text) const = 0;
};

namespace detail {

class prepend_normalizer final : public normalizer {
 public:
  explicit prepend_normalizer(const json_section& s) : prefix_(s.at("prepend").string()) {}
  std::string normalize(std::string text) const override { return text.empty() ? text : prefix_ + text; }

 private:
  std::string prefix_;
};

class replace_normalizer final : public normalizer {
 public:
  explicit replace_normalizer(const json_section& s)
      : pattern_(pattern_of(s.at("pattern"))), content_(s.at("content").string()) {}
  std::string normalize(std::string text) const override { return replace_all(*pattern_, text, content_); }

 private:
  std::unique_ptr<regex> pattern_;
  std::string content_;
};

}  // namespace detail

using normalizers = std::vector<std::unique_ptr<normalizer>>;

// The normalizers section s describes (an object with "type"; a Sequence's, flattened).
inline normalizers make_normalizers(const detail::json_section& s) {
  return detail::parts_of<normalizer>(s, "normalizers", [](const detail::json_section& part) -> std::unique_ptr<normalizer> {
    const auto& type = part.type();
    if (type == "Prepend") return std::make_unique<detail::prepend_normalizer>(part);
    if (type == "Replace") return std::make_unique<detail::replace_normalizer>(part);
    part.unsupported("Prepend, Replace or Sequence (difftx does not apply Unicode normalization, Lowercase, Strip or others)");
  });
}

inline std::string normalize(const normalizers& steps, std::string text) {
  for (const auto& step : steps) text = step->normalize(std::move(text));
  return text;
}

}  // namespace difftx::tokenizer
