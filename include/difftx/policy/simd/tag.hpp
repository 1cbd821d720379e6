// The simd policy's tag; see difftx/policy/simd.hpp.
#pragma once

#include <type_traits>

#include <Eigen/Core>

#include "difftx/core/memory.hpp"

namespace difftx::policy {

struct simd {
  static constexpr const char* name = "simd";
  // float and double compute in themselves; float16 and bfloat16 are storage
  // types whose kernels convert to float.
  template <class T>
  static constexpr bool supports = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                   std::is_same_v<T, Eigen::half> || std::is_same_v<T, Eigen::bfloat16>;
  int threads = 0;  // OpenMP threads for every kernel; 0 means omp_get_max_threads()
  memory_resource& memory() const noexcept { return host_memory(); }
};

}  // namespace difftx::policy
