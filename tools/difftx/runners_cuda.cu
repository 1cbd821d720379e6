// Every runner on policy::cuda, compiled by nvcc (see cuda_policy.hpp): the
// modules', and the language models' of run --model, generate and bench
// --model (the host's model_runner on the device: parameters loaded one tensor
// at a time straight into device memory, prefill's attention on the policy's
// default path, decode on attention_decode with the KV cache in device
// memory). One unit, so the two share their DecoderLayer instantiations: a
// second unit compiled every kernel again, minutes of nvcc on two cores.
// Head sizes: difftx::dynamic only; the kernels choose their tensor-core or
// CUDA-core path from d at run time, so a compiled D would change nothing but
// the build time.
#include <difftx/policy/cuda.hpp>
#include <difftx/policy/cuda/memory_read.cuh>

#include "cuda_policy.hpp"
#include "language_model_runner_impl.hpp"
#include "runner_impl.hpp"

namespace difftx::cli {

// CUDA events recorded on the policy's stream around the work; the elapsed
// time is read once the stop event has completed, never before.
template <>
struct work_timer<policy::cuda> {
  static double elapsed_ms(const policy::cuda& p, const std::function<void()>& work) {
    cudaEvent_t start = nullptr, stop = nullptr;
    DIFFTX_CUDA_CHECK(cudaEventCreate(&start));
    DIFFTX_CUDA_CHECK(cudaEventCreate(&stop));
    float ms = 0;
    try {
      DIFFTX_CUDA_CHECK(cudaEventRecord(start, p.stream()));
      work();
      DIFFTX_CUDA_CHECK(cudaEventRecord(stop, p.stream()));
      DIFFTX_CUDA_CHECK(cudaEventSynchronize(stop));
      DIFFTX_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    } catch (...) {
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
      throw;
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return ms;
  }
};

namespace cuda_policy {

std::string unavailable_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaSuccess && count > 0) return "";
  return std::string("no CUDA device was found (") +
         (status == cudaSuccess ? "the runtime reports 0 devices" : cudaGetErrorString(status)) + ")";
}

std::string description() {
  if (!unavailable_reason().empty()) return "cuda (no device)";
  int device = 0;
  cudaDeviceProp properties{};
  DIFFTX_CUDA_CHECK(cudaGetDevice(&device));
  DIFFTX_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
  return "cuda (" + std::string(properties.name) + ", sm_" + std::to_string(properties.major) +
         std::to_string(properties.minor) + ")";
}

bool computes_in(io::dtype type) {
  return with_type(type, [&]<class T>() { return policy::cuda::supports<T>; });
}

std::unique_ptr<runner> make_runner(const module_spec& spec, io::dtype type, const policy_options& options) {
  return with_type(type, [&]<class T>() -> std::unique_ptr<runner> {
    if constexpr (policy::cuda::supports<T>) {
      return detail::make_for_policy<T, policy::cuda>(spec, options);
    } else {
      throw input_error("make_runner", "policy", "a policy that computes in " + std::string(scalar_traits<T>::name),
                        "cuda");
    }
  });
}

std::unique_ptr<language_model_runner> make_language_model_runner(const language_model_spec& spec, io::dtype type,
                                                                  const policy_options& options) {
  return with_type(type, [&]<class T>() -> std::unique_ptr<language_model_runner> {
    if constexpr (policy::cuda::supports<T>) {
      return detail::make_language_model<T, policy::cuda>(spec, options);
    } else {
      throw input_error("make_language_model_runner", "policy",
                        "a policy that computes in " + std::string(scalar_traits<T>::name), "cuda");
    }
  });
}

double read_ms(std::span<const std::span<const std::byte>> regions) {
  const policy::cuda p{};
  const cuda_detail::region_reader reader(p, regions);
  return work_timer<policy::cuda>::elapsed_ms(p, [&] { reader.read(); });
}

}  // namespace cuda_policy
}  // namespace difftx::cli
