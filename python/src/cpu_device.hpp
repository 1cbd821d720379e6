// The CPU's device_traits (kernels.hpp): policy::simd on the caller's thread
// count (PyTorch's torch.get_num_threads()); nothing to order.
#pragma once

#include <difftx/policy/simd.hpp>

#include "kernels.hpp"

template <>
struct difftx_python::device_traits<difftx_python::cpu> {
  using policy = difftx::policy::simd;
  static constexpr difftx::memory_space space = difftx::memory_space::host;
  struct session {
    policy p;
    explicit session(const execution& e) : p{e.threads} {}
  };
  static int device_of(const execution&) { return -1; }
};
