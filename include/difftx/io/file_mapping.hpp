// A whole file mapped into memory read-only (POSIX mmap, PROT_READ,
// MAP_PRIVATE). Nothing is read when it is made: the kernel reads a page when
// it is first touched, so a reader that looks at a few tensors of a large
// checkpoint reads those and the header, and the pages stay in the page cache
// for the next process. The bytes are valid while the mapping lives and the
// file keeps its length: a page that a truncation removed raises SIGBUS when
// touched, as with any mapping, so the file must not change while it is mapped.
#pragma once

#if !__has_include(<sys/mman.h>)
#error "difftx/io/file_mapping.hpp (mapped_safetensors) needs POSIX mmap; read_safetensors reads without it"
#endif

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "difftx/io/atomic_file.hpp"

namespace difftx::io {

class file_mapping {
 public:
  // Maps the regular file at path; `where` names the reader in the
  // input_error thrown when it cannot (no such file, not a regular file,
  // cannot open or map it). An empty file maps to no bytes (mmap cannot map 0).
  file_mapping(const std::filesystem::path& path, std::string_view where) {
    require_regular_file(path, where);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    require(fd >= 0, where, path.string(), "a readable file", "cannot open it");
    struct ::stat status {};
    if (::fstat(fd, &status) != 0 || !S_ISREG(status.st_mode)) {
      ::close(fd);
      throw input_error(std::string(where), path.string(), "a readable file", "not a regular file");
    }
    size_ = static_cast<std::size_t>(status.st_size);
    void* data = size_ == 0 ? nullptr : ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int error = errno;
    ::close(fd);  // the mapping keeps the file open
    if (data == MAP_FAILED)
      throw input_error(std::string(where), path.string(), "a file that can be mapped into memory", std::strerror(error));
    data_ = static_cast<const std::byte*>(data);
  }
  file_mapping(file_mapping&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  file_mapping& operator=(file_mapping&& other) noexcept {
    if (this != &other) {
      unmap();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  file_mapping(const file_mapping&) = delete;
  file_mapping& operator=(const file_mapping&) = delete;
  ~file_mapping() { unmap(); }

  std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }

  // Gives back the pages wholly inside `part` (nothing unless part lies in bytes()): they leave
  // this process's resident memory, stay in the page cache, and are read
  // again if touched. A loader calls it for each tensor it has decoded, so
  // loading a checkpoint holds the model's memory, not the model's and the
  // file's.
  void release(std::span<const std::byte> part) const noexcept {
    if (part.empty() || part.data() < data_ || part.data() + part.size() > data_ + size_) return;
    const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
    const auto begin = (reinterpret_cast<std::uintptr_t>(part.data()) + page - 1) / page * page;
    const auto end = (reinterpret_cast<std::uintptr_t>(part.data()) + part.size()) / page * page;
    if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
  }

 private:
  void unmap() noexcept {
    if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
  }
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace difftx::io
