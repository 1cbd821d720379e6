// Where tensor memory lives and who allocates it.
//
// The core knows only "host" and "device"; a policy that owns device memory
// (policy::cuda) brings its own memory_resource, so nothing here includes a
// CUDA header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <list>
#include <mutex>
#include <new>

#if __has_include(<sys/mman.h>)
#include <sys/mman.h>
#include <unistd.h>
#define DIFFTX_HOST_PAGES 1
#else
#define DIFFTX_HOST_PAGES 0
#endif

namespace difftx {

enum class memory_space { host, device };

constexpr const char* to_string(memory_space s) noexcept { return s == memory_space::host ? "host" : "device"; }

class memory_resource {
 public:
  virtual ~memory_resource() = default;
  virtual void* allocate(std::size_t bytes) = 0;
  // Memory whose bytes are all zero; a resource that can get zeroed memory
  // for free (fresh pages from the OS) overrides this.
  virtual void* allocate_zeroed(std::size_t bytes) {
    void* p = allocate(bytes);
    zero(p, bytes);
    return p;
  }
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
// bytes in all (the oldest freed leave first when a new one needs room), and
// handed to the next allocation of exactly the same size. A training step
// frees and reallocates the same backward temporaries on every call; given
// back to the C library, they return to the OS (glibc trims its heap) and come
// back as fresh pages that fault in one at a time on first touch, inside the
// serial zeroing of a new Tensor. At a small layer (B 8, N 128, C 128) that
// was a fifth of the calling thread's time on 2 threads. set_cache_limit(0)
// turns the reuse off and frees what is kept (for a process that wants freed
// memory back at once, or a run under Valgrind). Builds under Address, HWAddress
// or Memory sanitizer never reuse, so a use after free is still reported.
//
// Blocks of page_threshold bytes or more come straight from the OS as fresh
// pages (POSIX mmap), which are zero and take no memory until first written:
// a zeroed tensor that is never written (the gradients of a model loaded only
// for inference) costs no resident memory, and zeroing a large tensor costs
// no pass over it. They start on a 2 MiB boundary and ask for huge pages
// (huge_page_block).
class host_memory_resource final : public memory_resource {
 public:
  static constexpr std::size_t alignment = 64;
  static constexpr std::size_t reuse_threshold = std::size_t{64} << 10;
  static constexpr std::size_t default_cache_limit = std::size_t{256} << 20;
  static constexpr std::size_t page_threshold = std::size_t{4} << 20;
  static constexpr std::size_t huge_page = std::size_t{2} << 20;

  host_memory_resource() = default;
  host_memory_resource(const host_memory_resource&) = delete;
  host_memory_resource& operator=(const host_memory_resource&) = delete;
  ~host_memory_resource() override { set_cache_limit(0); }

  void* allocate(std::size_t bytes) override {
    if (void* kept = take_kept(bytes)) return kept;
    return fresh(bytes);
  }
  void* allocate_zeroed(std::size_t bytes) override {
    if (void* kept = take_kept(bytes)) {
      std::memset(kept, 0, bytes);
      return kept;
    }
    void* p = fresh(bytes);
    if (!from_pages(bytes)) std::memset(p, 0, bytes);
    return p;
  }
  // bytes must be what allocate was asked for: a kept block is handed out by it.
  void deallocate(void* p, std::size_t bytes) noexcept override {
    if (!keep(p, bytes)) free_block(p, bytes);
  }
  void copy(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  void zero(void* p, std::size_t bytes) override { std::memset(p, 0, bytes); }
  void upload(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  memory_space space() const noexcept override { return memory_space::host; }

  // The most freed memory kept for reuse (default 256 MiB); lowering it frees
  // the oldest kept blocks until the rest fits.
  std::size_t cache_limit() const noexcept {
    std::lock_guard lock(mutex_);
    return limit_;
  }
  void set_cache_limit(std::size_t bytes) noexcept {
    std::lock_guard lock(mutex_);
    limit_ = bytes;
    evict_to(limit_);
  }
  std::size_t kept_bytes() const noexcept {
    std::lock_guard lock(mutex_);
    return kept_bytes_;
  }

  // False under the sanitizers that report a use after free.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_HWADDRESS__)
  static constexpr bool reuses_freed_blocks = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(hwaddress_sanitizer) || __has_feature(memory_sanitizer)
  static constexpr bool reuses_freed_blocks = false;
#else
  static constexpr bool reuses_freed_blocks = true;
#endif
#else
  static constexpr bool reuses_freed_blocks = true;
#endif

 private:
  struct block {
    std::size_t bytes;
    void* p;
  };

  static constexpr bool from_pages(std::size_t bytes) noexcept { return DIFFTX_HOST_PAGES && bytes >= page_threshold; }
  void* fresh(std::size_t bytes) {
    try {
      return fresh_block(bytes);
    } catch (const std::bad_alloc&) {
      release_kept();  // what is kept may be what the allocation lacks
      return fresh_block(bytes);
    }
  }
  static void* fresh_block(std::size_t bytes) {
#if DIFFTX_HOST_PAGES
    if (from_pages(bytes)) return huge_page_block(bytes);
#endif
    return ::operator new(bytes, std::align_val_t{alignment});
  }
#if DIFFTX_HOST_PAGES
  // Fresh pages starting on a huge-page boundary, asked to be huge pages
  // (Linux's transparent huge pages, where they are enabled or on request):
  // a decode step streams all of a model's weights, and on 4 KiB pages that
  // is a page-table walk every 4 KiB (each row of a 2048-wide bfloat16 weight).
  static void* huge_page_block(std::size_t bytes) {
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::size_t length = (bytes + page - 1) / page * page, span = length + huge_page;
    void* mapped = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) throw std::bad_alloc();
    char* const first = static_cast<char*>(mapped);
    char* const start = first + (huge_page - reinterpret_cast<std::uintptr_t>(first) % huge_page) % huge_page;
    if (start > first) ::munmap(first, static_cast<std::size_t>(start - first));  // the unaligned head
    if (first + span > start + length) ::munmap(start + length, static_cast<std::size_t>(first + span - start - length));
#if defined(MADV_HUGEPAGE)
    ::madvise(start, length, MADV_HUGEPAGE);  // a hint: refused, the block is still good
#endif
    return start;
  }
#endif
  static void free_block(void* p, std::size_t bytes) noexcept {
#if DIFFTX_HOST_PAGES
    if (from_pages(bytes)) {
      ::munmap(p, bytes);
      return;
    }
#endif
    ::operator delete(p, std::align_val_t{alignment});
  }

  void* take_kept(std::size_t bytes) noexcept {
    if (!reuses_freed_blocks || bytes < reuse_threshold) return nullptr;
    std::lock_guard lock(mutex_);
    // The most recently freed first: it is the likeliest still in cache.
    for (auto it = kept_.rbegin(); it != kept_.rend(); ++it)
      if (it->bytes == bytes) {
        void* p = it->p;
        kept_bytes_ -= bytes;
        kept_.erase(std::next(it).base());
        return p;
      }
    return nullptr;
  }
  bool keep(void* p, std::size_t bytes) noexcept {
    if (!reuses_freed_blocks || !p || bytes < reuse_threshold) return false;
    std::lock_guard lock(mutex_);
    if (bytes > limit_) return false;
    evict_to(limit_ - bytes);
    try {
      kept_.push_back({bytes, p});
    } catch (...) {  // no memory for the list's node: give the block back instead
      return false;
    }
    kept_bytes_ += bytes;
    return true;
  }
  // Frees the oldest kept blocks until at most `bytes` are kept; the caller holds the lock.
  void evict_to(std::size_t bytes) noexcept {
    while (kept_bytes_ > bytes) {
      kept_bytes_ -= kept_.front().bytes;
      free_block(kept_.front().p, kept_.front().bytes);
      kept_.pop_front();
    }
  }
  void release_kept() noexcept {
    std::lock_guard lock(mutex_);
    evict_to(0);
  }

  mutable std::mutex mutex_;
  std::list<block> kept_;  // oldest freed first
  std::size_t kept_bytes_ = 0, limit_ = default_cache_limit;
};

// Never destroyed: a static object that outlives this function's own static
// may still free host tensors at exit.
inline host_memory_resource& host_memory() noexcept {
  static host_memory_resource* const resource = new host_memory_resource;
  return *resource;
}

}  // namespace difftx
