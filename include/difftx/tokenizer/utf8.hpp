// UTF-8 as the tokenizer needs it: strict validation (no overlongs, no
// surrogates, nothing above U+10FFFF), stepping over characters of a valid
// string, and Rust's lossy conversion (each maximal invalid subpart becomes one
// U+FFFD), which tokenizers' ByteLevel decoder applies to the bytes it rebuilds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace difftx::tokenizer::utf8 {

// At s[i]: the length of a valid sequence (valid true), or of the maximal
// subpart of one that breaks off (valid false, length >= 1).
struct sequence {
  std::size_t length;
  bool valid;
};

inline sequence sequence_at(std::string_view s, std::size_t i) noexcept {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned lead = byte(0);
  if (lead < 0x80) return {1, true};
  std::size_t need;
  unsigned low = 0x80, high = 0xBF;  // the second byte's range
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 3;
    if (lead == 0xE0) low = 0xA0;   // overlong
    if (lead == 0xED) high = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 4;
    if (lead == 0xF0) low = 0x90;   // overlong
    if (lead == 0xF4) high = 0x8F;  // above U+10FFFF
  } else {
    return {1, false};
  }
  std::size_t k = 1;
  for (; k < need && i + k < s.size(); ++k) {
    const unsigned b = byte(k);
    if (k == 1 ? (b < low || b > high) : (b & 0xC0u) != 0x80u) return {k, false};
  }
  return {k, k == need};
}

// The offset of the first byte of s that is not valid UTF-8, or npos.
inline std::size_t first_invalid(std::string_view s) noexcept {
  for (std::size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const auto q = sequence_at(s, i);
    if (!q.valid) return i;
    i += q.length;
  }
  return std::string_view::npos;
}

// The length of the character that starts with this byte (of valid UTF-8).
inline std::size_t char_length(char lead) noexcept {
  const auto b = static_cast<unsigned char>(lead);
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

// The code point at s[i] (of valid UTF-8).
inline char32_t decode_at(std::string_view s, std::size_t i) noexcept {
  const auto b = [&](std::size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[i + k])); };
  switch (char_length(s[i])) {
    case 1: return b(0);
    case 2: return (b(0) & 0x1F) << 6 | (b(1) & 0x3F);
    case 3: return (b(0) & 0x0F) << 12 | (b(1) & 0x3F) << 6 | (b(2) & 0x3F);
    default: return (b(0) & 0x07) << 18 | (b(1) & 0x3F) << 12 | (b(2) & 0x3F) << 6 | (b(3) & 0x3F);
  }
}

// The code point before offset i (of valid UTF-8, i > 0), and where it starts.
inline char32_t decode_before(std::string_view s, std::size_t i, std::size_t* start = nullptr) noexcept {
  std::size_t j = i - 1;
  while (j > 0 && (static_cast<unsigned char>(s[j]) & 0xC0u) == 0x80u) --j;
  if (start) *start = j;
  return decode_at(s, j);
}

inline void append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

inline std::string encode(char32_t c) {
  std::string out;
  append(out, c);
  return out;
}

inline constexpr std::string_view replacement_character = "\xEF\xBF\xBD";  // U+FFFD

// bytes with each maximal invalid subpart replaced by U+FFFD (Rust's String::from_utf8_lossy).
inline std::string lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (std::size_t i = 0; i < bytes.size();) {
    const auto q = sequence_at(bytes, i);
    if (q.valid) out.append(bytes.substr(i, q.length));
    else out.append(replacement_character);
    i += q.length;
  }
  return out;
}

// Unicode's White_Space property (what Rust's \s matches: tokenizers' lstrip and rstrip).
inline bool is_white_space(char32_t c) noexcept {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

}  // namespace difftx::tokenizer::utf8
