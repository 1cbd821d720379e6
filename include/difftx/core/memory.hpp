// Where tensor memory lives and who allocates it.
//
// The core knows only "host" and "device"; a policy that owns device memory
// (policy::cuda) brings its own memory_resource, so nothing here includes a
// CUDA header.
#pragma once

#include <cstddef>
#include <cstring>
#include <new>

namespace difftx {

enum class memory_space { host, device };

constexpr const char* to_string(memory_space s) noexcept { return s == memory_space::host ? "host" : "device"; }

class memory_resource {
 public:
  virtual ~memory_resource() = default;
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* p, std::size_t bytes) noexcept = 0;
  // Byte-wise copy inside this resource's space (device-to-device on a device).
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void zero(void* p, std::size_t bytes) = 0;
  // Copies between this resource's memory and host memory.
  virtual void upload(void* dst, const void* host_src, std::size_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, std::size_t bytes) = 0;
  virtual memory_space space() const noexcept = 0;
};

// Host memory aligned for the widest SIMD loads (AVX-512) and cache lines.
class host_memory_resource final : public memory_resource {
 public:
  static constexpr std::size_t alignment = 64;
  void* allocate(std::size_t bytes) override { return ::operator new(bytes, std::align_val_t{alignment}); }
  void deallocate(void* p, std::size_t) noexcept override { ::operator delete(p, std::align_val_t{alignment}); }
  void copy(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  void zero(void* p, std::size_t bytes) override { std::memset(p, 0, bytes); }
  void upload(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  memory_space space() const noexcept override { return memory_space::host; }
};

inline memory_resource& host_memory() noexcept {
  static host_memory_resource resource;
  return resource;
}

}  // namespace difftx
