// Differential attention V2's head combination (docs/semantics.md, "V2"):
// output head i subtracts the odd query head 2i+1 from the even one 2i with a
// per-token lambda = sigmoid(z):
//   forward : a[M, 2h, D], z[M, h] -> o[M, h, D],
//             o[m, i] = a[m, 2i] - sigmoid(z[m, i]) a[m, 2i+1]
//   backward: do[M, h, D] -> da[M, 2h, D], dz[M, h] (assign), with s = sigmoid(z):
//             da[m, 2i] = do[m, i],  da[m, 2i+1] = -s do[m, i],
//             dz[m, i]  = -s (1 - s) <do[m, i], a[m, 2i+1]>
// M counts tokens (B·N); z is the lambda_proj output, before the sigmoid.
#pragma once

#include <string>

#include "difftx/ops/common.hpp"

namespace difftx::detail {

template <class A, class Z, class O>
void check_diff_heads(std::string_view where, memory_space space, const A& a, const Z& z, const O& o,
                      const char* o_name) {
  require_nonempty(where, "a", a);
  require(a.extent(1) % 2 == 0, where, "a", "an even number of query heads (pairs 2i, 2i+1)",
          std::to_string(a.extent(1)) + " heads");
  require_shape(where, "z", z, {a.extent(0), a.extent(1) / 2});
  require_shape(where, o_name, o, {a.extent(0), a.extent(1) / 2, a.extent(2)});
  require_all_in(where, space, {{"a", a.space()}, {"z", z.space()}, {o_name, o.space()}});
}

template <class A, class Z, class O, class DA, class DZ>
void check_diff_heads_backward(std::string_view where, memory_space space, const A& a, const Z& z, const O& d_o,
                               const DA& da, const DZ& dz) {
  check_diff_heads(where, space, a, z, d_o, "do");
  require_shape(where, "da", da, a.shape());
  require_shape(where, "dz", dz, z.shape());
  require_all_in(where, space, {{"da", da.space()}, {"dz", dz.space()}});
}

}  // namespace difftx::detail
