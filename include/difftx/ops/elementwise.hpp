// Elementwise helpers the modules compose with (residual adds, copies).
//   add_into : y[...] += x[...]
//   copy_into: y[...]  = x[...]
#pragma once

#include "difftx/ops/common.hpp"

namespace difftx::detail {

template <class X, class Y>
void check_same_shape(std::string_view where, memory_space space, const X& x, const Y& y) {
  require_shape(where, "y", y, x.shape());
  require_all_in(where, space, {{"x", x.space()}, {"y", y.space()}});
}

}  // namespace difftx::detail
