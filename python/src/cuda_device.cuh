// CUDA's device_traits (kernels.hpp): policy::cuda, for the cuda_<type>.cu
// units. Compiled where the library's project builds difftx::cuda; never run
// in the session that wrote it (no GPU), see docs/guide/pytorch.md.
//
// A call runs on the device of its tensors and after the work PyTorch has
// queued on its current stream, and PyTorch's later work on that stream runs
// after it: an event recorded on PyTorch's stream that the policy's stream
// waits for, and the reverse at the end. (policy::cuda runs on its context's
// own stream; the events order the two without a host synchronisation.)
#pragma once

#include <cuda_runtime.h>

#include <difftx/policy/cuda.hpp>

#include "kernels.hpp"

namespace difftx_python {

template <>
struct device_traits<cuda> {
  using policy = difftx::policy::cuda;
  static constexpr difftx::memory_space space = difftx::memory_space::device;

  // The current device set to the call's for the call's length.
  class device_guard {
   public:
    explicit device_guard(int device) {
      DIFFTX_CUDA_CHECK(cudaGetDevice(&previous_));
      DIFFTX_CUDA_CHECK(cudaSetDevice(device));
    }
    ~device_guard() { cudaSetDevice(previous_); }
    device_guard(const device_guard&) = delete;
    device_guard& operator=(const device_guard&) = delete;

   private:
    int previous_ = 0;
  };

  // `after` waits for the work queued on `before` so far.
  static void order(cudaStream_t before, cudaStream_t after) {
    if (before == after) return;
    cudaEvent_t event = nullptr;
    DIFFTX_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    DIFFTX_CUDA_CHECK(cudaEventRecord(event, before));
    DIFFTX_CUDA_CHECK(cudaStreamWaitEvent(after, event, 0));
    DIFFTX_CUDA_CHECK(cudaEventDestroy(event));  // released once the wait has passed
  }

  struct session {
    device_guard device;
    policy p;
    cudaStream_t torch_stream;
    explicit session(const execution& e)
        : device(e.device), p{}, torch_stream(reinterpret_cast<cudaStream_t>(e.stream)) {
      order(torch_stream, p.stream());
    }
    ~session() {
      try {
        order(p.stream(), torch_stream);
      } catch (...) {  // a destructor may not throw; the next call's check reports the device's error
      }
    }
    session(const session&) = delete;
    session& operator=(const session&) = delete;
  };
  static int device_of(const execution& e) { return e.device; }
};

}  // namespace difftx_python
