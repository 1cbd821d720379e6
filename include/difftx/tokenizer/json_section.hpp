// Reading tokenizer.json: the file (at most max_file_bytes), its JSON (nested
// at most max_depth deep, checked before nlohmann parses it), and a section of
// it with its key path, so every refusal names the file and the key:
//   difftx::read_tokenizer: argument 'tokenizer.json: model.type': expected BPE, got 'WordPiece'
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "difftx/core/error.hpp"
#include "difftx/tokenizer/utf8.hpp"

namespace difftx::tokenizer {

// The largest tokenizer.json read: public ones are up to about 35 MB (Gemma's 256k vocabulary).
inline constexpr std::size_t max_file_bytes = std::size_t{256} << 20;
// The deepest nesting of objects and arrays accepted; real files nest about 8 deep.
inline constexpr int max_depth = 64;
// Ids are below this (the tool's largest count; real vocabularies are under 2^18).
inline constexpr std::int64_t max_token_id = std::int64_t{1} << 24;

namespace detail {

inline constexpr const char* read_where = "read_tokenizer";

// What a JSON value is, for a message: a string quoted (and cut), a number, or its kind.
inline std::string describe(const nlohmann::json& v) {
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    if (s.size() <= 60) return "'" + s + "'";
    std::size_t cut = 57;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0u) == 0x80u) --cut;
    return "'" + s.substr(0, cut) + "...' (" + std::to_string(s.size()) + " bytes)";
  }
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array of " + std::to_string(v.size());
  if (v.is_null()) return "null";
  return v.dump();
}

// The deepest nesting of text, scanned without parsing (strings skipped);
// throws at the first byte past max_depth.
inline void require_shallow(std::string_view text, const std::string& label) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth)
        throw input_error(read_where, label, "JSON nested at most " + std::to_string(max_depth) + " deep",
                          "depth " + std::to_string(depth) + " at byte " + std::to_string(i));
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
}

inline nlohmann::json parse_json(std::string_view text, const std::string& label) {
  if (text.size() > max_file_bytes)
    throw input_error(read_where, label, "at most " + std::to_string(max_file_bytes) + " bytes of JSON",
                      std::to_string(text.size()) + " bytes");
  require_shallow(text, label);
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    throw input_error(read_where, label, "valid JSON", e.what());
  }
}

inline std::string read_text_file(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto label = path.string();
  if (!fs::is_regular_file(path, ec))
    throw input_error(read_where, label, "a tokenizer file", fs::exists(path, ec) ? "not a regular file" : "no such file");
  const auto size = fs::file_size(path, ec);
  if (ec) throw input_error(read_where, label, "a readable file", ec.message());
  if (size > max_file_bytes)
    throw input_error(read_where, label, "at most " + std::to_string(max_file_bytes) + " bytes",
                      std::to_string(size) + " bytes");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw input_error(read_where, label, "a readable file", "cannot open it");
  std::string text(static_cast<std::size_t>(size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  if (static_cast<std::size_t>(in.gcount()) != size || in.peek() != std::ifstream::traits_type::eof())
    throw input_error(read_where, label, "a file that does not change while it is read",
                      std::to_string(in.gcount()) + " bytes where it had " + std::to_string(size));
  return text;
}

// A value of tokenizer.json and its key path ("model.merges[3]").
class json_section {
 public:
  json_section(const nlohmann::json& value, std::string file, std::string path = "")
      : value_(&value), file_(std::move(file)), path_(std::move(path)) {}

  const nlohmann::json& value() const noexcept { return *value_; }
  const std::string& path() const noexcept { return path_; }
  const std::string& file() const noexcept { return file_; }
  std::string label() const { return path_.empty() ? file_ : file_ + ": " + path_; }

  [[noreturn]] void fail(const std::string& expected, const std::string& got) const {
    throw input_error(read_where, label(), expected, got);
  }
  [[noreturn]] void fail(const std::string& expected) const { fail(expected, describe(*value_)); }

  const json_section& require_object() const {
    if (!value_->is_object()) fail("an object");
    return *this;
  }
  // The value at key; absent or null: nullopt.
  std::optional<json_section> find(std::string_view key) const {
    require_object();
    const auto it = value_->find(key);
    if (it == value_->end() || it->is_null()) return std::nullopt;
    return child(*it, path_.empty() ? std::string(key) : path_ + "." + std::string(key));
  }
  json_section at(std::string_view key) const {
    auto s = find(key);
    if (!s) child(null_value(), path_.empty() ? std::string(key) : path_ + "." + std::string(key)).fail("a value (the key is required)");
    return *s;
  }
  std::size_t size() const {
    if (!value_->is_array()) fail("an array");
    return value_->size();
  }
  json_section operator[](std::size_t i) const { return child((*value_)[i], path_ + "[" + std::to_string(i) + "]"); }

  const std::string& string() const {
    if (!value_->is_string()) fail("a string");
    return value_->get_ref<const std::string&>();
  }
  bool boolean() const {
    if (!value_->is_boolean()) fail("true or false");
    return value_->get<bool>();
  }
  std::int64_t integer(std::int64_t low, std::int64_t high) const {
    bool ok = false;
    if (value_->is_number_unsigned()) {  // nlohmann reads every non-negative whole number as unsigned
      const auto v = value_->get<std::uint64_t>();
      ok = high >= 0 && v <= static_cast<std::uint64_t>(high) && (low <= 0 || v >= static_cast<std::uint64_t>(low));
    } else if (value_->is_number_integer()) {
      const auto v = value_->get<std::int64_t>();
      ok = v >= low && v <= high;
    }
    if (!ok) fail("a whole number in [" + std::to_string(low) + ", " + std::to_string(high) + "]");
    return value_->get<std::int64_t>();
  }
  // A string of exactly one character (Metaspace's replacement, Strip's content).
  char32_t character() const {
    const auto& s = string();
    if (s.empty() || utf8::char_length(s[0]) != s.size()) fail("one character");
    return utf8::decode_at(s, 0);
  }
  // key's flag, or otherwise when absent or null.
  bool flag(std::string_view key, bool otherwise) const {
    const auto s = find(key);
    return s ? s->boolean() : otherwise;
  }
  // The "type" key, which names the kind of a normalizer, pre-tokenizer, model, ...
  const std::string& type() const { return at("type").string(); }
  [[noreturn]] void unsupported(const std::string& supported) const {
    const auto t = at("type");
    t.fail(supported, describe(t.value()));
  }

 private:
  json_section child(const nlohmann::json& v, std::string path) const { return json_section(v, file_, std::move(path)); }
  static const nlohmann::json& null_value() {
    static const nlohmann::json null;
    return null;
  }
  const nlohmann::json* value_;
  std::string file_, path_;
};

// The parts section s describes, in order: make(s) for one; for a "Sequence",
// the parts of each entry of its list (under list_key), flattened, since a
// sequence of steps applies them one after the other, nested or not.
template <class Part, class Make>
void add_parts(const json_section& s, const char* list_key, const Make& make, std::vector<std::unique_ptr<Part>>& out) {
  if (s.type() != "Sequence") {
    out.push_back(make(s));
    return;
  }
  const auto list = s.at(list_key);
  for (std::size_t i = 0; i < list.size(); ++i) add_parts(list[i].require_object(), list_key, make, out);
}
template <class Part, class Make>
std::vector<std::unique_ptr<Part>> parts_of(const json_section& s, const char* list_key, const Make& make) {
  std::vector<std::unique_ptr<Part>> out;
  add_parts(s.require_object(), list_key, make, out);
  return out;
}

}  // namespace detail
}  // namespace difftx::tokenizer
