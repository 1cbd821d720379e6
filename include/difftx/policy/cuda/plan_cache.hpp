// Plans built once per shape and kept: cuBLASLt's matrix-product descriptors
// with the algorithm its heuristic picked (matmul_plan, context.cuh). Building one is
// a host-side query of tens of microseconds, as long as a small product runs
// on the GPU, so rebuilding it on every call showed in decoding and at small
// layers. Host code only, no CUDA header: tested without a GPU.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

namespace difftx::cuda_detail {

// Key -> shared_ptr<const Plan>, built by the caller's function the first time
// a key is asked for. Shared by every policy on a context (threads may ask
// at once); a plan handed out stays valid while its holder keeps it, even
// after the cache drops it. Past `capacity` plans (a server whose prompt
// lengths all differ) the cache starts again from empty rather than grow
// without bound.
template <class Key, class Plan>
class plan_cache {
 public:
  explicit plan_cache(std::size_t capacity = 4096) : capacity_(capacity) {}

  template <class Build>
  std::shared_ptr<const Plan> get(const Key& key, Build&& build) {
    {
      std::lock_guard lock(mutex_);
      if (auto it = plans_.find(key); it != plans_.end()) return it->second;
    }
    // Built outside the lock (it may take long); if two threads build the
    // same key at once, the first one stored is kept and both use it.
    std::shared_ptr<const Plan> built = build();
    std::lock_guard lock(mutex_);
    if (plans_.size() >= capacity_) plans_.clear();
    return plans_.try_emplace(key, std::move(built)).first->second;
  }

  std::size_t size() const {
    std::lock_guard lock(mutex_);
    return plans_.size();
  }

 private:
  std::size_t capacity_;
  mutable std::mutex mutex_;
  std::map<Key, std::shared_ptr<const Plan>> plans_;
};

}  // namespace difftx::cuda_detail
