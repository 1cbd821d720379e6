// simd embedding lookup and its scatter-add: M row copies of C entries, next to
// the O(M·C²) projections not worth a kernel of their own; the reference loops
// run on the host data as they are.
#pragma once

#include "difftx/policy/reference/embedding.hpp"
#include "difftx/policy/simd/tag.hpp"

namespace difftx {

template <class T>
  requires supported_by<policy::simd, T>
void embedding_forward(const policy::simd&, cview<token_t, 1> tokens, TensorView<const T, 2> w, TensorView<T, 2> y) {
  embedding_forward(policy::reference{}, tokens, w, y);
}

template <class T>
  requires supported_by<policy::simd, T>
void embedding_backward(const policy::simd&, cview<token_t, 1> tokens, TensorView<const T, 2> dy, TensorView<T, 2> dw) {
  embedding_backward(policy::reference{}, tokens, dy, dw);
}

}  // namespace difftx
