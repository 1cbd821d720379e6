// The one exception type difftx throws for bad input.
//
// Every public entry (module forward/backward, ops, file I/O, gradcheck) checks
// its arguments before it writes anything, and on a mismatch throws input_error
// naming where it happened, which argument, what was expected and what came.
// Outputs, gradients and parameters are left exactly as they were.
//
// The message is one line of printable text whatever the parts hold (a tensor
// name or a header field from a hostile file may carry newlines, terminal
// escapes or invalid UTF-8): such bytes appear escaped, as \n, \t, \r or \xNN.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace difftx {

namespace detail {

// The length of the valid UTF-8 sequence of a printable character (U+00A0 and
// above) starting at s[i], or 0 if none starts there.
inline std::size_t printable_utf8_length(std::string_view s, std::size_t i) noexcept {
  const auto byte = [&](std::size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0u; };
  const auto continuation = [&](std::size_t k) { return (byte(k) & 0xC0u) == 0x80u; };
  const unsigned b0 = byte(0), b1 = byte(1);
  if (b0 == 0xC2) return b1 >= 0xA0 && continuation(1) ? 2 : 0;  // C2 80-9F: the C1 controls
  if (b0 >= 0xC3 && b0 <= 0xDF) return continuation(1) ? 2 : 0;
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    const bool second_ok = b0 == 0xE0 ? b1 >= 0xA0 : b0 == 0xED ? b1 <= 0x9F : true;  // no overlongs, no surrogates
    return second_ok && continuation(1) && continuation(2) ? 3 : 0;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    const bool second_ok = b0 == 0xF0 ? b1 >= 0x90 : b0 == 0xF4 ? b1 <= 0x8F : true;
    return second_ok && continuation(1) && continuation(2) && continuation(3) ? 4 : 0;
  }
  return 0;
}

// s with control bytes and invalid UTF-8 escaped, so it prints as one line.
inline std::string printable(std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
      ++i;
    } else if (const auto n = c >= 0x80 ? printable_utf8_length(s, i) : 0; n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      if (c == '\n') out += "\\n";
      else if (c == '\t') out += "\\t";
      else if (c == '\r') out += "\\r";
      else out += {'\\', 'x', hex[c >> 4], hex[c & 15]};
      ++i;
    }
  }
  return out;
}

}  // namespace detail

class input_error : public std::invalid_argument {
 public:
  // where: the module or function ("MultiHead::forward", "read_safetensors");
  // argument: the argument or tensor name; expected / got: what was wanted and
  // what was found, in words or as shapes.
  input_error(std::string where, std::string argument, std::string expected, std::string got)
      : std::invalid_argument(format(where, argument, expected, got)),
        where_(std::move(where)),
        argument_(std::move(argument)),
        expected_(std::move(expected)),
        got_(std::move(got)) {}

  const std::string& where() const noexcept { return where_; }
  const std::string& argument() const noexcept { return argument_; }
  const std::string& expected() const noexcept { return expected_; }
  const std::string& got() const noexcept { return got_; }

 private:
  static std::string format(const std::string& where, const std::string& argument,
                            const std::string& expected, const std::string& got) {
    return detail::printable("difftx::" + where + ": argument '" + argument + "': expected " + expected + ", got " + got);
  }
  std::string where_, argument_, expected_, got_;
};

}  // namespace difftx
