// tokenizer.json's "added_tokens" (special tokens such as <|begin_of_text|>
// and user-added ones), found in the text before anything else, as tokenizers
// finds them: the leftmost match, the longest of those starting there, then
// on after it. Tokens with normalized false are matched in the raw text,
// those with normalized true in the normalizer's output (as their content
// normalizes). A match of a single_word token counts only between non-word
// characters; lstrip and rstrip take the whitespace beside it into the token.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <difftx/ops/common.hpp>

#include "difftx/tokenizer/bpe.hpp"
#include "difftx/tokenizer/json_section.hpp"
#include "difftx/tokenizer/normalizer.hpp"
#include "difftx/tokenizer/regex.hpp"
#include "difftx/tokenizer/utf8.hpp"

namespace difftx::tokenizer {

struct added_token {
  std::string content;  // as the file gives it
  std::string pattern;  // what is matched and decoded: content, normalized for a normalized token
  token_t id = 0;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

class added_vocabulary {
 public:
  // A stretch of text: an added token's (id >= 0) or plain text (id -1).
  struct segment {
    std::size_t begin, end;
    token_t id;
  };

  // list: the "added_tokens" array, or nullopt when the file has none. A token
  // given before, or one the model knows, keeps that id (tokenizers assigns it so).
  added_vocabulary(const std::optional<detail::json_section>& list, const bpe_model& model, const normalizers& norm) {
    if (!list) return;
    for (std::size_t i = 0; i < list->size(); ++i) {
      const auto s = (*list)[i];
      s.require_object();
      added_token t;
      t.content = s.at("content").string();
      if (t.content.empty()) continue;  // tokenizers ignores these
      t.id = static_cast<token_t>(s.at("id").integer(0, max_token_id - 1));
      if (const auto earlier = by_content_.find(t.content); earlier != by_content_.end()) t.id = earlier->second;
      else if (const auto known = model.id_of(t.content)) t.id = *known;
      t.single_word = s.flag("single_word", false);
      t.lstrip = s.flag("lstrip", false);
      t.rstrip = s.flag("rstrip", false);
      t.normalized = s.flag("normalized", true);
      t.special = s.flag("special", false);
      t.pattern = t.normalized ? normalize(norm, t.content) : t.content;
      if (t.pattern.empty()) continue;
      by_content_.insert_or_assign(t.content, t.id);
      by_id_.insert_or_assign(t.id, std::move(t));  // a later entry for the same token wins
    }
    for (const auto& [id, t] : by_id_) (t.normalized ? normalized_ : raw_).add(t.pattern, id);
  }

  const added_token* find(token_t id) const noexcept {
    const auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : &it->second;
  }
  std::optional<token_t> id_of(std::string_view content) const {
    const auto it = by_content_.find(content);
    return it == by_content_.end() ? std::nullopt : std::optional<token_t>(it->second);
  }
  const std::unordered_map<token_t, added_token>& tokens() const noexcept { return by_id_; }

  // text cut at the tokens with normalized == `normalized` (text: valid UTF-8).
  std::vector<segment> split(std::string_view text, bool normalized) const {
    const auto& set = normalized ? normalized_ : raw_;
    std::vector<segment> out;
    std::size_t start_offset = 0;
    for (std::size_t i = 0; i < text.size();) {
      const auto found = set.longest_at(text, i);
      if (!found) {
        ++i;
        continue;
      }
      const auto& t = by_id_.at(found->second);
      std::size_t start = i, stop = i + found->first;
      i = stop;
      if (t.single_word && ((start > 0 && is_word_character_before(text, start)) ||
                            (stop < text.size() && is_word_character_at(text, stop))))
        continue;
      if (t.lstrip) {
        std::size_t s = start;
        while (s > 0) {
          std::size_t previous = 0;
          if (!utf8::is_white_space(utf8::decode_before(text, s, &previous))) break;
          s = previous;
        }
        start = std::max(s, start_offset);
      }
      if (t.rstrip)
        while (stop < text.size() && utf8::is_white_space(utf8::decode_at(text, stop))) stop += utf8::char_length(text[stop]);
      if (start_offset < start) out.push_back({start_offset, start, -1});
      out.push_back({start, stop, t.id});
      start_offset = stop;
    }
    if (start_offset < text.size()) out.push_back({start_offset, text.size(), -1});
    return out;
  }

 private:
  // The patterns of one set of tokens, for the longest match at a position.
  class trie {
   public:
    void add(std::string_view pattern, token_t id) {
      std::int32_t node = 0;
      for (const char c : pattern) {
        const auto b = static_cast<unsigned char>(c);
        if (node == 0) starts_[b] = true;
        std::int32_t next = -1;
        for (const auto& [byte, child] : nodes_[static_cast<std::size_t>(node)].children)
          if (byte == b) next = child;
        if (next < 0) {
          next = static_cast<std::int32_t>(nodes_.size());
          nodes_[static_cast<std::size_t>(node)].children.emplace_back(b, next);
          nodes_.emplace_back();
        }
        node = next;
      }
      nodes_[static_cast<std::size_t>(node)].token = id;
    }
    // (length, id) of the longest pattern at text[i], if any.
    std::optional<std::pair<std::size_t, token_t>> longest_at(std::string_view text, std::size_t i) const {
      if (!starts_[static_cast<unsigned char>(text[i])]) return std::nullopt;
      std::optional<std::pair<std::size_t, token_t>> best;
      std::int32_t node = 0;
      for (std::size_t j = i; j < text.size(); ++j) {
        const auto b = static_cast<unsigned char>(text[j]);
        std::int32_t next = -1;
        for (const auto& [byte, child] : nodes_[static_cast<std::size_t>(node)].children)
          if (byte == b) next = child;
        if (next < 0) break;
        node = next;
        if (const auto id = nodes_[static_cast<std::size_t>(node)].token; id >= 0) best.emplace(j + 1 - i, id);
      }
      return best;
    }

   private:
    struct node_t {
      std::vector<std::pair<unsigned char, std::int32_t>> children;
      token_t token = -1;
    };
    std::vector<node_t> nodes_ = std::vector<node_t>(1);
    std::array<bool, 256> starts_{};
  };

  // Rust's \w (Alphabetic, marks, decimal digits, connector punctuation, joiners): single_word's test.
  static const regex& word_character() {
    static const regex pattern(R"(^[\p{L}\p{Nl}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])", "single_word's word characters");
    return pattern;
  }
  static bool is_word_character_at(std::string_view text, std::size_t i) {
    bool found = false;
    word_character().for_each_match(text.substr(i, utf8::char_length(text[i])), [&](std::size_t, std::size_t) { found = true; });
    return found;
  }
  static bool is_word_character_before(std::string_view text, std::size_t i) {
    std::size_t start = 0;
    utf8::decode_before(text, i, &start);
    return is_word_character_at(text, start);
  }

  std::unordered_map<token_t, added_token> by_id_;
  detail::string_map<token_t> by_content_;
  trie raw_, normalized_;
};

}  // namespace difftx::tokenizer
