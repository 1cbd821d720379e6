// Data parallelism: every rank holds the whole model, runs forward and
// backward on its own share of the batch, and averages the gradients before
// the optimiser steps, so every rank's AdamW sees the same gradients and the
// replicas stay equal.
//
//   difftx::parallel::GradientAverager average(model.parameters(), comm);
//   for (...) {
//     zero_grad(model);
//     model.forward(x_mine, out, saved);             // this rank's B/p sequences
//     model.backward(x_mine, dout_mine, saved, dx);  // dout: of the loss's mean over B/p
//     average();                                     // gradients: the mean over the ranks
//     optimiser.step();
//   }
//
// With each rank's loss the mean over its own equal share, the mean over the
// ranks is the gradient of the mean over the whole batch: p ranks at B/p
// train as one process at B. Gradients travel in buckets of about
// bucket_elements, one all-reduce each, so a model of many small tensors
// (norm weights, lambda vectors) costs a few collectives, not one per tensor.
// The buckets are reduced after the backward, not during it: difftx's
// backward is one call per module, and Open MPI's non-blocking collectives
// only progress inside MPI calls, so an all-reduce started mid-backward would
// wait for the next one anyway (docs/guide/scale-out.md).
#pragma once

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "difftx/core/transfer.hpp"
#include "difftx/modules/parameter.hpp"
#include "difftx/parallel/communicator.hpp"

namespace difftx::parallel {

template <Scalar T, communicator Comm>
class GradientAverager {
 public:
  static constexpr index_t default_bucket_elements = index_t{1} << 22;  // 16 MB of float

  // Collective: every rank passes its replica's parameters (the same names
  // and shapes everywhere, else input_error on every rank), in comm's memory.
  GradientAverager(std::vector<parameter_ref<T>> parameters, Comm& comm,
                   index_t bucket_elements = default_bucket_elements)
      : parameters_(std::move(parameters)), comm_(&comm) {
    constexpr std::string_view where = "GradientAverager";
    require(bucket_elements > 0, where, "bucket_elements", "a positive count", std::to_string(bucket_elements));
    std::vector<double> shapes{double(parameters_.size())};
    index_t largest = 0, filled = 0;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      const auto& p = parameters_[i];
      require(p.grad != nullptr, where, p.name, "a parameter with a gradient", "none");
      require_space(where, p.name, p.grad_view(), comm.memory().space());
      require(!p.is_shard(), where, p.name, "a whole parameter (data parallelism replicates the model)",
              "rank " + std::to_string(p.shard.rank) + "'s part");
      for (auto e : p.shape) shapes.push_back(double(e));
      // A new bucket where this parameter would overflow a non-empty one.
      if (buckets_.empty() || (filled > 0 && filled + p.size() > bucket_elements)) {
        buckets_.push_back({i, i});
        filled = 0;
      }
      buckets_.back().second = i + 1;
      filled += p.size();
      largest = std::max(largest, filled);
    }
    detail::require_same_on_every_rank(comm, where, "parameters (count, then each shape)", shapes);
    bucket_ = Tensor<T, 1>({largest}, comm.memory());
  }

  std::size_t buckets() const noexcept { return buckets_.size(); }

  // Every gradient ← its mean over the ranks (collective).
  void average() {
    auto& memory = comm_->memory();
    const double inverse = 1.0 / comm_->size();
    for (const auto& [first, last] : buckets_) {
      index_t n = 0;
      for (std::size_t i = first; i < last; ++i) {
        const auto& p = parameters_[i];
        difftx::detail::copy_elements(bucket_.data() + n, memory, p.grad, *p.memory, p.size());
        n += p.size();
      }
      const TensorView<T, 1> sum(bucket_.data(), {n}, memory.space());
      comm_->all_reduce_sum(sum);
      scale(sum, inverse);
      n = 0;
      for (std::size_t i = first; i < last; ++i) {
        const auto& p = parameters_[i];
        difftx::detail::copy_elements(p.grad, *p.memory, bucket_.data() + n, memory, p.size());
        n += p.size();
      }
    }
  }

 private:
  // x ← x · factor, in the accumulation type (device buckets through the host).
  void scale(TensorView<T, 1> x, double factor) {
    const accum_t<T> f(factor);
    if (x.space() == memory_space::host) {
      for (index_t i = 0; i < x.size(); ++i) x.data()[i] = store<T>(load(x.data()[i]) * f);
      return;
    }
    detail::wait_for(*comm_);
    auto host = to_host(cview<T, 1>(x), comm_->memory());
    for (index_t i = 0; i < host.size(); ++i) host.data()[i] = store<T>(load(host.data()[i]) * f);
    difftx::detail::copy_elements(x.data(), comm_->memory(), host.data(), host_memory(), x.size());
  }

  std::vector<parameter_ref<T>> parameters_;
  Comm* comm_;
  std::vector<std::pair<std::size_t, std::size_t>> buckets_;  // [first, last) parameter of each
  Tensor<T, 1> bucket_;
};

}  // namespace difftx::parallel
