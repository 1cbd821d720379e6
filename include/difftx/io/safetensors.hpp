// safetensors read/write (https://github.com/huggingface/safetensors format):
// u64 little-endian header size n, n bytes of JSON, then the data. The header
// maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets into the data) and may hold "__metadata__": {string: string}.
// Reading checks everything a malformed or hostile file can get wrong and
// throws input_error naming the file and the tensor. It follows the format's
// rules strictly: a header of at most 100 MB (the format's limit) that starts
// with '{', holds no NUL byte (the JSON parser would stop there and ignore the
// rest) and no name twice at any level, tensor entries with exactly the keys
// dtype, shape and data_offsets, and data the tensors tile exactly.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "difftx/core/sizes.hpp"
#include "difftx/io/atomic_file.hpp"
#include "difftx/io/tensor_file.hpp"

namespace difftx::io {

inline tensor_file parse_safetensors(const std::vector<std::byte>& bytes, const std::string& label) {
  constexpr std::string_view where = "read_safetensors";
  auto fail = [&](const std::string& what, const std::string& expected, const std::string& got) {
    throw input_error(std::string(where), label + (what.empty() ? "" : ": " + what), expected, got);
  };
  if (bytes.size() < 8) fail("header", "an 8-byte header size", std::to_string(bytes.size()) + " bytes in all");
  std::uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  if (header_size > bytes.size() - 8)
    fail("header", "a header size within the file (" + std::to_string(bytes.size() - 8) + " bytes after it)",
         std::to_string(header_size));
  constexpr std::uint64_t max_header_size = 100'000'000;
  if (header_size > max_header_size)
    fail("header", "a header of at most " + std::to_string(max_header_size) + " bytes", std::to_string(header_size));
  const auto* header_begin = reinterpret_cast<const char*>(bytes.data() + 8);
  const std::string_view header_text(header_begin, header_size);
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

  const std::size_t data_begin = 8 + header_size, data_size = bytes.size() - data_begin;
  tensor_file file;
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
        file.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object() || entry.size() != 3 || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets"))
      fail(name, "an object with exactly the keys dtype, shape and data_offsets", entry.dump());
    const auto& type_json = entry["dtype"];
    const auto type = type_json.is_string() ? parse_safetensors_dtype(type_json.get<std::string>()) : std::nullopt;
    if (!type) fail(name, "dtype F64, F32, F16 or BF16", type_json.dump());
    stored_tensor t;
    t.type = *type;
    const auto& shape = entry["shape"];
    if (!shape.is_array()) fail(name, "a shape array", shape.dump());
    for (const auto& e : shape) {
      if (!e.is_number_unsigned() || e.get<std::uint64_t>() > max_tensor_elements)
        fail(name, "non-negative dimensions of at most 2^48", shape.dump());
      t.shape.push_back(static_cast<index_t>(e.get<std::uint64_t>()));
    }
    const auto bytes_wanted = checked_bytes(checked_element_count(t.shape, where, label + ": " + name), size_of(t.type),
                                            where, label + ": " + name);
    const auto& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      fail(name, "data_offsets [begin, end]", offsets.dump());
    const auto begin = offsets[0].get<std::uint64_t>(), end = offsets[1].get<std::uint64_t>();
    if (begin > end || end > data_size)
      fail(name, "data_offsets within the " + std::to_string(data_size) + " data bytes", offsets.dump());
    if (end - begin != bytes_wanted)
      fail(name, std::to_string(bytes_wanted) + " bytes for shape " + shape.dump() + " of " +
                     std::string(safetensors_name(t.type)),
           std::to_string(end - begin) + " bytes");
    t.bytes.assign(bytes.begin() + static_cast<std::ptrdiff_t>(data_begin + begin),
                   bytes.begin() + static_cast<std::ptrdiff_t>(data_begin + end));
    extents.push_back({begin, end, name});
    file.tensors.emplace(name, std::move(t));
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
  return file;
}

inline tensor_file read_safetensors(const std::filesystem::path& path) {
  return parse_safetensors(read_file_bytes(path, "read_safetensors"), path.string());
}

// The 8-byte size and the JSON header for file (tensors packed in name order,
// padded with spaces so the data starts 8-byte aligned); the data follows.
inline std::string safetensors_header(const tensor_file& file) {
  nlohmann::json header = nlohmann::json::object();
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  std::uint64_t offset = 0;
  for (const auto& [name, t] : file.tensors) {  // std::map: sorted by name
    header[name] = {{"dtype", safetensors_name(t.type)},
                    {"shape", t.shape},
                    {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string size(8, '\0');
  const std::uint64_t n = text.size();
  std::memcpy(size.data(), &n, 8);
  return size + text;
}

// Writes header and data straight to the stream (no copy of the data).
inline void write_safetensors_to(std::ostream& out, const tensor_file& file) {
  const auto header = safetensors_header(file);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const auto& [name, t] : file.tensors)
    out.write(reinterpret_cast<const char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
}

inline void write_safetensors(const std::filesystem::path& path, const tensor_file& file) {
  write_atomically(path, "write_safetensors", [&](std::ostream& out) { write_safetensors_to(out, file); });
}

}  // namespace difftx::io
