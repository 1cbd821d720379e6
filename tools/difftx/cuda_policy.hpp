// policy::cuda as the host-compiled commands see it. Its runners and device
// queries are compiled by nvcc in runners_cuda.cu, only where difftx is built
// with DIFFTX_CUDA (which defines DIFFTX_CLI_CUDA for the tool).
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include <difftx/io/dtype.hpp>

#include "runner.hpp"

namespace difftx::cli {
struct language_model_spec;
class language_model_runner;
}  // namespace difftx::cli

namespace difftx::cli::cuda_policy {

inline constexpr std::string_view name = "cuda";

// "" when a CUDA device is present, else one line saying why not.
std::string unavailable_reason();
// "cuda (NVIDIA H100 80GB HBM3, sm_90)", or "cuda (no device)".
std::string description();
bool computes_in(io::dtype type);
// Throws input_error for a type policy::cuda does not compute in or a config it rejects.
std::unique_ptr<runner> make_runner(const module_spec& spec, io::dtype type, const policy_options& options);
// The same for a language model (language_model_runner.hpp); also input_error
// for int8 weights or an int8 KV cache, which are host-only.
std::unique_ptr<language_model_runner> make_language_model_runner(const language_model_spec& spec, io::dtype type,
                                                                  const policy_options& options);
// Milliseconds the device takes to read every byte of the regions (device
// memory) once, timed with CUDA events (policy/cuda/memory_read.cuh).
double read_ms(std::span<const std::span<const std::byte>> regions);

}  // namespace difftx::cli::cuda_policy
