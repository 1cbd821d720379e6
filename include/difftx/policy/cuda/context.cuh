// The CUDA policy's state: a device, a stream every kernel and copy runs on,
// a cuBLASLt handle with its workspace and its plans, and stream-ordered
// device memory.
#pragma once

#include <array>
#include <atomic>
#include <compare>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "difftx/core/memory.hpp"
#include "difftx/policy/cuda/attention_path.hpp"
#include "difftx/policy/cuda/plan_cache.hpp"

namespace difftx {

// A CUDA runtime or cuBLAS failure (not bad input: those throw input_error).
class cuda_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace cuda_detail {
inline void check(cudaError_t status, const char* what, const char* file, int line) {
  if (status != cudaSuccess)
    throw cuda_error(std::string(file) + ":" + std::to_string(line) + ": " + what + ": " + cudaGetErrorString(status));
}
inline void check(cublasStatus_t status, const char* what, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw cuda_error(std::string(file) + ":" + std::to_string(line) + ": " + what + ": cuBLAS status " +
                     std::to_string(static_cast<int>(status)));
}
}  // namespace cuda_detail

#define DIFFTX_CUDA_CHECK(expr) ::difftx::cuda_detail::check((expr), #expr, __FILE__, __LINE__)

// Device memory allocated and freed in the order of one stream (cudaMallocAsync,
// or cudaMallocFromPoolAsync from a pool of the context's own once it has one),
// so temporaries of a backward cost no device-wide synchronisation.
class device_memory_resource final : public memory_resource {
 public:
  explicit device_memory_resource(cudaStream_t stream) : stream_(stream) {}
  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    if (pool_)
      DIFFTX_CUDA_CHECK(cudaMallocFromPoolAsync(&p, bytes, pool_, stream_));
    else
      DIFFTX_CUDA_CHECK(cudaMallocAsync(&p, bytes, stream_));
    return p;
  }
  // Allocations from now on come from `pool` (frees go to whichever pool gave the memory).
  void allocate_from(cudaMemPool_t pool) noexcept { pool_ = pool; }
  void deallocate(void* p, std::size_t) noexcept override { cudaFreeAsync(p, stream_); }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    DIFFTX_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void zero(void* p, std::size_t bytes) override { DIFFTX_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_)); }
  // Host memory may be reused as soon as these return, so they wait for the copy.
  void upload(void* dst, const void* host_src, std::size_t bytes) override {
    DIFFTX_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
    DIFFTX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void download(void* host_dst, const void* src, std::size_t bytes) override {
    DIFFTX_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    DIFFTX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  memory_space space() const noexcept override { return memory_space::device; }

 private:
  cudaStream_t stream_;
  cudaMemPool_t pool_ = nullptr;  // none: the device's default pool
};

namespace cuda_detail {

// One cuBLASLt product's plan (linear.cuh's lt_matmul): its descriptors and
// the algorithm the heuristic chose, for one key of types, transposes, sizes,
// leading dimensions and the alignment of the three pointers (the heuristic
// may pick an algorithm that needs 256-byte starts unless told otherwise;
// beta is a pointer at the call, not part of the key).
struct matmul_key {
  int type = 0;
  bool transpose_a = false, transpose_b = false;
  std::int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  std::uint32_t align_a = 0, align_b = 0, align_c = 0;
  auto operator<=>(const matmul_key&) const = default;
};
// The largest power of two up to 256 that divides the address.
inline std::uint32_t pointer_alignment(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  return address % 256 == 0 ? 256u : static_cast<std::uint32_t>(address & (~address + 1));
}
struct matmul_plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  matmul_plan() = default;
  matmul_plan(const matmul_plan&) = delete;
  matmul_plan& operator=(const matmul_plan&) = delete;
  ~matmul_plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace cuda_detail

struct cuda_context {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t blas = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 32u << 20;  // cuBLASLt's recommendation for Hopper
  // A pool of the context's own that keeps freed memory (keep_freed_memory()),
  // or none: `memory` allocates from the device's default pool.
  cudaMemPool_t own_pool = nullptr;
  std::unique_ptr<device_memory_resource> memory;
  // Products' plans built once per key and kept (linear.cuh), instead of
  // rebuilt on every call; false rebuilds them each time (a context shared by
  // very many shapes that should not keep a plan for each).
  bool keep_matmul_plans = true;
  cuda_detail::plan_cache<cuda_detail::matmul_key, cuda_detail::matmul_plan> matmul_plans;
  int compute_major = 0;  // the device's compute capability, major number
  // What ran each attention call (attention_path), for `difftx bench` and the tests.
  std::array<std::atomic<long long>, attention_path_count> attention_calls{};
  // cuDNN's state (attention_cudnn.cuh), made on first use: type-erased, so
  // the context is the same type in translation units built with and without
  // cuDNN.
  std::mutex extension_mutex;
  std::shared_ptr<void> cudnn_attention;

  explicit cuda_context(int device_index) : device(device_index) {
    DIFFTX_CUDA_CHECK(cudaSetDevice(device));
    DIFFTX_CUDA_CHECK(cudaDeviceGetAttribute(&compute_major, cudaDevAttrComputeCapabilityMajor, device));
    DIFFTX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    DIFFTX_CUDA_CHECK(cublasLtCreate(&blas));
    DIFFTX_CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));
    memory = std::make_unique<device_memory_resource>(stream);
  }
  cuda_context(const cuda_context&) = delete;
  cuda_context& operator=(const cuda_context&) = delete;
  ~cuda_context() {
    cudaStreamSynchronize(stream);
    cudnn_attention.reset();
    if (own_pool) cudaMemPoolDestroy(own_pool);  // released once its last allocation is freed
    cudaFree(workspace);
    cublasLtDestroy(blas);
    cudaStreamDestroy(stream);
  }

  void synchronize() const { DIFFTX_CUDA_CHECK(cudaStreamSynchronize(stream)); }

  // From now on `memory` allocates from a pool of the context's own that keeps
  // freed memory for the next allocation (release threshold unbounded). The
  // default pool's threshold of zero hands it back to the driver at each
  // synchronisation, which every decode step makes to bring its logits back,
  // so the next step maps its temporaries afresh. Off by default: cuda_test's
  // case for it passes on an H200, but what it does for decode is not yet
  // measured (difftx_cuda_bench turns it on); idempotent.
  void keep_freed_memory() {
    if (own_pool) return;
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    DIFFTX_CUDA_CHECK(cudaMemPoolCreate(&own_pool, &props));
    std::uint64_t keep_everything = UINT64_MAX;
    DIFFTX_CUDA_CHECK(cudaMemPoolSetAttribute(own_pool, cudaMemPoolAttrReleaseThreshold, &keep_everything));
    memory->allocate_from(own_pool);
  }
  // Device memory the pool `memory` allocates from holds, in use or kept (bytes).
  std::uint64_t reserved_bytes() const {
    std::uint64_t bytes = 0;
    DIFFTX_CUDA_CHECK(cudaMemPoolGetAttribute(allocation_pool(), cudaMemPoolAttrReservedMemCurrent, &bytes));
    return bytes;
  }
  // Returns the memory that pool keeps but nothing uses to the driver, once
  // the stream's work is done (for another process or library on the device).
  void release_cached_memory() const {
    synchronize();
    DIFFTX_CUDA_CHECK(cudaMemPoolTrimTo(allocation_pool(), 0));
  }

  // The pool `memory` allocates from: the context's own, or the device's default.
  cudaMemPool_t allocation_pool() const {
    if (own_pool) return own_pool;
    cudaMemPool_t pool = nullptr;
    DIFFTX_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    return pool;
  }

  // One context per device, shared by every default-constructed policy, so
  // modules built separately still run in order on one stream. It is never
  // destroyed: the CUDA runtime may be gone before static destructors run.
  static std::shared_ptr<cuda_context> for_current_device() {
    int device = 0;
    DIFFTX_CUDA_CHECK(cudaGetDevice(&device));
    static std::mutex mutex;
    static std::vector<std::shared_ptr<cuda_context>>* contexts = new std::vector<std::shared_ptr<cuda_context>>();
    std::lock_guard lock(mutex);
    if (contexts->size() <= static_cast<std::size_t>(device)) contexts->resize(static_cast<std::size_t>(device) + 1);
    auto& slot = (*contexts)[static_cast<std::size_t>(device)];
    if (!slot) slot = std::make_shared<cuda_context>(device);
    return slot;
  }
};

// Whether a CUDA device is present (tests and tools ask before building a policy).
inline bool cuda_device_available() noexcept {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

}  // namespace difftx
