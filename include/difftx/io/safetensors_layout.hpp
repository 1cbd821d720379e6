// The one reader of safetensors headers (https://github.com/huggingface/safetensors
// format): u64 little-endian header size n, n bytes of JSON, then the data.
// The header maps each tensor name to {"dtype", "shape", "data_offsets":
// [begin, end]} (offsets into the data) and may hold "__metadata__": {string:
// string}. read_safetensors (a copy in memory) and mapped_safetensors (the
// file mapped) both start here, so both check alike and fail alike.
//
// Reading checks everything a malformed or hostile file can get wrong and
// throws input_error(where, "<label>: <tensor or part>", ...), where names the
// reader ("read_safetensors", "mapped_safetensors"). It
// follows the format's rules strictly: a header of at most 100 MB (the
// format's limit) that starts with '{', holds no NUL byte (the JSON parser
// would stop there and ignore the rest) and no name twice at any level, tensor
// entries with exactly the keys dtype, shape and data_offsets, a dtype of the
// format, and data the tensors tile exactly. Every dtype of the format is
// accepted (a checkpoint may hold I64 position ids or U8 masks beside its
// weights); difftx decodes F64, F32, F16 and BF16, and says so only when one of
// the others is asked for.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "difftx/core/sizes.hpp"
#include "difftx/io/tensor_ref.hpp"

namespace difftx::io {

// The format's element types and their widths in bits (F4 and F6 pack
// several elements into a byte; a tensor of them must fill whole bytes).
struct safetensors_dtype {
  std::string_view name;
  std::uint64_t bits;
};
inline constexpr safetensors_dtype safetensors_dtypes[] = {
    {"BOOL", 8},  {"U8", 8},   {"I8", 8},   {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"I16", 16},
    {"U16", 16},  {"F16", 16}, {"BF16", 16}, {"I32", 32},    {"U32", 32},    {"F32", 32},    {"F64", 64},
    {"I64", 64},  {"U64", 64}, {"C64", 64},  {"F4", 4},      {"F6_E2M3", 6}, {"F6_E3M2", 6}};

// One tensor as the header describes it.
struct safetensors_entry {
  std::string dtype_name;            // as the file spells it: "F32", "I64", ...
  std::optional<dtype> type;         // what difftx decodes it as; nullopt for the format's other dtypes
  std::vector<index_t> shape;
  std::size_t offset = 0, size = 0;  // its bytes: [offset, offset + size) counted from the file's first byte

  // The tensor in file, the bytes this layout was read from.
  tensor_ref ref(std::span<const std::byte> file) const noexcept {
    return {dtype_name, type, shape, file.subspan(offset, size)};
  }
};

struct safetensors_layout {
  std::map<std::string, std::string> metadata;
  std::map<std::string, safetensors_entry> tensors;
};

// The header of the safetensors file whose bytes are `file`, checked against
// the file's length; `label` (the file) and `where` (the reader) name every error.
inline safetensors_layout read_safetensors_layout(std::span<const std::byte> file, const std::string& label,
                                                  std::string_view where = "read_safetensors") {
  auto fail = [&](const std::string& what, const std::string& expected, const std::string& got) {
    throw input_error(std::string(where), label + (what.empty() ? "" : ": " + what), expected, got);
  };
  if (file.size() < 8) fail("header", "an 8-byte header size", std::to_string(file.size()) + " bytes in all");
  std::uint64_t header_size = 0;
  std::memcpy(&header_size, file.data(), 8);
  if (header_size > file.size() - 8)
    fail("header", "a header size within the file (" + std::to_string(file.size() - 8) + " bytes after it)",
         std::to_string(header_size));
  constexpr std::uint64_t max_header_size = 100'000'000;
  if (header_size > max_header_size)
    fail("header", "a header of at most " + std::to_string(max_header_size) + " bytes", std::to_string(header_size));
  const std::string_view header_text(reinterpret_cast<const char*>(file.data() + 8), header_size);
  if (header_text.empty() || header_text.front() != '{')
    fail("header", "JSON starting with '{'", header_text.empty() ? "an empty header" : "another first byte");
  if (const auto nul = header_text.find('\0'); nul != std::string_view::npos)
    fail("header", "JSON text without NUL bytes", "a NUL byte at header offset " + std::to_string(nul));
  // Names seen so far in each open object, so a repeated name fails (JSON
  // parsers keep the last; this format gives each name one meaning).
  std::vector<std::vector<std::string>> open_objects;
  const nlohmann::json::parser_callback_t no_duplicates = [&](int, nlohmann::json::parse_event_t event,
                                                              nlohmann::json& parsed) {
    using event_t = nlohmann::json::parse_event_t;
    if (event == event_t::object_start) open_objects.emplace_back();
    if (event == event_t::object_end) open_objects.pop_back();
    if (event == event_t::key) {
      auto& names = open_objects.back();
      const auto& name = parsed.get_ref<const std::string&>();
      if (std::find(names.begin(), names.end(), name) != names.end())
        fail(name, "each name once in its object", "the name twice");
      names.push_back(name);
    }
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_text.begin(), header_text.end(), no_duplicates);
  } catch (const nlohmann::json::exception& e) {
    fail("header", "valid JSON", e.what());
  }
  if (!header.is_object()) fail("header", "a JSON object", header.type_name());

  const std::size_t data_begin = 8 + header_size, data_size = file.size() - data_begin;
  safetensors_layout layout;
  struct extent {
    std::uint64_t begin, end;
    std::string name;
  };
  std::vector<extent> extents;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(name, "an object of strings", entry.type_name());
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) fail("__metadata__." + key, "a string", value.type_name());
        layout.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object() || entry.size() != 3 || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets"))
      fail(name, "an object with exactly the keys dtype, shape and data_offsets", entry.dump());
    safetensors_entry t;
    const auto& type_json = entry["dtype"];
    const auto* format_type = std::find_if(std::begin(safetensors_dtypes), std::end(safetensors_dtypes), [&](auto d) {
      return type_json.is_string() && type_json.get_ref<const std::string&>() == d.name;
    });
    if (format_type == std::end(safetensors_dtypes)) {
      std::string names;
      for (const auto& d : safetensors_dtypes) names += (names.empty() ? "" : ", ") + std::string(d.name);
      fail(name, "a dtype of the format (" + names + ")", type_json.dump());
    }
    t.dtype_name = format_type->name;
    t.type = parse_safetensors_dtype(t.dtype_name);
    const auto& shape = entry["shape"];
    if (!shape.is_array()) fail(name, "a shape array", shape.dump());
    for (const auto& e : shape) {
      if (!e.is_number_unsigned() || e.get<std::uint64_t>() > max_tensor_elements)
        fail(name, "non-negative dimensions of at most 2^48", shape.dump());
      t.shape.push_back(static_cast<index_t>(e.get<std::uint64_t>()));
    }
    // At most 2^48 elements of at most 64 bits: the product cannot wrap.
    const auto bits_wanted = checked_element_count(t.shape, where, label + ": " + name) * format_type->bits;
    if (bits_wanted % 8 != 0)
      fail(name, "whole bytes for shape " + shape.dump() + " of " + t.dtype_name, std::to_string(bits_wanted) + " bits");
    const auto bytes_wanted = bits_wanted / 8;
    const auto& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      fail(name, "data_offsets [begin, end]", offsets.dump());
    const auto begin = offsets[0].get<std::uint64_t>(), end = offsets[1].get<std::uint64_t>();
    if (begin > end || end > data_size)
      fail(name, "data_offsets within the " + std::to_string(data_size) + " data bytes", offsets.dump());
    if (end - begin != bytes_wanted)
      fail(name, std::to_string(bytes_wanted) + " bytes for shape " + shape.dump() + " of " + t.dtype_name,
           std::to_string(end - begin) + " bytes");
    t.offset = data_begin + begin;
    t.size = end - begin;
    extents.push_back({begin, end, name});
    layout.tensors.emplace(name, std::move(t));
  }
  // Tensors must tile the data exactly: no overlap, no gap, nothing after.
  // (An empty tensor sorts before a non-empty one at the same offset.)
  std::sort(extents.begin(), extents.end(),
            [](const auto& a, const auto& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  std::uint64_t covered = 0;
  for (const auto& e : extents) {
    if (e.begin < covered) fail(e.name, "data not overlapping the previous tensor's", "offset " + std::to_string(e.begin));
    if (e.begin > covered) fail(e.name, "data right after the previous tensor's (offset " + std::to_string(covered) + ")",
                                "offset " + std::to_string(e.begin));
    covered = e.end;
  }
  if (covered != data_size)
    fail("data", std::to_string(covered) + " data bytes (what the tensors cover)", std::to_string(data_size));
  return layout;
}

}  // namespace difftx::io
