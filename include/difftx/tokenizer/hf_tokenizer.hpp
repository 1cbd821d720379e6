// A Hugging Face tokenizer.json with a BPE model (Llama-3's and GPT-2's byte-
// level BPE, Llama-2's and Mistral's SentencePiece-style BPE), encoding and
// decoding as tokenizers 0.23 does:
//   added tokens found first (added_tokens.hpp), the rest normalized
//   (normalizer.hpp), cut into words (pre_tokenizer.hpp), each word BPE-
//   encoded (bpe.hpp); the post-processor adds BOS and the like
//   (post_processor.hpp); decoding runs the decoder (decoder.hpp).
// Whatever the file holds that difftx does not implement (another model,
// normalizer, pre-tokenizer, post-processor or decoder, truncation, padding) is
// refused when it is read, with input_error("read_tokenizer", "<file>: <key>", ...).
//
//   auto tok = difftx::tokenizer::hf_tokenizer::from_file("Llama-3/tokenizer.json");
//   std::vector<difftx::token_t> ids = tok.encode("Hello world");  // BOS first, as the template says
//   std::string text = tok.decode(ids, /*skip_special_tokens=*/true);
//
// Encoding and decoding are const and may run on several threads at once.
#pragma once

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "difftx/tokenizer/added_tokens.hpp"
#include "difftx/tokenizer/bpe.hpp"
#include "difftx/tokenizer/decoder.hpp"
#include "difftx/tokenizer/json_section.hpp"
#include "difftx/tokenizer/normalizer.hpp"
#include "difftx/tokenizer/post_processor.hpp"
#include "difftx/tokenizer/pre_tokenizer.hpp"
#include "difftx/tokenizer/text_tokenizer.hpp"

namespace difftx::tokenizer {

class hf_tokenizer final : public text_tokenizer {
 public:
  // The tokenizer.json at path (at most max_file_bytes).
  static hf_tokenizer from_file(const std::filesystem::path& path) {
    return hf_tokenizer(detail::read_text_file(path), path.string());
  }
  // From the file's text; label names it in messages.
  explicit hf_tokenizer(std::string_view json, std::string label = "tokenizer.json") : label_(std::move(label)) {
    const auto document = detail::parse_json(json, label_);
    const detail::json_section root(document, label_);
    root.require_object();
    if (const auto version = root.find("version"); version && version->string() != "1.0") version->fail("'1.0'");
    for (const auto* key : {"truncation", "padding"})
      if (const auto s = root.find(key)) s->fail("null (difftx encodes the whole text, unpadded)");
    model_ = std::make_unique<bpe_model>(root.at("model").require_object());
    if (const auto s = root.find("normalizer")) normalizers_ = make_normalizers(*s);
    added_ = std::make_unique<added_vocabulary>(root.find("added_tokens"), *model_, normalizers_);
    if (const auto s = root.find("pre_tokenizer")) pre_tokenizers_ = make_pre_tokenizers(*s);
    if (const auto s = root.find("decoder")) {
      decoders_ = make_decoders(*s);
      has_decoder_ = true;
    }
    vocab_size_ = model_->size();
    for (const auto& [id, t] : added_->tokens()) vocab_size_ = std::max(vocab_size_, id + 1);
    if (const auto s = root.find("post_processor")) {
      post_processors_ = make_post_processors(*s);
      std::vector<token_t> added;
      for (const auto& p : post_processors_) p->added_ids(added);
      for (const auto id : added)
        if (!token_string(id)) s->fail("special tokens whose ids are tokens", "id " + std::to_string(id) + ", which has no token");
      // Where the template puts the text: what comes before is the prefix (BOS).
      std::vector<token_t> marked{-1};
      post_process(marked, true);
      const auto text = std::find(marked.begin(), marked.end(), -1);
      prefix_.assign(marked.begin(), text);
      if (text != marked.end()) suffix_.assign(text + 1, marked.end());
    }
  }

  std::optional<token_t> id_of(std::string_view token) const override {
    if (const auto id = added_->id_of(token)) return id;
    return model_->id_of(token);
  }
  std::optional<std::string> token_of(token_t id) const override {
    const auto* s = token_string(id);
    return s ? std::optional<std::string>(*s) : std::nullopt;
  }
  token_t vocab_size() const override { return vocab_size_; }
  // The first id the post-processor puts before the text.
  std::optional<token_t> bos_id() const override {
    return prefix_.empty() ? std::nullopt : std::optional<token_t>(prefix_.front());
  }
  // The first id the post-processor puts after the text.
  std::optional<token_t> eos_id() const override {
    return suffix_.empty() ? std::nullopt : std::optional<token_t>(suffix_.front());
  }
  bool adds_bos() const override { return !prefix_.empty(); }
  std::string description() const override {
    return label_ + " (BPE, " + std::to_string(vocab_size_) + " ids, " + std::to_string(model_->merges()) + " merges, " +
           std::to_string(added_->tokens().size()) + " added tokens)";
  }

  // Whether id is a special added token (decode's skip_special_tokens leaves these out).
  bool is_special(token_t id) const noexcept {
    const auto* t = added_->find(id);
    return t && t->special;
  }
  const std::string& label() const noexcept { return label_; }

 protected:
  std::vector<token_t> encode_valid(std::string_view text, bool add_special_tokens) const override {
    std::vector<token_t> ids;
    ids.reserve(text.size() / 3 + 8);
    for (const auto& raw : added_->split(text, false)) {
      if (raw.id >= 0) {
        ids.push_back(raw.id);
        continue;
      }
      std::string normalized(text.substr(raw.begin, raw.end - raw.begin));
      normalized = normalize(normalizers_, std::move(normalized));
      for (const auto& inner : added_->split(normalized, true)) {
        if (inner.id >= 0) {
          ids.push_back(inner.id);
          continue;
        }
        pieces words{{normalized.substr(inner.begin, inner.end - inner.begin), raw.begin == 0 && inner.begin == 0}};
        for (const auto& p : pre_tokenizers_) p->pre_tokenize(words);
        for (const auto& word : words)
          if (!word.text.empty()) model_->encode_word(word.text, ids);
      }
    }
    post_process(ids, add_special_tokens);
    return ids;
  }

  std::string decode_ids(std::span<const token_t> ids, bool skip_special_tokens) const override {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const auto* s = token_string(ids[i]);
      if (!s) unknown_id(ids, i, vocab_size_);
      if (!(skip_special_tokens && is_special(ids[i]))) tokens.push_back(*s);
    }
    std::string text;
    if (!has_decoder_) {  // tokenizers joins the tokens with spaces
      for (std::size_t i = 0; i < tokens.size(); ++i) text.append(i > 0 ? " " : "").append(tokens[i]);
      return text;
    }
    for (const auto& d : decoders_) d->decode_chain(tokens);
    for (const auto& t : tokens) text += t;
    return text;
  }

 private:
  void post_process(std::vector<token_t>& ids, bool add_special_tokens) const {
    for (const auto& p : post_processors_) p->process(ids, add_special_tokens);
  }
  // An added token's (as matched: normalized where it is), else the model's; null for an unknown id.
  const std::string* token_string(token_t id) const noexcept {
    if (const auto* t = added_->find(id)) return &t->pattern;
    return model_->token_of(id);
  }

  std::string label_;
  std::unique_ptr<bpe_model> model_;
  normalizers normalizers_;
  std::unique_ptr<added_vocabulary> added_;
  pre_tokenizers pre_tokenizers_;
  post_processors post_processors_;
  decoders decoders_;
  bool has_decoder_ = false;  // a decoder, even an empty Sequence: tokens are joined without spaces
  std::vector<token_t> prefix_, suffix_;
  token_t vocab_size_ = 0;
};

}  // namespace difftx::tokenizer
