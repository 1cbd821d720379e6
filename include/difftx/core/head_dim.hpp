// The head size D of the attention modules: a template argument fixed at
// compile time, or difftx::dynamic (as Eigen::Dynamic) to take it from the
// module's config at run time, so a checkpoint with d = 40, 48 or 80 loads
// without a rebuild. The kernels read D from the tensors' shapes either way;
// a compiled D only fixes the module's shapes and checks them early.
#pragma once

#include <string>
#include <string_view>

#include "difftx/core/checks.hpp"

namespace difftx {

inline constexpr index_t dynamic = -1;

// A module's template argument D: positive and even (interleaved RoPE pairs), or dynamic.
template <index_t D>
constexpr bool valid_head_dim = D == dynamic || (D > 0 && D % 2 == 0);

namespace detail {

// The head size a module of template argument D runs with, from its config's
// head_dim (0 = "the compiled one"). A compiled D accepts 0 or D itself;
// dynamic needs a positive even value.
template <index_t D>
index_t checked_head_dim(std::string_view module, index_t configured) {
  if constexpr (D == dynamic) {
    require(configured > 0 && configured % 2 == 0, module, "config.head_dim",
            "a positive even head size D (the module's D is difftx::dynamic)", std::to_string(configured));
    return configured;
  } else {
    require(configured == 0 || configured == D, module, "config.head_dim",
            "0 or the compiled head size D = " + std::to_string(D), std::to_string(configured));
    return D;
  }
}

}  // namespace detail
}  // namespace difftx
