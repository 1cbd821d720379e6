// policy::cuda as the host-compiled commands see it. Its runners and device
// queries are compiled by nvcc in runners_cuda.cu, only where difftx is built
// with DIFFTX_CUDA (which defines DIFFTX_CLI_CUDA for the tool).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <difftx/io/dtype.hpp>

#include "runner.hpp"

namespace difftx::cli::cuda_policy {

inline constexpr std::string_view name = "cuda";

// "" when a CUDA device is present, else one line saying why not.
std::string unavailable_reason();
// "cuda (NVIDIA H100 80GB HBM3, sm_90)", or "cuda (no device)".
std::string description();
bool computes_in(io::dtype type);
// Throws input_error for a type policy::cuda does not compute in or a config it rejects.
std::unique_ptr<runner> make_runner(const module_spec& spec, io::dtype type);

}  // namespace difftx::cli::cuda_policy
