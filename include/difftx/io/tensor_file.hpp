// Named tensors in memory, as files hold them: element type, shape and raw
// little-endian bytes. safetensors files map onto a tensor_file; an .npy file
// onto one stored_tensor. (mapped_safetensors reads a safetensors file without
// copying its tensors into memory.)
#pragma once

#include <cmath>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "difftx/core/checks.hpp"
#include "difftx/io/dtype.hpp"
#include "difftx/io/tensor_ref.hpp"

namespace difftx::io {

struct stored_tensor {
  dtype type = dtype::f32;
  std::vector<index_t> shape;
  std::vector<std::byte> bytes;

  index_t size() const noexcept {
    index_t n = 1;
    for (auto e : shape) n *= e;
    return n;
  }
  std::vector<double> values() const { return decode(type, bytes.data(), static_cast<std::size_t>(size())); }
  tensor_ref ref() const noexcept { return {safetensors_name(type), type, shape, bytes}; }

  static stored_tensor from_values(dtype type, std::vector<index_t> shape, const std::vector<double>& values) {
    return {type, std::move(shape), encode(type, values)};
  }
  // The view's values stored as `type`, converted element by element (no
  // intermediate copy: an output as large as memory allows still converts).
  template <Scalar T, std::size_t R>
  static stored_tensor from_view(dtype type, TensorView<const T, R> view) {
    require_space("stored_tensor::from_view", "view", view, memory_space::host);
    stored_tensor t{type, std::vector<index_t>(view.shape().begin(), view.shape().end()), {}};
    t.bytes.resize(static_cast<std::size_t>(view.size()) * size_of(type));
    encode_values(type, view.data(), static_cast<std::size_t>(view.size()), t.bytes.data());
    return t;
  }

  // Throws input_error naming `where` and `name` at the first NaN or infinity.
  void require_finite(std::string_view where, std::string_view name) const {
    const auto count = static_cast<std::size_t>(size());
    for (std::size_t i = 0; i < count; ++i) {
      const double x = decode_one(type, bytes.data() + i * size_of(type));
      if (!std::isfinite(x))
        throw input_error(std::string(where), std::string(name), "finite values",
                          std::to_string(x) + " at flat index " + std::to_string(i));
    }
  }

  // The values as a Tensor<T, R> of the expected shape; `where` and `name`
  // label the error when the shape differs.
  template <Scalar T, std::size_t R>
  Tensor<T, R> to_tensor(std::string_view where, std::string_view name, const shape_t<R>& expected) const {
    require(shape == std::vector<index_t>(expected.begin(), expected.end()), where, name,
            "shape " + shape_string(expected), "shape " + shape_string(shape));
    Tensor<T, R> out(expected);
    decode_into(type, bytes.data(), static_cast<std::size_t>(out.size()), out.data());
    return out;
  }
};

struct tensor_file {
  std::map<std::string, std::string> metadata;
  std::map<std::string, stored_tensor> tensors;
  // The file's tensors in a dtype difftx does not decode (I64, U8, ...): name
  // -> dtype as the file spells it. Listed so that asking for one says why;
  // writing a tensor_file leaves them out.
  std::map<std::string, std::string> undecodable;

  bool contains(const std::string& name) const { return tensors.count(name) != 0; }

  // The tensor called name; `where` and `label` (the file) name the error
  // when there is none or it is one of the undecodable.
  const stored_tensor& at(const std::string& name, std::string_view where, std::string_view label) const {
    if (auto it = tensors.find(name); it != tensors.end()) return it->second;
    if (auto it = undecodable.find(name); it != undecodable.end())
      throw detail::undecodable_tensor(where, name, label, it->second);
    throw detail::missing_tensor(where, name, label, tensors.size() + undecodable.size());
  }
  const std::string& meta(const std::string& key, std::string_view where, std::string_view label) const {
    auto it = metadata.find(key);
    require(it != metadata.end(), where, key, "metadata key '" + key + "' in " + std::string(label), "none");
    return it->second;
  }
};

}  // namespace difftx::io
