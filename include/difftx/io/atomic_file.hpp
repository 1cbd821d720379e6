// Writes a file all at once or not at all: the bytes go to a temporary file
// in the same folder, which is renamed over the target only when complete, so
// a failure (full disk, bad path, exception) never leaves a half-written file.
#pragma once

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <system_error>

#include "difftx/core/error.hpp"

namespace difftx::io {

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
