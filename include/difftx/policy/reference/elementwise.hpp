// Reference elementwise helpers (difftx/ops/elementwise.hpp).
#pragma once

#include <algorithm>

#include "difftx/ops/elementwise.hpp"
#include "difftx/policy/reference/tag.hpp"

namespace difftx {

// y += x, any rank
template <Scalar T, std::size_t R>
void add_into(const policy::reference&, cview<T, R> x, TensorView<T, R> y) {
  detail::check_same_shape("add_into", memory_space::host, x, y);
  for (index_t i = 0; i < x.size(); ++i) y.data()[i] = store<T>(load(y.data()[i]) + load(x.data()[i]));
}

// y = x, any rank
template <Scalar T, std::size_t R>
void copy_into(const policy::reference&, cview<T, R> x, TensorView<T, R> y) {
  detail::check_same_shape("copy_into", memory_space::host, x, y);
  std::copy_n(x.data(), x.size(), y.data());
}

}  // namespace difftx
