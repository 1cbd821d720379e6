// Where tensor memory lives and who allocates it.
//
// The core knows only "host" and "device"; a policy that owns device memory
// (policy::cuda) brings its own memory_resource, so nothing here includes a
// CUDA header.
#pragma once

#include <cstddef>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
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
//
// Freed blocks of reuse_threshold bytes or more are kept, up to cache_limit()
// bytes in all, and handed to the next allocation of exactly the same size.
// A training step frees and reallocates the same backward temporaries on
// every call; given back to the C library, they return to the OS (glibc trims
// its heap) and come back as fresh pages that fault in one at a time on first
// touch, inside the serial zeroing of a new Tensor. At a small layer (B 8,
// N 128, C 128) that was a fifth of the calling thread's time on 2 threads.
// set_cache_limit(0) turns the reuse off and frees what is kept. Builds under
// AddressSanitizer never reuse, so a use after free is still reported.
class host_memory_resource final : public memory_resource {
 public:
  static constexpr std::size_t alignment = 64;
  static constexpr std::size_t reuse_threshold = std::size_t{64} << 10;

  host_memory_resource() = default;
  host_memory_resource(const host_memory_resource&) = delete;
  host_memory_resource& operator=(const host_memory_resource&) = delete;
  ~host_memory_resource() override { set_cache_limit(0); }

  void* allocate(std::size_t bytes) override {
    if (void* kept = take_kept(bytes)) return kept;
    try {
      return ::operator new(bytes, std::align_val_t{alignment});
    } catch (const std::bad_alloc&) {
      release_kept();  // what is kept may be what the allocation lacks
      return ::operator new(bytes, std::align_val_t{alignment});
    }
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    if (!keep(p, bytes)) ::operator delete(p, std::align_val_t{alignment});
  }
  void copy(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  void zero(void* p, std::size_t bytes) override { std::memset(p, 0, bytes); }
  void upload(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  memory_space space() const noexcept override { return memory_space::host; }

  // The most freed memory kept for reuse (default 1 GiB); lowering it frees
  // kept blocks until the rest fits.
  std::size_t cache_limit() const noexcept {
    std::lock_guard lock(mutex_);
    return limit_;
  }
  void set_cache_limit(std::size_t bytes) noexcept {
    std::lock_guard lock(mutex_);
    limit_ = bytes;
    while (kept_bytes_ > limit_) {
      const auto last = std::prev(kept_.end());  // the largest first
      kept_bytes_ -= last->first;
      ::operator delete(last->second, std::align_val_t{alignment});
      kept_.erase(last);
    }
  }
  std::size_t kept_bytes() const noexcept {
    std::lock_guard lock(mutex_);
    return kept_bytes_;
  }

 // False under AddressSanitizer.
#if defined(__SANITIZE_ADDRESS__)
  static constexpr bool reuses_freed_blocks = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  static constexpr bool reuses_freed_blocks = false;
#else
  static constexpr bool reuses_freed_blocks = true;
#endif
#else
  static constexpr bool reuses_freed_blocks = true;
#endif

 private:
  void* take_kept(std::size_t bytes) noexcept {
    if (!reuses_freed_blocks || bytes < reuse_threshold) return nullptr;
    std::lock_guard lock(mutex_);
    const auto it = kept_.find(bytes);
    if (it == kept_.end()) return nullptr;
    void* p = it->second;
    kept_bytes_ -= bytes;
    kept_.erase(it);
    return p;
  }
  bool keep(void* p, std::size_t bytes) noexcept {
    if (!reuses_freed_blocks || bytes < reuse_threshold) return false;
    std::lock_guard lock(mutex_);
    if (kept_bytes_ + bytes > limit_) return false;
    try {
      kept_.emplace(bytes, p);
    } catch (...) {  // no memory for the map's node: give the block back instead
      return false;
    }
    kept_bytes_ += bytes;
    return true;
  }
  void release_kept() noexcept {
    std::lock_guard lock(mutex_);
    for (const auto& [bytes, p] : kept_) ::operator delete(p, std::align_val_t{alignment});
    kept_.clear();
    kept_bytes_ = 0;
  }

  mutable std::mutex mutex_;
  std::multimap<std::size_t, void*> kept_;  // freed blocks by size
  std::size_t kept_bytes_ = 0, limit_ = std::size_t{1} << 30;
};

inline host_memory_resource& host_memory() noexcept {
  static host_memory_resource resource;
  return resource;
}

}  // namespace difftx
