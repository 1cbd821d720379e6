// Whole files in and out. A file is read all at once; files are written all
// at once or not at all: the bytes go to a temporary file in the target's
// folder, which is renamed over the target only when complete, so a failure
// (full disk, bad path, exception) never leaves a half-written file.
//
// output_files does that for several files together: every temporary is
// created before any work (so a path that cannot be written fails first),
// filled, and only when all are complete renamed over their targets.
// output_folder does it for a folder of files (a checkpoint folder): they are
// written into a temporary folder beside the target, renamed onto it when all
// are complete. remove_temporaries_on_signals() makes SIGINT, SIGTERM and
// SIGHUP remove the temporaries in flight before the process ends as the
// signal says.
#pragma once

#include <array>
#include <atomic>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "difftx/core/checks.hpp"

namespace difftx::io {

// Throws input_error naming `where` and the path unless path is a regular file.
inline void require_regular_file(const std::filesystem::path& path, std::string_view where) {
  std::error_code ec;
  require(std::filesystem::is_regular_file(path, ec), where, path.string(), "a readable file",
          std::filesystem::exists(path, ec) ? "not a regular file" : "no such file");
}

// Every byte of a regular file; `where` names the reader in the error.
inline std::vector<std::byte> read_file_bytes(const std::filesystem::path& path, std::string_view where) {
  require_regular_file(path, where);
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  require(static_cast<bool>(in), where, path.string(), "a readable file", "cannot open it");
  const auto size = static_cast<std::size_t>(in.tellg());
  std::vector<std::byte> bytes;
  try {
    bytes.resize(size);
  } catch (const std::bad_alloc&) {
    throw input_error(std::string(where), path.string(), "a file that fits in memory",
                      "input needs " + std::to_string(size) + " bytes, more than can be allocated");
  }
  in.seekg(0);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
  require(static_cast<std::size_t>(in.gcount()) == size && in.peek() == std::ifstream::traits_type::eof(), where,
          path.string(), "a file that does not change while it is read",
          std::to_string(in.gcount()) + " bytes where it had " + std::to_string(size));
  return bytes;
}

namespace detail {

// The temporaries in flight, as plain character arrays an async-signal-safe
// handler can read. A temporary whose path does not fit is simply not listed.
struct temporary_registry {
  static constexpr std::size_t slots = 64, path_capacity = 4096;
  std::array<std::atomic<bool>, slots> claimed{};  // owned by an output_files
  std::array<std::atomic<bool>, slots> visible{};  // path complete: the handler may remove it
  std::array<std::array<char, path_capacity>, slots> paths{};

  static temporary_registry& instance() noexcept {
    static temporary_registry registry;
    return registry;
  }
  // The slot now holding path, or `slots` if none was free.
  std::size_t add(const std::string& path) noexcept {
    if (path.size() >= path_capacity) return slots;
    for (std::size_t i = 0; i < slots; ++i) {
      bool expected = false;
      if (!claimed[i].compare_exchange_strong(expected, true)) continue;
      std::memcpy(paths[i].data(), path.c_str(), path.size() + 1);
      visible[i].store(true);
      return i;
    }
    return slots;
  }
  void remove(std::size_t slot) noexcept {
    if (slot >= slots) return;
    visible[slot].store(false);
    claimed[slot].store(false);
  }
};

extern "C" inline void remove_temporaries_and_reraise(int signal_number) {
  auto& registry = temporary_registry::instance();
  // Twice: a temporary folder (output_folder) can be removed once its files are.
  for (int pass = 0; pass < 2; ++pass)
    for (std::size_t i = 0; i < temporary_registry::slots; ++i)
      if (registry.visible[i].load()) std::remove(registry.paths[i].data());  // unlink(2)/rmdir(2): async-signal-safe
  std::signal(signal_number, SIG_DFL);
  std::raise(signal_number);
}

}  // namespace detail

// Installs the handler for SIGINT, SIGTERM and SIGHUP (a program's choice, so
// the library never does it on its own): temporaries in flight are removed,
// then the signal ends the process as it would have.
inline void remove_temporaries_on_signals() {
  detail::temporary_registry::instance();  // constructed now, not inside the handler
  for (int s : {SIGINT, SIGTERM, SIGHUP}) std::signal(s, detail::remove_temporaries_and_reraise);
}

class output_files {
 public:
  output_files() = default;
  output_files(const output_files&) = delete;
  output_files& operator=(const output_files&) = delete;
  ~output_files() { discard(); }

  // Creates the temporary for target now; `where` names the writer in errors.
  // Throws input_error if the folder does not exist, the temporary cannot be
  // created, or target is already an output of this set (one path, one result).
  // Returns the file's index for write().
  std::size_t add(const std::filesystem::path& target, std::string_view where) {
    namespace fs = std::filesystem;
    const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
    std::error_code ec;
    if (!fs::is_directory(folder, ec))
      throw input_error(std::string(where), target.string(), "a path in an existing folder", "no folder " + folder.string());
    if (fs::is_directory(target, ec))
      throw input_error(std::string(where), target.string(), "a file path", "a folder");
    const fs::path canonical = fs::weakly_canonical(fs::absolute(target, ec), ec);
    for (const auto& f : files_)
      if (f.canonical == canonical)
        throw input_error(std::string(where), target.string(), "a path that no other output uses",
                          "a path given for another output too");
    entry e{target, canonical, {}, std::string(where), detail::temporary_registry::slots, false};
    for (int attempt = 0; attempt < 100 && e.temporary.empty(); ++attempt) {
      // Appended piecewise: GCC 12's -Wrestrict misreads "." + string (GCC PR 105329).
      std::string name(1, '.');
      name += target.filename().string();
      name += ".tmp" + std::to_string(std::random_device{}());
      const fs::path candidate = folder / name;
      if (fs::exists(candidate, ec)) continue;
      std::ofstream create(candidate, std::ios::binary | std::ios::trunc);
      if (!create) throw input_error(e.where, target.string(), "a writable file", "cannot create " + candidate.string());
      e.temporary = std::move(candidate);
    }
    if (e.temporary.empty()) throw input_error(e.where, target.string(), "a free temporary name", "none in 100 tries");
    e.slot = detail::temporary_registry::instance().add(e.temporary.string());
    files_.push_back(std::move(e));
    return files_.size() - 1;
  }

  // Fills file `index`'s temporary: write(std::ostream&) produces the content.
  template <class Writer>
  void write(std::size_t index, Writer&& write) {
    auto& f = files_.at(index);
    std::ofstream out(f.temporary, std::ios::binary | std::ios::trunc);
    if (!out) throw input_error(f.where, f.target.string(), "a writable file", "cannot open " + f.temporary.string());
    write(out);
    out.flush();
    if (!out) throw input_error(f.where, f.target.string(), "a complete write", "a write error");
    f.written = true;
  }

  // Renames every temporary over its target; all must have been written.
  // (Renames within a folder fail only if the target changes meanwhile, e.g.
  // becomes a folder; then the outputs renamed before it stay replaced.)
  void commit() {
    for (const auto& f : files_)
      require(f.written, f.where, f.target.string(), "a written output before commit", "none written");
    for (auto& f : files_) {
      std::error_code ec;
      std::filesystem::rename(f.temporary, f.target, ec);
      if (ec) throw input_error(f.where, f.target.string(), "a file that can be replaced", ec.message());
      detail::temporary_registry::instance().remove(f.slot);
      f.temporary.clear();
    }
    files_.clear();
  }

  // Removes every temporary not yet renamed; the targets stay as they were.
  void discard() noexcept {
    for (auto& f : files_) {
      if (f.temporary.empty()) continue;
      std::error_code ec;
      std::filesystem::remove(f.temporary, ec);
      detail::temporary_registry::instance().remove(f.slot);
    }
    files_.clear();
  }

 private:
  struct entry {
    std::filesystem::path target, canonical, temporary;
    std::string where;
    std::size_t slot;
    bool written;
  };
  std::vector<entry> files_;
};

// A folder written whole or not at all: its files go into a temporary folder
// beside the target, which replaces the target (absent, or an empty folder)
// only at commit(); anything not committed is removed.
class output_folder {
 public:
  // Throws input_error naming `where` and the target unless its parent
  // folder exists, the target is absent or an empty folder, and the
  // temporary folder can be created.
  output_folder(const std::filesystem::path& target, std::string_view where) : target_(target), where_(where) {
    namespace fs = std::filesystem;
    const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
    std::error_code ec;
    if (!fs::is_directory(parent, ec))
      throw input_error(where_, target.string(), "a path in an existing folder", "no folder " + parent.string());
    if (fs::exists(target, ec) && !(fs::is_directory(target, ec) && fs::is_empty(target, ec)))
      throw input_error(where_, target.string(), "a new folder (or an empty one)",
                        fs::is_directory(target, ec) ? "a folder with files in it" : "a file");
    for (int attempt = 0; attempt < 100 && temporary_.empty(); ++attempt) {
      const fs::path candidate = parent / ("." + target.filename().string() + ".tmp" + std::to_string(std::random_device{}()));
      if (fs::create_directory(candidate, ec)) temporary_ = candidate;
    }
    if (temporary_.empty()) throw input_error(where_, target.string(), "a writable folder", "cannot create a temporary folder");
    slots_.push_back(detail::temporary_registry::instance().add(temporary_.string()));
  }
  output_folder(const output_folder&) = delete;
  output_folder& operator=(const output_folder&) = delete;
  ~output_folder() { discard(); }

  // The file `name` in the folder: write(std::ostream&) produces its content.
  template <class Writer>
  void write(const std::string& name, Writer&& write) {
    const auto path = temporary_ / name;
    slots_.push_back(detail::temporary_registry::instance().add(path.string()));
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) throw input_error(where_, (target_ / name).string(), "a writable file", "cannot create " + path.string());
    write(out);
    out.flush();
    if (!out) throw input_error(where_, (target_ / name).string(), "a complete write", "a write error");
  }

  // Renames the temporary folder onto the target.
  void commit() {
    std::error_code ec;
    std::filesystem::rename(temporary_, target_, ec);
    if (ec) throw input_error(where_, target_.string(), "a folder that can be replaced", ec.message());
    for (auto slot : slots_) detail::temporary_registry::instance().remove(slot);
    slots_.clear();
    temporary_.clear();
  }
  void discard() noexcept {
    if (temporary_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(temporary_, ec);
    for (auto slot : slots_) detail::temporary_registry::instance().remove(slot);
    slots_.clear();
    temporary_.clear();
  }

 private:
  std::filesystem::path target_, temporary_;
  std::string where_;
  std::vector<std::size_t> slots_;
};

// One file, atomically: write(std::ostream&) produces the content.
template <class Writer>
void write_atomically(const std::filesystem::path& path, std::string_view where, Writer&& write) {
  output_files files;
  files.write(files.add(path, where), std::forward<Writer>(write));
  files.commit();
}

}  // namespace difftx::io
