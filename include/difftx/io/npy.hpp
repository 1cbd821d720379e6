// .npy read/write (NumPy's format, numpy.lib.format): the magic "\x93NUMPY",
// a version (1.0: u16 little-endian header length; 2.0 and 3.0: u32), the
// header, then the data. The header is a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// padded with spaces and ending in '\n'. It is not JSON, so it is parsed here
// by hand, strictly: exactly the keys descr, fortran_order and shape, each once,
// with a string, True/False and a tuple of integers. difftx reads and writes
// C-order little-endian float32 and float64 of any rank, and reads token ids
// (int32 or int64, read_npy_tokens); everything else throws input_error
// naming the file, what was expected and what came.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "difftx/core/sizes.hpp"
#include "difftx/io/atomic_file.hpp"
#include "difftx/io/tensor_file.hpp"
#include "difftx/ops/common.hpp"

namespace difftx::io {

namespace detail {

struct npy_header {
  std::string descr;
  bool fortran_order = false;
  std::vector<index_t> shape;
};

// A cursor over the header text. Every mismatch throws with the offset.
class npy_header_parser {
 public:
  // The padding (spaces, then '\n') is not part of the dict.
  npy_header_parser(std::string_view text, const std::string& label)
      : text_(text.substr(0, text.find_last_not_of(" \n") + 1)), label_(label) {}

  npy_header parse() {
    std::optional<std::string> descr;
    std::optional<bool> fortran_order;
    std::optional<std::vector<index_t>> shape;
    skip_spaces();
    expect('{', "a dict literal '{...}'");
    skip_spaces();
    while (!consume('}')) {
      const std::string key = string_literal("a key in quotes");
      skip_spaces();
      expect(':', "':' after the key '" + key + "'");
      skip_spaces();
      if (key == "descr" && !descr)
        descr = string_literal("the dtype string of 'descr'");
      else if (key == "fortran_order" && !fortran_order)
        fortran_order = boolean();
      else if (key == "shape" && !shape)
        shape = tuple();
      else
        fail("each of 'descr', 'fortran_order' and 'shape' once", "key '" + key + "'");
      skip_spaces();
      if (!consume(',')) {
        expect('}', "',' or '}' after the value of '" + key + "'");
        break;
      }
      skip_spaces();
    }
    skip_spaces();
    if (position_ != text_.size()) fail("only spaces and a newline after the dict", found());
    if (!descr || !fortran_order || !shape)
      fail("the keys 'descr', 'fortran_order' and 'shape'", std::string("no '") +
                                                               (!descr ? "descr" : !fortran_order ? "fortran_order" : "shape") + "'");
    return {*descr, *fortran_order, *shape};
  }

 private:
  [[noreturn]] void fail(const std::string& expected, const std::string& got) const {
    throw input_error("read_npy", label_ + ": header", expected, got + " at header offset " + std::to_string(position_));
  }
  std::string found() const {
    if (position_ >= text_.size()) return "the end of the header";
    const auto c = static_cast<unsigned char>(text_[position_]);
    if (c < 0x20 || c > 0x7e) return "byte " + std::to_string(c);  // keeps the message on one line
    return std::string{'\'', text_[position_], '\''};
  }
  void skip_spaces() {
    while (position_ < text_.size() && text_[position_] == ' ') ++position_;
  }
  bool consume(char c) {
    if (position_ >= text_.size() || text_[position_] != c) return false;
    ++position_;
    return true;
  }
  void expect(char c, const std::string& expected) {
    if (!consume(c)) fail(expected, found());
  }
  // 'text' or "text", without escapes (no key or value of this format has any).
  std::string string_literal(const std::string& expected) {
    if (position_ >= text_.size() || (text_[position_] != '\'' && text_[position_] != '"')) fail(expected, found());
    const char quote = text_[position_++];
    const std::size_t begin = position_;
    while (position_ < text_.size() && text_[position_] != quote) {
      if (text_[position_] == '\\' || text_[position_] == '\n') fail("a string without escapes or newlines", found());
      ++position_;
    }
    if (position_ >= text_.size()) fail("a closing quote", found());
    return std::string(text_.substr(begin, position_++ - begin));
  }
  bool boolean() {
    for (const auto& [word, value] : {std::pair<std::string_view, bool>{"True", true}, {"False", false}})
      if (text_.substr(position_, word.size()) == word) {
        position_ += word.size();
        return value;
      }
    fail("True or False for 'fortran_order'", found());
  }
  // A non-negative decimal integer without sign or leading zeros, at most 2^40.
  index_t integer() {
    const std::size_t begin = position_;
    std::uint64_t value = 0;
    while (position_ < text_.size() && text_[position_] >= '0' && text_[position_] <= '9') {
      value = value * 10 + static_cast<std::uint64_t>(text_[position_++] - '0');
      if (value > (std::uint64_t{1} << 40)) fail("a dimension of at most 2^40", "a larger one");
    }
    if (position_ == begin) fail("a non-negative integer dimension", found());
    // (appended, not "'" + string: GCC 12 sees a false -Wrestrict overlap in that insert at 0)
    if (text_[begin] == '0' && position_ - begin > 1)
      fail("an integer without leading zeros", std::string("'").append(text_.substr(begin, position_ - begin)).append("'"));
    return static_cast<index_t>(value);
  }
  // (), (n,), (n, m), (n, m,): a Python tuple, so one element needs its comma.
  std::vector<index_t> tuple() {
    expect('(', "a tuple '(...)' for 'shape'");
    std::vector<index_t> dims;
    bool comma = false;
    skip_spaces();
    while (!consume(')')) {
      dims.push_back(integer());
      skip_spaces();
      comma = consume(',');
      skip_spaces();
      if (!comma) {
        expect(')', "',' or ')' in the shape tuple");
        break;
      }
    }
    if (dims.size() == 1 && !comma) fail("a tuple '(n,)' for one dimension", "'(n)', which is not a tuple");
    return dims;
  }

  std::string_view text_;
  const std::string& label_;
  std::size_t position_ = 0;
};

constexpr std::string_view npy_magic = "\x93NUMPY";
constexpr std::size_t npy_alignment = 64;  // the header is padded so the data starts on a multiple of this

}  // namespace detail

namespace detail {

// An .npy file's header and where its data starts, checked up to the dtype,
// which the caller checks (floats or token ids).
struct npy_layout {
  npy_header header;
  std::size_t data_begin = 0;
};

inline npy_layout read_npy_layout(const std::vector<std::byte>& bytes, const std::string& label) {
  constexpr std::string_view where = "read_npy";
  auto fail = [&](const std::string& what, const std::string& expected, const std::string& got) {
    throw input_error(std::string(where), label + ": " + what, expected, got);
  };
  const auto* chars = reinterpret_cast<const char*>(bytes.data());
  if (bytes.size() < 10) fail("preamble", "the 10-byte .npy preamble", std::to_string(bytes.size()) + " bytes in all");
  if (std::string_view(chars, detail::npy_magic.size()) != detail::npy_magic)
    fail("preamble", "the magic \"\\x93NUMPY\" of an .npy file", "other bytes");
  const auto major = static_cast<unsigned>(bytes[6]), minor = static_cast<unsigned>(bytes[7]);
  if (major < 1 || major > 3 || minor != 0)
    fail("version", ".npy version 1.0, 2.0 or 3.0", std::to_string(major) + "." + std::to_string(minor));
  std::size_t header_begin = 10, header_size = 0;
  if (major == 1) {
    std::uint16_t n;
    std::memcpy(&n, chars + 8, 2);
    header_size = n;
  } else {
    if (bytes.size() < 12) fail("preamble", "the 12-byte .npy 2.0 preamble", std::to_string(bytes.size()) + " bytes in all");
    std::uint32_t n;
    std::memcpy(&n, chars + 8, 4);
    header_size = n;
    header_begin = 12;
  }
  if (header_size > bytes.size() - header_begin)
    fail("header", "a header length within the file (" + std::to_string(bytes.size() - header_begin) + " bytes after it)",
         std::to_string(header_size));
  auto header = detail::npy_header_parser(std::string_view(chars + header_begin, header_size), label).parse();
  if (header.fortran_order) fail("fortran_order", "C order (fortran_order False)", "Fortran order");
  return {std::move(header), header_begin + header_size};
}

// The data of a checked layout: exactly shape's elements of element_size bytes.
inline void require_npy_data(const std::vector<std::byte>& bytes, const npy_layout& layout, std::size_t element_size,
                             std::string_view type_name, const std::string& label) {
  const auto& shape = layout.header.shape;
  const auto count = checked_element_count(shape, "read_npy", label + ": shape " + shape_string(shape));
  const std::uint64_t expected_size = checked_bytes(count, element_size, "read_npy", label + ": shape");
  const std::size_t data_size = bytes.size() - layout.data_begin;
  require(data_size == expected_size, "read_npy", label + ": data",
          std::to_string(expected_size) + " bytes for shape " + shape_string(shape) + " of " + std::string(type_name),
          std::to_string(data_size) + " bytes");
}

}  // namespace detail

// Takes the file's bytes by value: the data moves into the tensor without a copy.
inline stored_tensor parse_npy(std::vector<std::byte> bytes, const std::string& label) {
  auto fail = [&](const std::string& what, const std::string& expected, const std::string& got) {
    throw input_error("read_npy", label + ": " + what, expected, got);
  };
  const auto layout = detail::read_npy_layout(bytes, label);
  const auto& header = layout.header;
  stored_tensor t;
  if (header.descr == "<f8")
    t.type = dtype::f64;
  else if (header.descr == "<f4")
    t.type = dtype::f32;
  else if (header.descr == ">f8" || header.descr == ">f4")
    fail("descr", "little-endian data ('<f4' or '<f8')", "big-endian '" + header.descr + "'");
  else
    fail("descr", "dtype '<f4' (float32) or '<f8' (float64)", "'" + header.descr + "'");
  t.shape = header.shape;
  detail::require_npy_data(bytes, layout, size_of(t.type), dtype_name(t.type), label);
  bytes.erase(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(layout.data_begin));  // in place, no reallocation
  t.bytes = std::move(bytes);
  return t;
}

inline stored_tensor read_npy(const std::filesystem::path& path) {
  return parse_npy(read_file_bytes(path, "read_npy"), path.string());
}

// Token ids [B, N] from an .npy of int32 or int64 ('<i4', '<i8'), each in [0, vocab_size).
inline Tensor<token_t, 2> parse_npy_tokens(const std::vector<std::byte>& bytes, const std::string& label,
                                           index_t vocab_size) {
  constexpr std::string_view where = "read_npy";
  const auto layout = detail::read_npy_layout(bytes, label);
  const auto& header = layout.header;
  require(header.descr == "<i4" || header.descr == "<i8", where, label + ": descr",
          "token ids as int32 or int64 ('<i4' or '<i8')", "'" + header.descr + "'");
  const std::size_t width = header.descr == "<i8" ? 8 : 4;
  require(header.shape.size() == 2 && header.shape[0] > 0 && header.shape[1] > 0, where, label + ": shape",
          "token ids [B, N], B and N at least 1", "shape " + shape_string(header.shape));
  detail::require_npy_data(bytes, layout, width, width == 8 ? "int64" : "int32", label);
  Tensor<token_t, 2> tokens({header.shape[0], header.shape[1]});
  for (index_t i = 0; i < tokens.size(); ++i) {
    std::int64_t id = 0;
    if (width == 8) {
      std::memcpy(&id, bytes.data() + layout.data_begin + static_cast<std::size_t>(i) * 8, 8);
    } else {
      std::int32_t narrow = 0;
      std::memcpy(&narrow, bytes.data() + layout.data_begin + static_cast<std::size_t>(i) * 4, 4);
      id = narrow;
    }
    require(id >= 0 && id < vocab_size, where, label + ": data",
            "token ids in [0, " + std::to_string(vocab_size) + ") (the model's vocabulary)",
            std::to_string(id) + " at flat index " + std::to_string(i));
    tokens.data()[i] = static_cast<token_t>(id);
  }
  return tokens;
}

inline Tensor<token_t, 2> read_npy_tokens(const std::filesystem::path& path, index_t vocab_size) {
  return parse_npy_tokens(read_file_bytes(path, "read_npy"), path.string(), vocab_size);
}

// The preamble and header of version 1.0, as numpy.save writes them, for data
// of `type` (float32 or float64) and `shape`; the data follows.
inline std::string npy_header(dtype type, const std::vector<index_t>& shape, const std::string& label) {
  constexpr std::string_view where = "write_npy";
  require(type == dtype::f64 || type == dtype::f32, where, label, "float32 or float64 data", std::string(dtype_name(type)));
  std::string dims;
  for (std::size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) dims += ',';  // (n,): a one-element tuple keeps its comma
  std::string header = std::string("{'descr': '") + (type == dtype::f64 ? "<f8" : "<f4") +
                       "', 'fortran_order': False, 'shape': (" + dims + "), }";
  const std::size_t unpadded = 10 + header.size() + 1;  // preamble, dict, '\n'
  header.append((detail::npy_alignment - unpadded % detail::npy_alignment) % detail::npy_alignment, ' ');
  header += '\n';
  require(header.size() <= 0xffff, where, label, "a shape whose header fits .npy 1.0 (64 KiB)",
          std::to_string(shape.size()) + " dimensions");
  std::string preamble(detail::npy_magic);
  preamble += {'\x01', '\x00', static_cast<char>(header.size() & 0xff), static_cast<char>(header.size() >> 8)};
  return preamble + header;
}

// The header for a stored tensor, whose bytes must match its shape.
inline std::string npy_header(const stored_tensor& t, const std::string& label) {
  require(t.bytes.size() == static_cast<std::size_t>(t.size()) * size_of(t.type), "write_npy", label,
          std::to_string(t.size() * static_cast<index_t>(size_of(t.type))) + " bytes for shape " + shape_string(t.shape),
          std::to_string(t.bytes.size()) + " bytes");
  return npy_header(t.type, t.shape, label);
}

// Writes header and data straight to the stream (no copy of the data).
inline void write_npy_to(std::ostream& out, const stored_tensor& t, const std::string& label) {
  const auto header = npy_header(t, label);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
}

// Writes a host view as `type`, converting a chunk at a time: no copy of the
// whole tensor, so an output as large as memory allows can still be written.
template <Scalar T, std::size_t R>
void write_npy_to(std::ostream& out, dtype type, TensorView<const T, R> view, const std::string& label) {
  require_space("write_npy", label, view, memory_space::host);
  const auto header = npy_header(type, std::vector<index_t>(view.shape().begin(), view.shape().end()), label);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  constexpr std::size_t chunk = 1 << 16;
  std::vector<std::byte> bytes(chunk * size_of(type));
  const auto count = static_cast<std::size_t>(view.size());
  for (std::size_t begin = 0; begin < count; begin += chunk) {
    const std::size_t n = std::min(chunk, count - begin);
    encode_values(type, view.data() + begin, n, bytes.data());
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(n * size_of(type)));
  }
}

inline void write_npy(const std::filesystem::path& path, const stored_tensor& t) {
  write_atomically(path, "write_npy", [&](std::ostream& out) { write_npy_to(out, t, path.string()); });
}

}  // namespace difftx::io
