// Whole files in and out. A file is read all at once; it is written all at
// once or not at all: the bytes go to a temporary file in the same folder,
// which is renamed over the target only when complete, so a failure (full
// disk, bad path, exception) never leaves a half-written file.
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "difftx/core/checks.hpp"

namespace difftx::io {

// Every byte of a regular file; `where` names the reader in the error.
inline std::vector<std::byte> read_file_bytes(const std::filesystem::path& path, std::string_view where) {
  std::error_code ec;
  require(std::filesystem::is_regular_file(path, ec), where, path.string(), "a readable file",
          std::filesystem::exists(path, ec) ? "not a regular file" : "no such file");
  std::ifstream in(path, std::ios::binary);
  require(static_cast<bool>(in), where, path.string(), "a readable file", "cannot open it");
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  require(!in.bad(), where, path.string(), "a readable file", "a read error");
  std::vector<std::byte> bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

// write(std::ostream&) produces the content.
template <class Writer>
void write_atomically(const std::filesystem::path& path, std::string_view where, Writer&& write) {
  namespace fs = std::filesystem;
  const fs::path folder = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(folder, ec))
    throw input_error(std::string(where), path.string(), "a path in an existing folder",
                      "no folder " + folder.string());
  const fs::path temporary =
      folder / ("." + path.filename().string() + ".tmp" + std::to_string(std::random_device{}()));
  try {
    {
      std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
      if (!out) throw input_error(std::string(where), path.string(), "a writable file", "cannot open " + temporary.string());
      write(out);
      out.flush();
      if (!out) throw input_error(std::string(where), path.string(), "a complete write", "a write error");
    }
    fs::rename(temporary, path, ec);
    if (ec) throw input_error(std::string(where), path.string(), "a file that can be replaced", ec.message());
  } catch (...) {
    fs::remove(temporary, ec);
    throw;
  }
}

}  // namespace difftx::io
