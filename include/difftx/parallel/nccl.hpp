// nccl_communicator: the communicator concept (communicator.hpp) over NCCL,
// for the CUDA policy: buffers in the policy's device memory, collectives on
// the policy's stream. Link difftx::nccl and include it from a .cu file
// (nvcc), like difftx/policy/cuda.hpp. One process (or thread) per GPU:
//
//   ncclUniqueId id;                                   // rank 0 makes it and sends it to
//   if (rank == 0) ncclGetUniqueId(&id);               // the others (MPI, a file, a socket)
//   difftx::parallel::nccl_communicator comm(id, rank, size);              // default policy, 5 min timeout
//   difftx::parallel::nccl_communicator comm(id, rank, size, policy, 30s);
//   auto solo = difftx::parallel::nccl_communicator::single();            // rank 0 of 1, no peers
//
// Construction is collective (every rank constructs one with the same id and
// size) and binds the communicator to the policy's device. The communicator
// is non-blocking (ncclConfig_t::blocking = 0): no NCCL call blocks the
// calling thread, so a peer that never answers is a timeout, not a hang.
//
// Collectives are stream-ordered, like the policy's kernels: all_reduce_sum
// and all_gather run after the work already on the policy's stream and
// return without waiting for their result, which the next kernel on the
// stream sees. They overlap nothing, and stall nothing either.
//
// The timeout applies where this rank waits: construction, barrier(),
// synchronize() (which waits for everything on the stream so far),
// destruction, and NCCL's setup of a collective (the first of a kind may
// connect this rank to its peers). A peer that does not answer within it,
// or an error NCCL reports, gives communication_error: the communicator is
// aborted (ncclCommAbort stops this rank's kernels still waiting for a peer,
// so nothing is written after the throw) and every later call throws
// communication_error. Anything else that waits for the stream (downloading
// a result, cudaStreamSynchronize) waits with no deadline: call
// synchronize() first where a peer may be lost.
//
// Sums of float16 and bfloat16 travel and add in their own type (NCCL rounds
// each partial sum to it), unlike mpi_communicator, which adds in float.
#pragma once

#if !defined(__CUDACC__)
#error "difftx/parallel/nccl.hpp works on the CUDA policy's stream: include it from a .cu file compiled by nvcc (link difftx::nccl)"
#endif

#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>

#include "difftx/parallel/communicator.hpp"
#include "difftx/policy/cuda/tag.cuh"

namespace difftx::parallel {

class nccl_communicator {
 public:
  using clock = std::chrono::steady_clock;

  nccl_communicator(ncclUniqueId id, int rank, int size, policy::cuda policy = {},
                    std::chrono::milliseconds timeout = std::chrono::minutes(5))
      : policy_(std::move(policy)), rank_(rank), size_(size), timeout_(timeout) {
    constexpr std::string_view where = "nccl_communicator";
    require(size >= 1, where, "size", "at least 1 rank", std::to_string(size));
    require(rank >= 0 && rank < size, where, "rank", "a rank in [0, " + std::to_string(size) + ")",
            std::to_string(rank));
    require(timeout.count() > 0, where, "timeout", "a positive duration", std::to_string(timeout.count()) + " ms");
    // NCCL binds a communicator to the device current when it is made.
    DIFFTX_CUDA_CHECK(cudaSetDevice(policy_.context->device));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    settle(ncclCommInitRankConfig(&comm_, size, id, rank, &config), where, joined);
  }

  // Rank 0 of 1: every collective is a local copy, for code written for
  // several ranks run on one GPU.
  static nccl_communicator single(policy::cuda policy = {}) {
    ncclUniqueId id;
    const ncclResult_t made = ncclGetUniqueId(&id);
    if (made != ncclSuccess)
      throw communication_error("nccl_communicator::single",
                                std::string("ncclGetUniqueId: NCCL error: ") + ncclGetErrorString(made));
    return nccl_communicator(id, 0, 1, std::move(policy));
  }

  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  ~nccl_communicator() {
    if (comm_ == nullptr) return;  // aborted when it failed
    // Finalizing waits for this rank's collectives to finish on every rank; a
    // peer that never comes would hold it forever, so it gets the timeout and
    // is then aborted.
    ncclResult_t state = ncclCommFinalize(comm_);
    if (state == ncclInProgress) state = poll(clock::now() + timeout_, [] { return true; });
    if (state == ncclSuccess) ncclCommDestroy(comm_);
    else ncclCommAbort(comm_);
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  memory_resource& memory() const noexcept { return policy_.memory(); }
  cudaStream_t stream() const noexcept { return policy_.stream(); }
  ncclComm_t comm() const noexcept { return comm_; }  // null once aborted
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }

  // x [n] ← Σ over ranks of x, in place, on the stream.
  template <Scalar T>
  void all_reduce_sum(TensorView<T, 1> x) {
    constexpr std::string_view where = "nccl_communicator::all_reduce_sum";
    static_assert(nccl_type_of<T>() != ncclNumTypes,
                  "difftx: nccl_communicator::all_reduce_sum sums float, double, Eigen::half or Eigen::bfloat16 (the "
                  "CUDA policy's number types)");
    require_usable(where);
    require_space(where, "x", x, memory_space::device);
    sum_in_place(x.data(), x.size(), nccl_type_of<T>(), where);
  }

  // part [n] on every rank -> whole [size·n]: rank r's part at r·n, on the stream.
  template <class T>
  void all_gather(cview<T, 1> part, TensorView<T, 1> whole) {
    constexpr std::string_view where = "nccl_communicator::all_gather";
    static_assert(std::is_trivially_copyable_v<T>,
                  "difftx: nccl_communicator::all_gather moves bytes: T must be trivially copyable");
    require_usable(where);
    require_space(where, "part", part, memory_space::device);
    require_space(where, "whole", whole, memory_space::device);
    require_shape(where, "whole", whole, shape_t<1>{part.size() * size_});
    const auto bytes = static_cast<std::size_t>(part.size()) * sizeof(T);
    settle(ncclAllGather(part.data(), whole.data(), bytes, ncclUint8, comm_, stream()), where, finished);
  }

  // Returns once every rank has entered it and this rank's stream has run
  // everything enqueued before it.
  void barrier() {
    constexpr std::string_view where = "nccl_communicator::barrier";
    require_usable(where);
    // NCCL has no barrier: a one-element sum that every rank must join.
    Tensor<float, 1> token({1}, memory());
    sum_in_place(token.data(), token.size(), ncclFloat32, where);
    wait_for_stream(where);
  }

  // Waits, with the timeout, for everything on the policy's stream so far,
  // collectives included.
  void synchronize() {
    constexpr std::string_view where = "nccl_communicator::synchronize";
    require_usable(where);
    wait_for_stream(where);
  }

 private:
  // What a timeout says the ranks did not all do.
  static constexpr std::string_view joined =
      "joined the communicator (a rank has not started, has failed, or was given another id or size)";
  static constexpr std::string_view finished =
      "finished the collectives issued so far (a rank has stopped, has failed, or is in another collective)";

  template <class T>
  static constexpr ncclDataType_t nccl_type_of() {
    if constexpr (std::is_same_v<T, float>) return ncclFloat32;
    else if constexpr (std::is_same_v<T, double>) return ncclFloat64;
    else if constexpr (std::is_same_v<T, Eigen::half>) return ncclFloat16;
    else if constexpr (std::is_same_v<T, Eigen::bfloat16>) return ncclBfloat16;
    else return ncclNumTypes;  // none
  }

  void sum_in_place(void* data, index_t count, ncclDataType_t type, std::string_view where) {
    settle(ncclAllReduce(data, data, static_cast<std::size_t>(count), type, ncclSum, comm_, stream()), where,
           finished);
  }

  void require_usable(std::string_view where) const {
    if (comm_ == nullptr)
      throw communication_error(std::string(where),
                                "this communicator failed earlier, was aborted, and cannot be used again");
  }

  // Polls NCCL's state until no call is in progress and done() holds:
  // ncclSuccess then, an NCCL error as soon as one shows, ncclInProgress at
  // the deadline.
  template <class Done>
  ncclResult_t poll(clock::time_point deadline, Done done) const {
    for (long polls = 0;; ++polls) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t queried = ncclCommGetAsyncError(comm_, &state);
      if (queried != ncclSuccess) return queried;
      if (state != ncclSuccess && state != ncclInProgress) return state;
      if (state == ncclSuccess && done()) return ncclSuccess;
      if (clock::now() > deadline) return ncclInProgress;
      // Spin briefly (live ranks answer in microseconds), then yield the core.
      if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // After every NCCL call: a non-blocking communicator may still be working
  // on the call (ncclInProgress), and NCCL allows no other call and no kernel
  // on its stream until it is done, so this waits for that, with the timeout.
  void settle(ncclResult_t result, std::string_view where, std::string_view waiting_for) {
    if (result != ncclSuccess && result != ncclInProgress) fail(where, nccl_error(result));
    check(poll(clock::now() + timeout_, [] { return true; }), where, waiting_for);
  }

  void wait_for_stream(std::string_view where) {
    const auto stream_done = [this] {
      const cudaError_t status = cudaStreamQuery(stream());
      if (status == cudaErrorNotReady) return false;
      DIFFTX_CUDA_CHECK(status);  // a failed kernel is the CUDA policy's error, not a peer's
      return true;
    };
    check(poll(clock::now() + timeout_, stream_done), where, finished);
  }

  // Throws communication_error (and aborts) unless state is ncclSuccess;
  // ncclInProgress is a timeout, and says what the ranks did not all do.
  void check(ncclResult_t state, std::string_view where, std::string_view waiting_for) {
    if (state == ncclSuccess) return;
    if (state == ncclInProgress)
      fail(where, "within " + std::to_string(timeout_.count()) + " ms, not every rank of " + std::to_string(size_) +
                      " " + std::string(waiting_for));
    fail(where, nccl_error(state));
  }

  std::string nccl_error(ncclResult_t result) const {
    std::string text = std::string("NCCL error: ") + ncclGetErrorString(result);
    const std::string detail = ncclGetLastError(comm_);
    return detail.empty() ? text : text + " (" + detail + ")";
  }

  // NCCL's rule after any error or a timeout: abort. This also stops this
  // rank's kernels still waiting for a peer, which would otherwise hold the
  // stream (and whatever runs after them on it) forever.
  [[noreturn]] void fail(std::string_view where, const std::string& what) {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    throw communication_error(std::string(where), what + "; the communicator is aborted and no longer usable");
  }

  policy::cuda policy_;
  int rank_ = 0, size_ = 1;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
};

static_assert(communicator<nccl_communicator>);

}  // namespace difftx::parallel
