// mpi_communicator: the communicator concept (communicator.hpp) over MPI, for
// CPU processes (host memory). Link difftx::mpi; the program calls MPI_Init
// (or MPI_Init_thread) before constructing one and MPI_Finalize after the
// last one is gone.
//
//   difftx::parallel::mpi_communicator comm;           // MPI_COMM_WORLD, 5 min timeout
//   difftx::parallel::mpi_communicator comm(sub, 30s); // any communicator
//
// Construction duplicates the given communicator (collective: every rank of
// it constructs one), so difftx's collectives never match the program's own.
// Every collective is a non-blocking MPI call waited on with a deadline: a
// peer that does not answer within the timeout gives communication_error
// instead of a hang. Collectives work on a buffer the communicator owns
// (copied in and out), so a timed-out collective that completes later writes
// nothing of the caller's. Sums of float16/bfloat16 travel and add in float
// (their accumulation type), float in float, double in double.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "difftx/core/scalar_traits.hpp"
#include "difftx/parallel/communicator.hpp"

namespace difftx::parallel {

class mpi_communicator {
 public:
  using clock = std::chrono::steady_clock;

  explicit mpi_communicator(MPI_Comm comm = MPI_COMM_WORLD, std::chrono::milliseconds timeout = std::chrono::minutes(5))
      : timeout_(timeout) {
    constexpr std::string_view where = "mpi_communicator";
    int initialized = 0;
    MPI_Initialized(&initialized);
    require(initialized != 0, where, "MPI", "MPI_Init called before the communicator is made", "MPI not initialised");
    require(timeout.count() > 0, where, "timeout", "a positive duration", std::to_string(timeout.count()) + " ms");
    check(MPI_Comm_dup(comm, &comm_), where);
    // Errors come back as codes (communication_error), not as MPI's abort.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;
  ~mpi_communicator() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized || comm_ == MPI_COMM_NULL) return;
    // A collective that timed out may still finish (a late peer): give it the
    // timeout once more, then leave it and its buffer, which MPI may still write.
    if (pending_ != MPI_REQUEST_NULL && !finish(pending_, clock::now() + timeout_)) {
      buffer_.release();  // NOLINT: owned by the unfinished collective now
      return;
    }
    MPI_Comm_free(&comm_);
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  memory_resource& memory() const noexcept { return host_memory(); }
  MPI_Comm comm() const noexcept { return comm_; }  // the duplicate difftx uses
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }

  // x [n] ← Σ over ranks of x (in accum_t<T>, rounded back to T once).
  template <Scalar T>
  void all_reduce_sum(TensorView<T, 1> x) {
    constexpr std::string_view where = "mpi_communicator::all_reduce_sum";
    using A = accum_t<T>;
    static_assert(std::is_same_v<A, float> || std::is_same_v<A, double> || std::is_same_v<A, long double>,
                  "difftx: mpi_communicator sums in the accumulation type, which must be float, double or long double");
    require_usable(where);
    require_space(where, "x", x, memory_space::host);
    A* wire = buffer<A>(x.size());
    for (index_t i = 0; i < x.size(); ++i) wire[i] = load(x.data()[i]);
    for (index_t done = 0; done < x.size();) {
      const int count = chunk(x.size() - done);
      MPI_Request request = MPI_REQUEST_NULL;
      check(MPI_Iallreduce(MPI_IN_PLACE, wire + done, count, mpi_type_of<A>(), MPI_SUM, comm_, &request), where);
      wait(request, where);
      done += count;
    }
    for (index_t i = 0; i < x.size(); ++i) x.data()[i] = store<T>(wire[i]);
  }

  // part [n] on every rank -> whole [size·n]: rank r's part at r·n.
  template <class T>
  void all_gather(cview<T, 1> part, TensorView<T, 1> whole) {
    constexpr std::string_view where = "mpi_communicator::all_gather";
    static_assert(std::is_trivially_copyable_v<T>, "difftx: mpi_communicator::all_gather moves bytes: T must be trivially copyable");
    require_usable(where);
    require_space(where, "part", part, memory_space::host);
    require_space(where, "whole", whole, memory_space::host);
    require_shape(where, "whole", whole, shape_t<1>{part.size() * size_});
    const auto bytes = static_cast<std::size_t>(part.size()) * sizeof(T);
    require(bytes <= static_cast<std::size_t>(std::numeric_limits<int>::max()), where, "part",
            "at most 2^31 - 1 bytes per rank", std::to_string(bytes) + " bytes");
    auto* wire = buffer<std::byte>(static_cast<index_t>(bytes) * (size_ + 1));
    if (bytes > 0) std::memcpy(wire, part.data(), bytes);
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Iallgather(wire, static_cast<int>(bytes), MPI_BYTE, wire + bytes, static_cast<int>(bytes), MPI_BYTE, comm_,
                         &request),
          where);
    wait(request, where);
    if (bytes > 0) std::memcpy(whole.data(), wire + bytes, bytes * static_cast<std::size_t>(size_));
  }

  void barrier() {
    constexpr std::string_view where = "mpi_communicator::barrier";
    require_usable(where);
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ibarrier(comm_, &request), where);
    wait(request, where);
  }

 private:
  template <class A>
  static MPI_Datatype mpi_type_of() {
    if constexpr (std::is_same_v<A, float>) return MPI_FLOAT;
    else if constexpr (std::is_same_v<A, double>) return MPI_DOUBLE;
    else return MPI_LONG_DOUBLE;
  }
  static int chunk(index_t remaining) {
    return static_cast<int>(std::min<index_t>(remaining, std::numeric_limits<int>::max() / 2));
  }
  void check(int code, std::string_view where) {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    MPI_Error_string(code, text, &length);
    broken_ = true;
    throw communication_error(std::string(where), "MPI error: " + std::string(text, static_cast<std::size_t>(length)));
  }
  void require_usable(std::string_view where) const {
    if (broken_)
      throw communication_error(std::string(where),
                                "this communicator failed in an earlier collective and cannot be used again");
  }
  // The communicator's own buffer of at least n elements of E.
  template <class E>
  E* buffer(index_t n) {
    const auto bytes = static_cast<std::size_t>(n) * sizeof(E);
    if (bytes > capacity_) {
      buffer_ = std::make_unique<std::max_align_t[]>((bytes + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t));
      capacity_ = bytes;
    }
    return reinterpret_cast<E*>(buffer_.get());
  }
  // Polls request until done or the deadline; true when it completed.
  bool finish(MPI_Request& request, clock::time_point deadline) {
    for (long polls = 0;; ++polls) {
      int done = 0;
      if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
      if (done) return true;
      if (clock::now() > deadline) return false;
      // Spin briefly (collectives between live ranks answer in microseconds), then yield the core.
      if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  void wait(MPI_Request& request, std::string_view where) {
    if (finish(request, clock::now() + timeout_)) return;
    pending_ = request;
    broken_ = true;
    throw communication_error(std::string(where),
                              "not every rank of " + std::to_string(size_) + " joined within " +
                                  std::to_string(timeout_.count()) +
                                  " ms (a rank has stopped, failed, or is in another collective); the communicator is no longer usable");
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<std::max_align_t[]> buffer_;
  std::size_t capacity_ = 0;
  MPI_Request pending_ = MPI_REQUEST_NULL;
  bool broken_ = false;
};

static_assert(communicator<mpi_communicator>);
static_assert(communicator<local_communicator>);

}  // namespace difftx::parallel
