// What difftx's parallel layers (tensor_parallel.hpp, data_parallel.hpp) need
// of a transport, and what a collective throws when it cannot finish.
//
// A communicator joins `size()` processes; this one is `rank()`. Its buffers
// live in `memory()` (host memory for MPI, the CUDA policy's device memory
// for NCCL). Every rank must call the same collectives in the same order with
// the same sizes:
//   all_reduce_sum(x)         x [n] ← Σ over ranks of x, in place
//   all_gather(part, whole)   part [n] on every rank → whole [size·n], rank-major
//   barrier()                 returns once every rank has entered it
// Implementations: local_communicator (below, one process), mpi_communicator
// (mpi.hpp, target difftx::mpi) and nccl_communicator (nccl.hpp, target
// difftx::nccl). Each header stands alone, so a user who needs neither
// transport includes neither.
#pragma once

#include <algorithm>
#include <concepts>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "difftx/core/checks.hpp"
#include "difftx/core/error.hpp"
#include "difftx/core/memory.hpp"
#include "difftx/core/tensor.hpp"
#include "difftx/core/transfer.hpp"

namespace difftx {

// A collective that cannot finish: a peer that did not answer within the
// communicator's timeout (it has stopped, or it is waiting in another
// collective) or the transport's own failure. The communicator that threw can
// not be used again: a collective may still be in flight on the other ranks.
// Bad input to a collective (a wrong size or memory) is input_error as
// everywhere else, thrown before anything is sent.
class communication_error : public std::runtime_error {
 public:
  communication_error(std::string where, const std::string& what)
      : std::runtime_error(detail::printable("difftx::" + where + ": " + what)), where_(std::move(where)) {}
  const std::string& where() const noexcept { return where_; }

 private:
  std::string where_;
};

namespace parallel {

template <class C>
concept communicator = requires(C& c, const C& k, TensorView<float, 1> buffer, cview<float, 1> part) {
  { k.rank() } -> std::convertible_to<int>;
  { k.size() } -> std::convertible_to<int>;
  { k.memory() } -> std::same_as<memory_resource&>;
  c.all_reduce_sum(buffer);
  c.all_gather(part, buffer);
  c.barrier();
};

// One process and no transport: rank 0 of 1. A parallel module over it is the
// plain module; code written for several ranks runs unchanged on one.
class local_communicator {
 public:
  int rank() const noexcept { return 0; }
  int size() const noexcept { return 1; }
  memory_resource& memory() const noexcept { return host_memory(); }
  template <class T>
  void all_reduce_sum(TensorView<T, 1> x) const {
    require_space("local_communicator::all_reduce_sum", "x", x, memory_space::host);
  }
  template <class T>
  void all_gather(cview<T, 1> part, TensorView<T, 1> whole) const {
    constexpr std::string_view where = "local_communicator::all_gather";
    require_space(where, "part", part, memory_space::host);
    require_shape(where, "whole", whole, part.shape());
    std::copy_n(part.data(), part.size(), whole.data());
  }
  void barrier() const noexcept {}
};

namespace detail {

// Returns once comm's collectives so far have finished, or throws
// communication_error at its deadline: a stream-ordered transport (NCCL) has a
// synchronize() for this, which must come before a download of its results
// (a download waits without a deadline).
template <communicator Comm>
void wait_for(Comm& comm) {
  if constexpr (requires { comm.synchronize(); }) comm.synchronize();
}

// Throws input_error(where, argument, ...) on every rank unless every rank
// passed the same values (configurations, shard shapes): one all_gather, so
// a rank that was given another model fails everywhere instead of hanging
// or computing garbage in a later collective.
template <communicator Comm>
void require_same_on_every_rank(Comm& comm, std::string_view where, std::string_view argument,
                                const std::vector<double>& values) {
  const auto n = static_cast<index_t>(values.size());
  const index_t ranks = comm.size();
  Tensor<double, 1> mine({n}, comm.memory()), all({n * ranks}, comm.memory());
  difftx::detail::copy_elements(mine.data(), comm.memory(), values.data(), host_memory(), n);
  comm.all_gather(mine.const_view(), all.view());
  wait_for(comm);
  std::vector<double> everyone(static_cast<std::size_t>(n * ranks));
  difftx::detail::copy_elements(everyone.data(), host_memory(), all.data(), comm.memory(), n * ranks);
  const auto describe = [&](index_t r) {
    std::string s = "(";
    for (index_t i = 0; i < n; ++i) {
      const double v = everyone[static_cast<std::size_t>(r * n + i)];
      s += (i ? ", " : "") + (v == static_cast<double>(static_cast<long long>(v)) ? std::to_string(static_cast<long long>(v))
                                                                                : std::to_string(v));
    }
    return s + ")";
  };
  for (index_t r = 1; r < ranks; ++r)
    require(std::equal(everyone.begin(), everyone.begin() + n, everyone.begin() + r * n), where, argument,
            "the same on every rank, as rank 0's " + describe(0), describe(r) + " on rank " + std::to_string(r));
}

}  // namespace detail
}  // namespace parallel
}  // namespace difftx
