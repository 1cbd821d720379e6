// The reference policy's tag; see difftx/policy/reference.hpp.
#pragma once

#include "difftx/core/memory.hpp"
#include "difftx/core/scalar_traits.hpp"

namespace difftx::policy {

struct reference {
  static constexpr const char* name = "reference";
  template <class T>
  static constexpr bool supports = Scalar<T>;
  // Low-bit inference (docs/semantics.md): attention-logit quantization, int8
  // key/value caches and int8 weights.
  static constexpr bool low_bit = true;
  memory_resource& memory() const noexcept { return host_memory(); }
};

}  // namespace difftx::policy
