// fork(threads, f): how the simd kernels run their parallel parts, f(t, n)
// for t < n: on the step_team the calling thread leads, or else in an
// OpenMP region of their own.
//
// A decode step of a 16-layer model runs about 80 parallel parts of a few
// hundred microseconds each (its products, its attention). With
// OMP_WAIT_POLICY=passive, libgomp's threads sleep between regions, and each
// region pays for waking them (the futex, the scheduler, a halted vCPU):
// docs/benchmarks.md counts what that cost a step. A step_team holds a step's
// threads in one OpenMP region instead; between parts they spin for a short
// while and only then sleep, so a step wakes them once, and the regions of
// one thread (a decoded token's norm, RoPE or quantization) are plain calls.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <mutex>
#include <utility>

#include "difftx/core/tensor.hpp"
#include "difftx/core/x86_intrinsics.hpp"
#if defined(_OPENMP)
#include <omp.h>
#endif

namespace difftx::simd_detail {

// The items [begin, end) of `count` that part t of n takes, in order.
inline std::pair<index_t, index_t> share_of(index_t count, int t, int n) noexcept {
  return {count * t / n, count * (t + 1) / n};
}

class step_team {
 public:
  // How long a thread spins for a change before it sleeps in the atomic's
  // wait: longer than the gaps between a step's parts (the calling thread's
  // serial work between them, microseconds), short against the idle time of
  // a step's end (sampling, the caller's own work).
  static constexpr auto spin_budget = std::chrono::microseconds(100);

  explicit step_team(int size) noexcept : size_(size) {}
  step_team(const step_team&) = delete;
  step_team& operator=(const step_team&) = delete;

  int size() const noexcept { return size_; }
  // The team the calling thread leads, if any, and not inside one of its parts.
  static step_team* led_here() noexcept {
    step_team* team = lead();
    return team && !team->in_part_ ? team : nullptr;
  }

  // Runs lead_work() on the calling thread with the team led from it, and
  // serve() on every other thread of an OpenMP region of size() threads; an
  // exception from either reaches the caller once the region has ended.
  template <class Work>
  static void hold(int size, Work&& lead_work) {
    step_team team(size);
#if defined(_OPENMP)
#pragma omp parallel num_threads(size)
    {
      if (omp_get_thread_num() == 0) {
        team.size_ = omp_get_num_threads();  // libgomp may give fewer threads than asked for
        team.lead_and_stop(lead_work);
      } else {
        team.serve(omp_get_thread_num());
      }
    }
#else
    team.size_ = 1;
    team.lead_and_stop(lead_work);
#endif
    if (team.error_) std::rethrow_exception(team.error_);
  }

  // f(t, n) for t < n ≤ size(), part 0 on the calling thread (the lead);
  // returns when every part has, rethrowing the first exception of any.
  template <class F>
  void run(int n, F& f) {
    job_ = {&call<F>, &f, n};
    pending_.store(size_ - 1, std::memory_order_relaxed);  // every thread acknowledges, parts or not
    publish();
    in_part_ = true;
    try {
      f(0, n);
    } catch (...) {
      record(std::current_exception());
    }
    in_part_ = false;
    for (int left; (left = pending_.load(std::memory_order_acquire)) != 0;) await_change(pending_, left);
    if (error_) {
      std::exception_ptr error = std::exchange(error_, nullptr);
      std::rethrow_exception(error);
    }
  }

 private:
  struct job {
    void (*call)(void*, int, int) = nullptr;
    void* f = nullptr;
    int n = 0;
  };
  template <class F>
  static void call(void* f, int t, int n) {
    (*static_cast<F*>(f))(t, n);
  }
  static step_team*& lead() noexcept {
    thread_local step_team* team = nullptr;
    return team;
  }

  // Waits until `value` is no longer `old`: spinning for spin_budget, then asleep.
  template <class Value>
  static void await_change(const std::atomic<Value>& value, Value old) noexcept {
    const auto start = std::chrono::steady_clock::now();
    for (unsigned spins = 1; value.load(std::memory_order_acquire) == old; ++spins) {
#if defined(__x86_64__) || defined(__i386__)
      _mm_pause();
#endif
      if (spins % 256 == 0 && std::chrono::steady_clock::now() - start > spin_budget) {
        value.wait(old, std::memory_order_acquire);
        return;
      }
    }
  }

  void publish() noexcept {
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
  }
  void record(std::exception_ptr error) {
    const std::lock_guard<std::mutex> hold(error_mutex_);
    if (!error_) error_ = std::move(error);
  }

  template <class Work>
  void lead_and_stop(Work& lead_work) {
    lead() = this;
    try {
      lead_work();
    } catch (...) {
      record(std::current_exception());
    }
    lead() = nullptr;
    job_ = {};  // n = 0: the threads leave serve()
    publish();
  }

  // A thread other than the lead: each job's part t (if t < n) until a job of no parts.
  void serve(int t) noexcept {
    std::uint32_t seen = 0;
    for (;;) {
      await_change(generation_, seen);
      seen = generation_.load(std::memory_order_acquire);
      const job work = job_;
      if (work.n == 0) return;
      if (t < work.n) {
        try {
          work.call(work.f, t, work.n);
        } catch (...) {
          record(std::current_exception());
        }
      }
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
  }

  int size_;
  job job_;
  bool in_part_ = false;
  std::exception_ptr error_;
  std::mutex error_mutex_;
  alignas(64) std::atomic<std::uint32_t> generation_{0};  // one more per job
  alignas(64) std::atomic<int> pending_{0};               // threads yet to finish the job
};

// f(t, n) for t < n on `threads` threads (n may be fewer): on the team the
// calling thread leads, else in an OpenMP region; one thread calls f(0, 1).
template <class F>
void fork(int threads, F&& f) {
  if (threads <= 1) return f(0, 1);
  if (step_team* team = step_team::led_here()) return team->run(std::min(threads, team->size()), f);
#if defined(_OPENMP)
#pragma omp parallel num_threads(threads)
  f(omp_get_thread_num(), omp_get_num_threads());
#else
  f(0, 1);
#endif
}

}  // namespace difftx::simd_detail
