// One stored tensor seen without owning it: its dtype as the file spells it,
// its shape and its bytes. A tensor_file's stored_tensor and a tensor in a
// mapped_safetensors both give one, so load_parameters reads either the same
// way. A reader that maps another layout onto difftx's (io/diffllama.hpp)
// gives a row order: the tensor's rows are stored rows, reordered, decoded
// straight from the file without an intermediate copy. The errors for a
// tensor that is missing or in a dtype difftx does not decode are here too, so
// every reader words them alike.
#pragma once

#include <cstddef>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "difftx/core/error.hpp"
#include "difftx/core/tensor.hpp"
#include "difftx/io/dtype.hpp"

namespace difftx::io {

namespace detail {

inline input_error missing_tensor(std::string_view where, const std::string& name, std::string_view label,
                                  std::size_t tensors_in_file) {
  return input_error(std::string(where), name, "a tensor named '" + name + "' in " + std::string(label),
                     "no such tensor (" + std::to_string(tensors_in_file) + " tensors in the file)");
}

inline input_error undecodable_tensor(std::string_view where, const std::string& name, std::string_view label,
                                      std::string_view dtype_name) {
  return input_error(std::string(where), name,
                     "a tensor of dtype F64, F32, F16 or BF16 (what difftx decodes) in " + std::string(label),
                     "dtype " + std::string(dtype_name));
}

}  // namespace detail

struct tensor_ref {
  std::string_view dtype_name;       // as the file spells it: "F32", "I64", ...
  std::optional<dtype> type;         // nullopt: a dtype difftx does not decode
  std::span<const index_t> shape;
  std::span<const std::byte> bytes;  // size() elements of dtype_name, little-endian
  // Empty: the rows as stored. Otherwise row r (along shape[0]) of this tensor
  // is stored row row_order[r], a permutation of [0, shape[0]).
  std::span<const index_t> row_order = {};

  index_t size() const noexcept {
    index_t n = 1;
    for (auto e : shape) n *= e;
    return n;
  }

  // Throws input_error naming `where`, the tensor and its dtype unless difftx
  // decodes that dtype; `label` names the file.
  void require_decodable(std::string_view where, const std::string& name, std::string_view label) const {
    if (!type) throw detail::undecodable_tensor(where, name, label, dtype_name);
  }

  // Its size() values into out as T (see io::decode_into); require_decodable first.
  template <Scalar T>
  void decode_into(T* out) const noexcept {
    if (row_order.empty()) return io::decode_into(*type, bytes.data(), static_cast<std::size_t>(size()), out);
    const auto row = static_cast<std::size_t>(size() / shape[0]), row_bytes = bytes.size() / row_order.size();
    for (std::size_t r = 0; r < row_order.size(); ++r)
      io::decode_into(*type, bytes.data() + static_cast<std::size_t>(row_order[r]) * row_bytes, row, out + r * row);
  }

  // Its bytes in its own row order (a copy in the stored dtype: conversions between layouts).
  std::vector<std::byte> ordered_bytes() const {
    if (row_order.empty()) return {bytes.begin(), bytes.end()};
    std::vector<std::byte> out(bytes.size());
    const auto row_bytes = bytes.size() / row_order.size();
    for (std::size_t r = 0; r < row_order.size(); ++r)
      std::memcpy(out.data() + r * row_bytes, bytes.data() + static_cast<std::size_t>(row_order[r]) * row_bytes, row_bytes);
    return out;
  }
};

}  // namespace difftx::io
