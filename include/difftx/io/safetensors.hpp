// safetensors read/write as a tensor_file: every tensor copied into memory.
// The header is read and checked by read_safetensors_layout (see
// safetensors_layout.hpp for the format and its rules); tensors in a dtype
// difftx does not decode are listed in tensor_file::undecodable, so a file
// that holds I64 or U8 tensors beside its weights reads, and only asking for
// one of those fails. mapped_safetensors reads the same files without the copy.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "difftx/io/atomic_file.hpp"
#include "difftx/io/safetensors_layout.hpp"
#include "difftx/io/tensor_file.hpp"

namespace difftx::io {

inline tensor_file parse_safetensors(std::span<const std::byte> bytes, const std::string& label) {
  auto layout = read_safetensors_layout(bytes, label);
  tensor_file file;
  file.metadata = std::move(layout.metadata);
  for (auto& [name, entry] : layout.tensors) {
    if (!entry.type) {
      file.undecodable.emplace(name, std::move(entry.dtype_name));
      continue;
    }
    const auto data = bytes.subspan(entry.offset, entry.size);
    file.tensors.emplace(name, stored_tensor{*entry.type, std::move(entry.shape), {data.begin(), data.end()}});
  }
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
