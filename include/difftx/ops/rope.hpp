// Rotary position embedding, interleaved pairs, applied in place to every
// vector of size d in x[B, N, V, d] (V vectors per token: 2h query halves or
// 2g key halves). Token n of every batch row sits at position p = offset + n.
//   forward : (x[2i], x[2i+1]) <- (x[2i] cos a - x[2i+1] sin a, x[2i] sin a + x[2i+1] cos a),
//             a = (p / factor) · theta^(-2i/d)   (factor: linear RoPE scaling, 1 by default)
//   backward: the transpose of a rotation is the rotation by -a, so dx is the
//             forward applied to dy with the angle negated (also in place).
#pragma once

#include <cmath>

#include "difftx/ops/common.hpp"

namespace difftx::detail {

template <class X>
void check_rope(std::string_view where, memory_space space, const X& x, const char* x_name, index_t offset,
                double theta, double factor) {
  require_nonempty(where, x_name, x);
  require(x.extent(3) % 2 == 0, where, x_name, "an even vector size d (interleaved pairs)",
          [&] { return "d = " + std::to_string(x.extent(3)); });
  require(offset >= 0, where, "offset", "a position offset >= 0", [&] { return std::to_string(offset); });
  require(theta > 0, where, "theta", "theta > 0", [&] { return std::to_string(theta); });
  require(factor > 0 && std::isfinite(factor), where, "factor", "a finite linear scaling factor > 0",
          [&] { return std::to_string(factor); });
  require_all_in(where, space, {{x_name, x.space()}});
}

}  // namespace difftx::detail
