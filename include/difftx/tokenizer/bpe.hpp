// tokenizer.json's "model" of type BPE: the vocabulary, the ranked merges
// (either spelling: "a b" or ["a", "b"]), and the word encoder tokenizers
// applies: each character a token (else its <0xNN> byte tokens with
// byte_fallback, else unk_token, fused with fuse_unk), then the lowest-ranked
// adjacent pair merged first (the leftmost of equal ranks), until none is left.
// ignore_merges: a word that is itself a token is that token.
//
// Refused: another model type, dropout (random merges), a continuing-subword
// prefix or end-of-word suffix (word-piece style BPE), a merge whose parts or
// result are not tokens, an unk_token outside the vocabulary, an id given twice.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <difftx/ops/common.hpp>

#include "difftx/tokenizer/flat_table.hpp"
#include "difftx/tokenizer/json_section.hpp"
#include "difftx/tokenizer/utf8.hpp"

namespace difftx::tokenizer {

namespace detail {

// Not noexcept on purpose: libstdc++ then keeps each key's hash in its node, so
// a lookup does not hash every key it passes in the bucket list.
struct string_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using string_map = std::unordered_map<std::string, V, string_hash, std::equal_to<>>;

}  // namespace detail

class bpe_model {
 public:
  // Words up to this long are cached (a long word is rarely seen twice); the cache is emptied when this full.
  static constexpr std::size_t cached_word_bytes = 256, cache_entries = 1 << 16;

  explicit bpe_model(const detail::json_section& model) {
    if (model.type() != "BPE") model.unsupported("BPE (difftx reads BPE models only; WordPiece, Unigram and WordLevel are refused)");
    if (const auto dropout = model.find("dropout"); dropout && !(dropout->value().is_number() && dropout->value().get<double>() == 0))
      dropout->fail("null or 0 (difftx's BPE is deterministic)");
    for (const auto* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (const auto affix = model.find(key); affix && !affix->string().empty())
        affix->fail("null or \"\" (BPE with word-piece affixes is not supported)");
    fuse_unk_ = model.flag("fuse_unk", false);
    byte_fallback_ = model.flag("byte_fallback", false);
    ignore_merges_ = model.flag("ignore_merges", false);
    read_vocabulary(model.at("vocab").require_object());
    for (std::size_t i = 0; i < vocab_.size(); ++i)
      if (const auto& token = vocab_.key(i); !token.empty() && utf8::char_length(token[0]) == token.size()) {  // one character
        const auto c = utf8::decode_at(token, 0);
        if (c < small_characters) character_ids_[c] = vocab_.value(i);
        else large_character_ids_.insert_or_assign(c, vocab_.value(i));
      }
    if (const auto unk = model.find("unk_token")) {
      unk_ = id_of(unk->string());
      if (!unk_) unk->fail("a token of model.vocab");
    }
    for (int b = 0; b < 256; ++b) {
      static constexpr char hex[] = "0123456789ABCDEF";
      byte_ids_[static_cast<std::size_t>(b)] = id_of(std::string{'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'});
    }
    read_merges(model.at("merges"));
  }

  std::optional<token_t> id_of(std::string_view token) const {
    const auto* id = vocab_.find(token);
    return id ? std::optional<token_t>(*id) : std::nullopt;
  }
  // The token of id, or null.
  const std::string* token_of(token_t id) const noexcept {
    const auto* i = id >= 0 ? token_index_.find(static_cast<std::uint64_t>(id)) : nullptr;
    return i ? &vocab_.key(*i) : nullptr;
  }
  // One more than the largest id.
  token_t size() const noexcept { return size_; }
  std::size_t merges() const noexcept { return merges_.size(); }

  // Appends the ids of word (valid UTF-8, not empty).
  void encode_word(std::string_view word, std::vector<token_t>& out) const {
    if (ignore_merges_)
      if (const auto id = id_of(word)) {
        out.push_back(*id);
        return;
      }
    const bool cacheable = word.size() <= cached_word_bytes;
    if (cacheable) {
      const std::lock_guard lock(cache_mutex_);
      if (const auto it = cache_.find(word); it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    const auto first = out.size();
    merge_word(word, out);
    if (cacheable) {
      const std::lock_guard lock(cache_mutex_);
      if (cache_.size() >= cache_entries) cache_.clear();
      cache_.emplace(std::string(word), std::vector<token_t>(out.begin() + static_cast<std::ptrdiff_t>(first), out.end()));
    }
  }

 private:
  struct merge {
    std::uint32_t rank;
    token_t result;
  };
  struct symbol {
    token_t id;
    std::int32_t previous, next;  // -1: none
    bool alive;
  };
  struct candidate {
    std::uint32_t rank;
    std::int32_t position;  // of the pair's left symbol
    token_t result;
    bool operator>(const candidate& o) const noexcept {
      return rank != o.rank ? rank > o.rank : position > o.position;
    }
  };
  static std::uint64_t pair_key(token_t a, token_t b) noexcept {
    return static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32 | static_cast<std::uint32_t>(b);
  }
  const merge* find_merge(token_t a, token_t b) const noexcept {
    return merges_.find(pair_key(a, b));
  }

  void read_vocabulary(const detail::json_section& vocab) {
    for (auto item = vocab.value().begin(); item != vocab.value().end(); ++item) {
      const auto& token = item.key();
      const auto& value = item.value();
      const auto entry = [&] { return detail::json_section(value, vocab.file(), vocab.path() + "." + token); };
      const auto id = static_cast<token_t>(value.is_number_unsigned() && value.get<std::uint64_t>() < max_token_id
                                               ? value.get<std::int64_t>()
                                               : entry().integer(0, max_token_id - 1));
      if (const auto* other = token_index_.find(static_cast<std::uint64_t>(id)))
        entry().fail("an id no other token has", std::to_string(id) + ", the id of " + detail::describe(vocab_.key(*other)));
      if (!vocab_.insert(token, id)) entry().fail("a token whose hash no other token has", "a hash collision");
      token_index_.insert_or_assign(static_cast<std::uint64_t>(id), vocab_.size() - 1);
      size_ = std::max(size_, id + 1);
    }
  }

  void read_merges(const detail::json_section& list) {
    const auto n = list.size();
    std::uint32_t rank = 0;
    std::string joined;
    for (std::size_t i = 0; i < n; ++i) {
      const auto entry = list[i];
      std::string_view a, b;
      if (entry.value().is_string()) {  // "a b"
        const std::string_view line = entry.string();
        if (line.starts_with("#version")) continue;  // a merges.txt header, skipped as tokenizers does
        const auto space = line.find(' ');
        if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos)
          entry.fail("two tokens separated by one space");
        a = line.substr(0, space);
        b = line.substr(space + 1);
      } else if (entry.value().is_array() && entry.value().size() == 2) {  // ["a", "b"]
        a = entry[0].string();
        b = entry[1].string();
      } else {
        entry.fail("\"a b\" or [\"a\", \"b\"]");
      }
      const auto left = id_of(a), right = id_of(b);
      if (!left || !right) entry.fail("two tokens of model.vocab", "'" + std::string(left ? b : a) + "', not in the vocabulary");
      joined.assign(a).append(b);
      const auto result = id_of(joined);
      if (!result) entry.fail("a merge whose result is in model.vocab", "'" + joined + "', not in the vocabulary");
      merges_.insert_or_assign(pair_key(*left, *right), merge{rank++, *result});  // a later duplicate wins, as in tokenizers
    }
  }

  // The id of the one-character token of c, or -1.
  token_t character_id(char32_t c) const noexcept {
    if (c < small_characters) return character_ids_[c];
    const auto* id = large_character_ids_.find(c);
    return id ? *id : -1;
  }

  // The ids of word, merged: appended to out.
  void merge_word(std::string_view word, std::vector<token_t>& out) const {
    thread_local std::vector<symbol> symbols;  // reused: a word's encoding allocates nothing once these have grown
    thread_local std::vector<candidate> queue;  // a min-heap on (rank, position)
    symbols.clear();
    queue.clear();
    const auto add = [&](token_t id) {
      const auto n = static_cast<std::int32_t>(symbols.size());
      symbols.push_back({id, n - 1, -1, true});
      if (n > 0) symbols[static_cast<std::size_t>(n - 1)].next = n;
    };
    // An unknown stretch not yet added (fused while fuse_unk), -1 for none: a
    // plain id, since GCC 12 at -O1 takes a std::optional here for maybe-uninitialized.
    token_t pending_unk = -1;
    for (std::size_t i = 0; i < word.size();) {
      const auto length = utf8::char_length(word[i]);
      const auto character = word.substr(i, length);
      const auto id = character_id(utf8::decode_at(word, i));
      i += length;
      if (id >= 0) {
        if (pending_unk >= 0) add(pending_unk);
        pending_unk = -1;
        add(id);
        continue;
      }
      if (byte_fallback_ && std::all_of(character.begin(), character.end(), [&](char c) {
            return byte_ids_[static_cast<unsigned char>(c)].has_value();
          })) {
        // tokenizers adds the bytes before a pending unk; kept for the same ids
        for (const char c : character) add(*byte_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
      if (!unk_) continue;  // no unk_token: the character is dropped, as tokenizers drops it
      if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
      pending_unk = *unk_;
    }
    if (pending_unk >= 0) add(pending_unk);

    const auto push = [&](candidate c) {
      queue.push_back(c);
      std::push_heap(queue.begin(), queue.end(), std::greater<>());
    };
    for (std::size_t p = 0; p + 1 < symbols.size(); ++p)
      if (const auto* m = find_merge(symbols[p].id, symbols[p + 1].id))
        push({m->rank, static_cast<std::int32_t>(p), m->result});
    while (!queue.empty()) {
      std::pop_heap(queue.begin(), queue.end(), std::greater<>());
      const auto top = queue.back();
      queue.pop_back();
      auto& left = symbols[static_cast<std::size_t>(top.position)];
      if (!left.alive || left.next < 0) continue;
      auto& right = symbols[static_cast<std::size_t>(left.next)];
      // A stale entry: the pair there now merges into something else, or not at all.
      const auto* now = find_merge(left.id, right.id);
      if (!now || now->result != top.result) continue;
      left.id = top.result;
      right.alive = false;
      left.next = right.next;
      if (left.next >= 0) symbols[static_cast<std::size_t>(left.next)].previous = top.position;
      if (left.previous >= 0)
        if (const auto* m = find_merge(symbols[static_cast<std::size_t>(left.previous)].id, left.id))
          push({m->rank, left.previous, m->result});
      if (left.next >= 0)
        if (const auto* m = find_merge(left.id, symbols[static_cast<std::size_t>(left.next)].id))
          push({m->rank, top.position, m->result});
    }
    for (const auto& s : symbols)
      if (s.alive) out.push_back(s.id);
  }

  static constexpr char32_t small_characters = 0x800;  // ASCII to Arabic, and GPT-2's byte stand-ins
  detail::string_table<token_t> vocab_;
  detail::flat_table<std::size_t> token_index_;  // id: its entry in vocab_
  std::vector<token_t> character_ids_ = std::vector<token_t>(small_characters, -1);
  detail::flat_table<token_t> large_character_ids_;
  token_t size_ = 0;
  detail::flat_table<merge> merges_;
  std::array<std::optional<token_t>, 256> byte_ids_{};
  std::optional<token_t> unk_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  mutable std::mutex cache_mutex_;
  mutable detail::string_map<std::vector<token_t>> cache_;
};

}  // namespace difftx::tokenizer
