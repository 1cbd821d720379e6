// A learnable tensor with its gradient, and the rank-erased handle modules give
// out by name (for file I/O, optimisers and gradcheck).
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "difftx/core/random.hpp"
#include "difftx/core/tensor.hpp"

namespace difftx {

// Where a parameter_ref holds one rank's part of a parameter split over
// `ranks` processes (parallel/tensor_parallel.hpp): rank r holds rows (or
// columns) [r·n, (r + 1)·n) of the whole, n = the part's extent. `none`: the
// whole parameter (a single process, or one every rank holds).
struct parameter_shard {
  enum class split { none, rows, columns };
  split along = split::none;
  index_t rank = 0, ranks = 1;
};

// A parameter seen by name: flat value and gradient of `shape`, in `memory`.
template <class T>
struct parameter_ref {
  std::string name;
  std::vector<index_t> shape;  // of what this process holds
  T* value = nullptr;
  T* grad = nullptr;
  memory_resource* memory = nullptr;
  parameter_shard shard{};

  // The whole parameter's shape (shape itself unless split over ranks).
  std::vector<index_t> full_shape() const {
    auto full = shape;
    if (shard.along != parameter_shard::split::none)
      full[shard.along == parameter_shard::split::rows ? 0 : 1] *= shard.ranks;
    return full;
  }
  bool is_shard() const noexcept { return shard.along != parameter_shard::split::none; }

  index_t size() const noexcept {
    index_t n = 1;
    for (auto e : shape) n *= e;
    return n;
  }
  memory_space space() const noexcept { return memory->space(); }
  TensorView<T, 1> value_view() const noexcept { return {value, {size()}, space()}; }
  TensorView<T, 1> grad_view() const noexcept { return {grad, {size()}, space()}; }
  void zero_grad() const {
    if (space() == memory_space::host)
      std::fill_n(grad, size(), T{});
    else
      memory->zero(grad, static_cast<std::size_t>(size()) * sizeof(T));
  }
};

// While one of these lives, parameters on this thread skip their
// initialisation and stay zero: modules built to be loaded from a file at
// once (io::load_diffllama) do not draw random weights only to overwrite them
// (about 7 s for a 1B-parameter model on one core).
class uninitialised_parameters {
 public:
  uninitialised_parameters() noexcept { ++depth(); }
  ~uninitialised_parameters() { --depth(); }
  uninitialised_parameters(const uninitialised_parameters&) = delete;
  uninitialised_parameters& operator=(const uninitialised_parameters&) = delete;
  static bool active() noexcept { return depth() > 0; }

 private:
  static int& depth() noexcept {
    thread_local int d = 0;
    return d;
  }
};

template <class T, std::size_t Rank>
struct Parameter {
  Tensor<T, Rank> value, grad;

  Parameter(const shape_t<Rank>& shape, memory_resource& memory) : value(shape, memory), grad(shape, memory) {}

  parameter_ref<T> ref(std::string name) {
    return {std::move(name), std::vector<index_t>(value.shape().begin(), value.shape().end()), value.data(),
            grad.data(), &value.memory()};
  }

  // Sets the value from a host-side fill (initialisation), wherever it lives.
  template <class Fill>
  void initialise(Fill&& fill) {
    if (uninitialised_parameters::active()) return;
    if (value.space() == memory_space::host) {
      fill(value.view());
      return;
    }
    Tensor<T, Rank> host(value.shape());
    fill(host.view());
    value.memory().upload(value.data(), host.data(), static_cast<std::size_t>(host.size()) * sizeof(T));
  }
  void init_uniform(random_stream& rng, double bound) {
    initialise([&](TensorView<T, Rank> v) { fill_uniform(v, rng, -bound, bound); });
  }
  void init_normal(random_stream& rng, double stddev) {
    initialise([&](TensorView<T, Rank> v) { fill_normal(v, rng, 0.0, stddev); });
  }
  void init_constant(double c) {
    initialise([&](TensorView<T, Rank> v) { fill_constant(v, c); });
  }
};

// This rank's part of a whole parameter `full` (host, row-major, p.full_shape())
// into part (host, p.shape), and back: the rows or columns p.shard names.
template <class T>
void take_shard(const parameter_ref<T>& p, const T* full, T* part) {
  const index_t rows = p.shape[0], n = p.size(), cols = n / rows;
  if (p.shard.along != parameter_shard::split::columns) {
    std::copy_n(full + (p.is_shard() ? p.shard.rank * n : 0), n, part);
    return;
  }
  for (index_t i = 0; i < rows; ++i)
    std::copy_n(full + i * cols * p.shard.ranks + p.shard.rank * cols, cols, part + i * cols);
}
// The whole parameter from every rank's part, gathered rank-major ([ranks][p.shape]).
template <class T>
void join_shards(const parameter_ref<T>& p, const T* gathered, T* full) {
  const index_t rows = p.shape[0], n = p.size(), cols = n / rows;
  if (p.shard.along != parameter_shard::split::columns) {
    std::copy_n(gathered, n * p.shard.ranks, full);
    return;
  }
  for (index_t r = 0; r < p.shard.ranks; ++r)
    for (index_t i = 0; i < rows; ++i)
      std::copy_n(gathered + r * n + i * cols, cols, full + i * cols * p.shard.ranks + r * cols);
}

// Appends a child module's parameters (already named with the child's prefix).
template <class T>
void append_parameters(std::vector<parameter_ref<T>>& all, std::vector<parameter_ref<T>> child) {
  for (auto& p : child) all.push_back(std::move(p));
}

namespace detail {
// module.require_trainable(where) where the module has one: it throws when the
// module computes for inference only (quantized logits, int8 weights), so a
// composite's backward refuses before any child's gradient changes. Modules
// without low-bit paths (a tensor-parallel part) have none.
template <class Module>
void require_trainable(const Module& module, std::string_view where) {
  if constexpr (requires { module.require_trainable(where); }) module.require_trainable(where);
}
}  // namespace detail

// Sets every parameter gradient of a module to zero.
template <class Module>
void zero_grad(Module& model) {
  for (const auto& p : model.parameters()) p.zero_grad();
}

}  // namespace difftx
