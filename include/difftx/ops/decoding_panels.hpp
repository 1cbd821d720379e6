// A weight w [N, K] (nn.Linear's [out, in]) laid out for decoding rows too
// wide to stream beside x (Linear::add_decoding_panels, modules/linear.hpp):
// w's transpose cut into panels of `depth` rows of K, each panel stored a
// block of `width` columns at a time, the block's `depth` rows one after the
// other, zero-padded to whole panels and blocks:
//   element (n, k) at ((k / depth) · blocks + n / width) · depth · width + (k % depth) · width + n % width
// A product that adds x[k] · w[n, k] into y along k then reads the panels as
// one forward stream and keeps y (N values) in L1, where reading w's rows
// against x reads all of x (K values) again for every row.
//   linear_forward(policy, x[M, K], panels, y[M, N]): y = x · w^T, M ≤ max_rows
#pragma once

#include <cstddef>

#include "difftx/core/tensor.hpp"

namespace difftx {

template <class T>
struct decoding_panels {
  static constexpr index_t depth = 8, width = 16;
  // Reading the panels once serves this many rows of x; more rows (a prompt)
  // multiply w as it is (a matrix product that reuses what it loads).
  static constexpr index_t max_rows = 4;
  index_t rows = 0, cols = 0;  // N, K
  // In tensor memory, as the weights are: a large block lies on huge pages
  // (core/memory.hpp), which a stream through all of it needs as W's rows do.
  Tensor<T, 1> values;

  decoding_panels() = default;
  // From w [rows, cols], row-major.
  decoding_panels(const T* w, index_t n_rows, index_t n_cols)
      : rows(n_rows), cols(n_cols), values({panels() * blocks() * depth * width}) {
    T* out = values.data();
    for (index_t p = 0; p < panels(); ++p)  // in the order they are stored: written once, front to back
      for (index_t b = 0; b < blocks(); ++b)
        for (index_t k = p * depth; k < (p + 1) * depth; ++k)
          for (index_t n = b * width; n < (b + 1) * width; ++n) *out++ = n < rows && k < cols ? w[n * cols + k] : T(0.0);
  }

  index_t panels() const noexcept { return (cols + depth - 1) / depth; }
  index_t blocks() const noexcept { return (rows + width - 1) / width; }
  const T* panel(index_t p) const noexcept { return values.data() + static_cast<std::size_t>(p * blocks() * depth * width); }
  const T& at(index_t n, index_t k) const noexcept { return values.data()[offset(n, k)]; }

 private:
  std::size_t offset(index_t n, index_t k) const noexcept {
    return static_cast<std::size_t>(((k / depth) * blocks() + n / width) * depth * width + (k % depth) * width + n % width);
  }
};

}  // namespace difftx
