// The policies this difftx is built with: the one place that lists them.
//
// Each entry names a policy and the half head sizes D its modules are
// compiled for (the fast paths); every other positive even D runs on the
// difftx::dynamic instantiation, which every entry also gets. Entries go
// slowest first: the last one is "the fastest policy built", every command's
// default. Adding a policy that the host compiler builds is adding its header
// and one entry here (as simd was).
// A policy with a `threads` member runs its kernels on that many OpenMP threads
// (0: OpenMP's default, OMP_NUM_THREADS); the others count as one.
// policy::cuda is not in this list: its headers compile only under nvcc, so
// runner.cpp adds it from runners_cuda.cu where DIFFTX_CUDA is on
// (cuda_policy.hpp), after these: the default stays a CPU policy.
#pragma once

#include <array>
#include <tuple>

#include <difftx/policy/reference.hpp>
#if !defined(DIFFTX_CLI_FUZZ_REGISTRY)
#include <difftx/policy/simd.hpp>
#endif

namespace difftx::cli {

template <class Policy, index_t... D>
struct policy_entry {
  using policy_type = Policy;
  static constexpr std::array<index_t, sizeof...(D)> compiled_head_dims{D...};
};

#if defined(DIFFTX_CLI_FUZZ_REGISTRY)
// The fuzz build only (fuzz/CMakeLists.txt defines this for fuzz_run): the
// full registry's instantiations take too long to compile under the fuzzer and
// sanitizer instrumentation on two cores for CI. The oracle policy with the
// run-time head size alone reaches the same argument, file and shape checks.
using built_policies = std::tuple<policy_entry<policy::reference>>;
#else
// 64 and 128: the usual head sizes of 128 and 256 split in two maps. A compiled
// D runs the same kernels as dynamic (they read d from the shapes), so more
// entries would only lengthen the build (docs/benchmarks.md: "Run-time head
// size against a compiled one").
using built_policies = std::tuple<policy_entry<policy::reference, 64, 128>, policy_entry<policy::simd, 64, 128>>;
#endif

}  // namespace difftx::cli
