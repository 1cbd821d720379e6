// safetensors read/write (https://github.com/huggingface/safetensors format):
// u64 little-endian header size n, n bytes of JSON, then the data. The header
// maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets into the data) and may hold "__metadata__": {string: string}.
// Reading checks everything a malformed or hostile file can get wrong and
// throws input_error naming the file and the tensor.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

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
  const auto* header_begin = reinterpret_cast<const char*>(bytes.data() + 8);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_begin, header_begin + header_size);
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
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
      fail(name, "an object with dtype, shape and data_offsets", entry.dump());
    const auto& type_json = entry["dtype"];
    const auto type = type_json.is_string() ? parse_safetensors_dtype(type_json.get<std::string>()) : std::nullopt;
    if (!type) fail(name, "dtype F64, F32, F16 or BF16", type_json.dump());
    stored_tensor t;
    t.type = *type;
    const auto& shape = entry["shape"];
    if (!shape.is_array()) fail(name, "a shape array", shape.dump());
    std::uint64_t count = 1;
    for (const auto& e : shape) {
      if (!e.is_number_unsigned() || e.get<std::uint64_t>() > (std::uint64_t{1} << 40))
        fail(name, "non-negative dimensions", shape.dump());
      t.shape.push_back(static_cast<index_t>(e.get<std::uint64_t>()));
      count *= e.get<std::uint64_t>();
      if (count > (std::uint64_t{1} << 40)) fail(name, "a tensor of at most 2^40 elements", shape.dump());
    }
    const auto& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      fail(name, "data_offsets [begin, end]", offsets.dump());
    const auto begin = offsets[0].get<std::uint64_t>(), end = offsets[1].get<std::uint64_t>();
    if (begin > end || end > data_size)
      fail(name, "data_offsets within the " + std::to_string(data_size) + " data bytes", offsets.dump());
    if (end - begin != count * size_of(t.type))
      fail(name, std::to_string(count * size_of(t.type)) + " bytes for shape " + shape.dump() + " of " +
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

inline std::vector<std::byte> serialise_safetensors(const tensor_file& file) {
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
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned
  std::vector<std::byte> bytes(8 + text.size());
  const std::uint64_t n = text.size();
  std::memcpy(bytes.data(), &n, 8);
  std::memcpy(bytes.data() + 8, text.data(), text.size());
  for (const auto& [name, t] : file.tensors) bytes.insert(bytes.end(), t.bytes.begin(), t.bytes.end());
  return bytes;
}

inline void write_safetensors(const std::filesystem::path& path, const tensor_file& file) {
  const auto bytes = serialise_safetensors(file);
  write_atomically(path, "write_safetensors", [&](std::ostream& out) {
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  });
}

}  // namespace difftx::io
