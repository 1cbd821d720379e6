// Linear's products in a build without oneDNN (onednn_products.hpp chooses
// this file where DIFFTX_ONEDNN is not defined): the entries of
// linear_onednn.hpp, each declining, so linear.hpp computes every product on
// difftx's own kernels. Nothing packs weights (no pack_weights), so no
// policy::simd::packed_weights is ever made.
#pragma once

#include <string>

#include "difftx/policy/simd/common.hpp"
#include "difftx/policy/simd/gemm_int8.hpp"

template <class T>
std::string difftx::policy::simd::matmul_kernel() const {
  return "";
}

namespace difftx::simd_detail {

template <class T>
bool onednn_linear_forward(const policy::simd&, cview<T, 2>, cview<T, 2>, TensorView<T, 2>,
                           const policy::simd::packed_weights* = nullptr) {
  return false;
}
template <class T>
bool onednn_input_gradient(const policy::simd&, cview<T, 2>, cview<T, 2>, TensorView<T, 2>, bool) {
  return false;
}
template <class T>
bool onednn_weight_gradient(const policy::simd&, cview<T, 2>, cview<T, 2>, TensorView<T, 2>) {
  return false;
}
template <class A, class Store>
bool onednn_int8_products(const policy::simd&, const int8_rows<A>&, const int8_rows<A>&, Store&&,
                          const policy::simd::packed_weights* = nullptr) {
  return false;
}

}  // namespace difftx::simd_detail
