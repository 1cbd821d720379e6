// The lookups BPE makes for every symbol pair and word, from 64-bit keys (a
// pair of ids, a code point, a string's hash), in one array with linear
// probing: a lookup in a table of Llama-3's 280k merges costs about one cache
// miss, where std::unordered_map's nodes cost two or three.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace difftx::tokenizer::detail {

template <class V>
class flat_table {
 public:
  void insert_or_assign(std::uint64_t key, const V& value) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    auto& s = probe(key);
    if (!s.used) ++size_;
    s = {key, value, true};
  }
  const V* find(std::uint64_t key) const noexcept {
    if (slots_.empty()) return nullptr;
    for (std::size_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
      const auto& s = slots_[i];
      if (!s.used) return nullptr;
      if (s.key == key) return &s.value;
    }
  }
  std::size_t size() const noexcept { return size_; }

 private:
  struct slot {
    std::uint64_t key = 0;
    V value{};
    bool used = false;
  };
  // splitmix64's finalizer: ids and pairs of ids are far from random bits.
  static std::size_t mix(std::uint64_t k) noexcept {
    k ^= k >> 30;
    k *= 0xbf58476d1ce4e5b9ULL;
    k ^= k >> 27;
    k *= 0x94d049bb133111ebULL;
    return static_cast<std::size_t>(k ^ (k >> 31));
  }
  slot& probe(std::uint64_t key) noexcept {
    for (std::size_t i = mix(key) & mask_;; i = (i + 1) & mask_)
      if (!slots_[i].used || slots_[i].key == key) return slots_[i];
  }
  void grow() {
    std::vector<slot> old(slots_.empty() ? 16 : slots_.size() * 2);
    old.swap(slots_);
    mask_ = slots_.size() - 1;
    for (const auto& s : old)
      if (s.used) probe(s.key) = s;
  }

  std::vector<slot> slots_;
  std::size_t mask_ = 0, size_ = 0;
};

// Strings to values through their hashes; a second string with the hash of one
// already in is refused (insert returns false), which only a file made to
// collide can give.
template <class V>
class string_table {
 public:
  bool insert(std::string key, const V& value) {
    const auto h = hash(key);
    if (index_.find(h)) return false;
    index_.insert_or_assign(h, keys_.size());
    keys_.push_back(std::move(key));
    values_.push_back(value);
    return true;
  }
  const V* find(std::string_view key) const noexcept {
    const auto* i = index_.find(hash(key));
    return i && keys_[*i] == key ? &values_[*i] : nullptr;
  }
  std::size_t size() const noexcept { return keys_.size(); }
  // The i-th key inserted, and its value.
  const std::string& key(std::size_t i) const noexcept { return keys_[i]; }
  const V& value(std::size_t i) const noexcept { return values_[i]; }

 private:
  static std::uint64_t hash(std::string_view s) noexcept { return std::hash<std::string_view>{}(s); }
  flat_table<std::size_t> index_;
  std::vector<std::string> keys_;
  std::vector<V> values_;
};

}  // namespace difftx::tokenizer::detail
