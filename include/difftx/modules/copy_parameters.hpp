// Copying parameters between two modules of the same architecture on any
// policies and memories: a reference-policy MultiHead to a policy::cuda one
// and back, float64 weights into a float32 module, a device module's
// gradients to the host to compare them.
//
//   copy_parameters(from, to);  // every value, matched by name
//   copy_gradients(from, to);   // every gradient, the same way
//
// The two modules must name the same parameters in the same order with the
// same shapes; otherwise input_error is thrown before anything is written.
// Same number types copy bytes (upload, download or copy through the modules'
// memory_resources); different ones convert through double on the host
// (scalar_traits<T>::to_double / from_double).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "difftx/core/checks.hpp"
#include "difftx/core/transfer.hpp"
#include "difftx/modules/parameter.hpp"

namespace difftx {

namespace detail {

template <class F, class T>
void require_same_parameters(std::string_view where, const std::vector<parameter_ref<F>>& from,
                             const std::vector<parameter_ref<T>>& to) {
  for (std::size_t i = 0; i < from.size() && i < to.size(); ++i) {
    require(to[i].name == from[i].name, where, "to",
            "parameter " + std::to_string(i) + " named '" + from[i].name + "' as in from", "'" + to[i].name + "'");
    require(to[i].shape == from[i].shape, where, from[i].name, "shape " + shape_string(from[i].shape) + " as in from",
            "shape " + shape_string(to[i].shape));
  }
  require(to.size() == from.size(), where, "to", std::to_string(from.size()) + " parameters as in from",
          std::to_string(to.size()));
}

// Copies count elements of F in from_memory to T in to_memory.
template <class F, class T>
void convert_elements(T* to, memory_resource& to_memory, const F* from, memory_resource& from_memory, index_t count) {
  if constexpr (std::is_same_v<F, T>) {
    copy_elements(to, to_memory, from, from_memory, count);
  } else {
    const auto source = to_host(TensorView<const F, 1>(from, {count}, from_memory.space()), from_memory);
    Tensor<T, 1> converted({count});
    for (index_t i = 0; i < count; ++i)
      converted.data()[i] = scalar_traits<T>::from_double(scalar_traits<F>::to_double(source.data()[i]));
    copy_elements(to, to_memory, converted.data(), host_memory(), count);
  }
}

// pick(parameter_ref) -> the pointer copied: the value or the gradient.
template <class From, class To, class Pick>
void copy_parameter_data(std::string_view where, From& from, To& to, Pick pick) {
  const auto source = from.parameters();
  const auto target = to.parameters();
  require_same_parameters(where, source, target);
  for (std::size_t i = 0; i < source.size(); ++i)
    convert_elements(pick(target[i]), *target[i].memory, pick(source[i]), *source[i].memory, source[i].size());
}

}  // namespace detail

// Every parameter value of `from` into `to` (parameters() is non-const, so
// `from` is too; it is not changed).
template <class From, class To>
void copy_parameters(From& from, To& to) {
  detail::copy_parameter_data("copy_parameters", from, to, [](const auto& p) { return p.value; });
}

// Every parameter gradient of `from` into `to`.
template <class From, class To>
void copy_gradients(From& from, To& to) {
  detail::copy_parameter_data("copy_gradients", from, to, [](const auto& p) { return p.grad; });
}

}  // namespace difftx
