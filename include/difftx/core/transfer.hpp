// Moving tensors between memories: host to device (upload), device to host
// (download), within one memory (copy), device to another device (through the
// host). Everything goes through memory_resource, so this header needs no CUDA
// and serves policy::cuda's device memory (policy.memory()) as well as any
// other resource.
//
// A TensorView knows whether its memory is host or device but not which
// resource owns it, so a view is passed with its resource; a Tensor knows its own.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>

#include "difftx/core/checks.hpp"
#include "difftx/core/memory.hpp"
#include "difftx/core/tensor.hpp"

namespace difftx {

namespace detail {

// Copies count elements from src (in src_memory) to dst (in dst_memory).
template <class T>
void copy_elements(T* dst, memory_resource& dst_memory, const T* src, memory_resource& src_memory, index_t count) {
  if (count == 0) return;
  const auto bytes = static_cast<std::size_t>(count) * sizeof(T);
  const bool src_host = src_memory.space() == memory_space::host, dst_host = dst_memory.space() == memory_space::host;
  if (src_host && dst_host) {
    std::copy_n(src, count, dst);  // element-wise: host T need not be trivially copyable
  } else if (src_host) {
    dst_memory.upload(dst, src, bytes);
  } else if (dst_host) {
    src_memory.download(dst, src, bytes);
  } else if (&src_memory == &dst_memory) {
    dst_memory.copy(dst, src, bytes);
  } else {
    // Two device resources need not see each other's memory: bounce through the host.
    Tensor<T, 1> bounce({count});
    src_memory.download(bounce.data(), src, bytes);
    dst_memory.upload(dst, bounce.data(), bytes);
  }
}

template <class T, std::size_t R>
void require_readable(std::string_view where, const TensorView<T, R>& src, const memory_resource& src_memory) {
  require(src.space() == src_memory.space(), where, "src",
          std::string(to_string(src_memory.space())) + " memory, as src_memory allocates",
          std::string(to_string(src.space())) + " memory");
  require(src.empty() || src.data() != nullptr, where, "src", "data for shape " + shape_string(src.shape()),
          "no data");
}

}  // namespace detail

// A copy of src (which lives in src_memory) in dst, any spaces to any.
template <class T, std::size_t R>
Tensor<std::remove_const_t<T>, R> to_memory(TensorView<T, R> src, memory_resource& src_memory, memory_resource& dst) {
  detail::require_readable("to_memory", src, src_memory);
  Tensor<std::remove_const_t<T>, R> out(src.shape(), dst);
  detail::copy_elements(out.data(), dst, src.data(), src_memory, src.size());
  return out;
}

// A copy of a host view in dst (an upload where dst is a device). A device
// view needs its resource: to_memory(src, src_memory, dst).
template <class T, std::size_t R>
Tensor<std::remove_const_t<T>, R> to_memory(TensorView<T, R> src, memory_resource& dst) {
  require(src.space() == memory_space::host, "to_memory", "src",
          "host memory (a device view needs its resource: to_memory(src, src_memory, dst))",
          std::string(to_string(src.space())) + " memory");
  return to_memory(src, host_memory(), dst);
}

template <class T, std::size_t R>
Tensor<T, R> to_memory(const Tensor<T, R>& src, memory_resource& dst) {
  return to_memory(src.view(), src.memory(), dst);
}

// A host copy of src (a download where src lives on a device).
template <class T, std::size_t R>
Tensor<std::remove_const_t<T>, R> to_host(TensorView<T, R> src, memory_resource& src_memory) {
  return to_memory(src, src_memory, host_memory());
}

template <class T, std::size_t R>
Tensor<T, R> to_host(const Tensor<T, R>& src) {
  return to_memory(src.view(), src.memory(), host_memory());
}

}  // namespace difftx
