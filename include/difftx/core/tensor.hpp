// Dense row-major tensors: an owning Tensor and a non-owning TensorView.
//
// Views are always dense and row-major (no arbitrary strides): every kernel in
// difftx reads contiguous rows, and a reshape is then free. A view knows whether
// its memory is on the host or a device, so a host kernel can refuse device data.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "difftx/core/error.hpp"
#include "difftx/core/memory.hpp"
#include "difftx/core/sizes.hpp"

namespace difftx {

using index_t = std::ptrdiff_t;

template <std::size_t Rank>
using shape_t = std::array<index_t, Rank>;

template <class Extents>
std::string shape_string(const Extents& shape) {
  std::string s = "[";
  bool first = true;
  for (auto e : shape) {
    if (!first) s += ", ";
    s += std::to_string(e);
    first = false;
  }
  return s + "]";
}

template <std::size_t Rank>
constexpr index_t element_count(const shape_t<Rank>& shape) noexcept {
  index_t n = 1;
  for (auto e : shape) n *= e;
  return n;
}

template <class T, std::size_t Rank>
class TensorView {
 public:
  using element_type = T;
  using value_type = std::remove_const_t<T>;
  static constexpr std::size_t rank = Rank;

  TensorView() = default;
  TensorView(T* data, const shape_t<Rank>& shape, memory_space space = memory_space::host) noexcept
      : data_(data), shape_(shape), space_(space) {}

  // A view of U converts to a view of const U.
  template <class U>
    requires std::is_same_v<T, const U>
  TensorView(const TensorView<U, Rank>& other) noexcept : data_(other.data()), shape_(other.shape()), space_(other.space()) {}

  T* data() const noexcept { return data_; }
  const shape_t<Rank>& shape() const noexcept { return shape_; }
  index_t extent(std::size_t axis) const noexcept { return shape_[axis]; }
  index_t size() const noexcept { return element_count<Rank>(shape_); }
  bool empty() const noexcept { return size() == 0; }
  memory_space space() const noexcept { return space_; }

  // Row-major element access; host memory only.
  template <class... I>
    requires(sizeof...(I) == Rank)
  T& operator()(I... i) const noexcept {
    index_t offset = 0;
    std::size_t axis = 0;
    ((offset = offset * shape_[axis++] + static_cast<index_t>(i)), ...);
    return data_[offset];
  }

  // The same memory seen with another shape of the same element count.
  template <std::size_t R2>
  TensorView<T, R2> reshape(const shape_t<R2>& shape) const {
    if (element_count<R2>(shape) != size())
      throw input_error("TensorView::reshape", "shape", std::to_string(size()) + " elements",
                        shape_string(shape));
    return {data_, shape, space_};
  }

  // The i-th slice along the first axis.
  TensorView<T, Rank - 1> operator[](index_t i) const noexcept
    requires(Rank > 1)
  {
    shape_t<Rank - 1> inner;
    for (std::size_t a = 1; a < Rank; ++a) inner[a - 1] = shape_[a];
    return {data_ + i * element_count<Rank - 1>(inner), inner, space_};
  }

 private:
  T* data_ = nullptr;
  shape_t<Rank> shape_{};
  memory_space space_ = memory_space::host;
};

// A read-only view whose element type is not deduced, so kernels deduce T from
// their output view and a Tensor or a view of non-const T converts implicitly.
template <class T, std::size_t Rank>
using cview = TensorView<const std::type_identity_t<T>, Rank>;

// An owning, aligned, value-initialised (zero) tensor in a memory_resource.
// Copies are deep; moves steal. Device tensors need a trivially copyable T.
// A shape with a negative extent, more than max_tensor_elements elements or
// more bytes than the resource can allocate throws input_error("Tensor", ...).
template <class T, std::size_t Rank>
class Tensor {
 public:
  static constexpr std::size_t rank = Rank;

  Tensor() = default;
  explicit Tensor(const shape_t<Rank>& shape, memory_resource& memory = host_memory())
      : shape_(shape), memory_(&memory) {
    allocate_zeroed();
  }
  Tensor(const Tensor& other) : shape_(other.shape_), memory_(other.memory_) {
    allocate_uninitialised();
    copy_from(other.data_);
  }
  Tensor(Tensor&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        shape_(std::exchange(other.shape_, {})),
        memory_(other.memory_) {}
  Tensor& operator=(Tensor other) noexcept {
    swap(other);
    return *this;
  }
  ~Tensor() { release(); }

  void swap(Tensor& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(shape_, other.shape_);
    std::swap(memory_, other.memory_);
  }

  // Gives the tensor this shape in this memory. Memory is reallocated (and
  // zeroed) only when the element count or the resource changes; otherwise the
  // contents are kept, so buffers reused across steps cost no allocation.
  void resize(const shape_t<Rank>& shape, memory_resource& memory) {
    if (element_count<Rank>(shape) != size() || &memory != memory_) {
      Tensor fresh(shape, memory);
      swap(fresh);
    }
    shape_ = shape;
  }
  void resize(const shape_t<Rank>& shape) { resize(shape, *memory_); }

  void set_zero() {
    if (space() == memory_space::host)
      std::fill_n(data_, size(), T{});
    else
      memory_->zero(data_, bytes());
  }

  TensorView<T, Rank> view() noexcept { return {data_, shape_, space()}; }
  TensorView<const T, Rank> view() const noexcept { return {data_, shape_, space()}; }
  TensorView<const T, Rank> const_view() const noexcept { return {data_, shape_, space()}; }
  operator TensorView<T, Rank>() noexcept { return view(); }
  operator TensorView<const T, Rank>() const noexcept { return view(); }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  const shape_t<Rank>& shape() const noexcept { return shape_; }
  index_t extent(std::size_t axis) const noexcept { return shape_[axis]; }
  index_t size() const noexcept { return element_count<Rank>(shape_); }
  bool empty() const noexcept { return size() == 0; }
  memory_space space() const noexcept { return memory_->space(); }
  memory_resource& memory() const noexcept { return *memory_; }

  template <class... I>
    requires(sizeof...(I) == Rank)
  T& operator()(I... i) noexcept {
    return view()(i...);
  }
  template <class... I>
    requires(sizeof...(I) == Rank)
  const T& operator()(I... i) const noexcept {
    return view()(i...);
  }

 private:
  std::size_t bytes() const noexcept { return static_cast<std::size_t>(size()) * sizeof(T); }

  void allocate_uninitialised() {
    const auto count = checked_element_count(shape_, "Tensor", "shape");
    if (count == 0) return;
    data_ = static_cast<T*>(allocate([&](std::size_t wanted) { return memory_->allocate(wanted); }, count));
  }
  // get(bytes) for count elements; running out of memory is an input_error naming the shape.
  template <class Get>
  void* allocate(Get&& get, std::size_t count) const {
    const auto wanted = checked_bytes(count, sizeof(T), "Tensor", "shape");
    try {
      return get(wanted);
    } catch (const std::bad_alloc&) {
      throw input_error("Tensor", "shape", "a tensor that fits in memory",
                        std::to_string(wanted) + " bytes for shape " + shape_string(shape_) + ", more than can be allocated");
    }
  }
  void allocate_zeroed() {
    if (space() != memory_space::host || zero_bytes_are_value_initialised()) {
      const auto count = checked_element_count(shape_, "Tensor", "shape");
      if (count == 0) return;
      data_ = static_cast<T*>(allocate([&](std::size_t wanted) { return memory_->allocate_zeroed(wanted); }, count));
      return;
    }
    allocate_uninitialised();
    if (data_) std::uninitialized_value_construct_n(data_, size());
  }
  // Whether zero bytes are a value-initialised T (float, double, float16,
  // bfloat16, integers): then the resource's zeroed memory is the tensor.
  static bool zero_bytes_are_value_initialised() noexcept {
    if constexpr (!std::is_trivially_copyable_v<T> || !std::is_trivially_destructible_v<T>) {
      return false;
    } else {
      static const bool zero = [] {
        const auto bytes = std::bit_cast<std::array<unsigned char, sizeof(T)>>(T{});
        return std::all_of(bytes.begin(), bytes.end(), [](unsigned char b) { return b == 0; });
      }();
      return zero;
    }
  }
  void copy_from(const T* source) {
    if (!data_) return;
    if (space() == memory_space::host)
      std::uninitialized_copy_n(source, size(), data_);
    else
      memory_->copy(data_, source, bytes());
  }
  void release() noexcept {
    if (!data_) return;
    if (space() == memory_space::host) std::destroy_n(data_, size());
    memory_->deallocate(data_, bytes());
    data_ = nullptr;
  }

  T* data_ = nullptr;
  shape_t<Rank> shape_{};
  memory_resource* memory_ = &host_memory();
};

// [B, N, C] seen as [B·N, C]: token-wise ops work on rows.
template <class T>
TensorView<T, 2> flatten_rows(const TensorView<T, 3>& x) {
  return x.template reshape<2>({x.extent(0) * x.extent(1), x.extent(2)});
}

}  // namespace difftx
