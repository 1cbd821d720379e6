// The policies this difftx is built with: the one place that lists them.
//
// Entries go slowest first: the last one is "the fastest policy built", every
// command's default. Adding a policy that the host compiler builds is adding
// its tag here, one entry, and its name to difftx_policy_runners in
// tools/CMakeLists.txt (as simd was). Every module is instantiated at
// the run-time head size (difftx::dynamic) only: a compiled D runs the same
// kernels (they read d from the shapes; docs/benchmarks.md, "Run-time head size
// against a compiled one") and each one more would lengthen the build by a
// whole set of modules per type. Compiled head sizes stay the library's
// (DiffAttn<T, D>), tested in head_dim_test.
// A policy with a `threads` member runs its kernels on that many OpenMP threads
// (0: OpenMP's default, OMP_NUM_THREADS); the others count as one.
// policy::cuda is not in this list: its headers compile only under nvcc, so
// runner.cpp adds it from runners_cuda.cu where DIFFTX_CUDA is on
// (cuda_policy.hpp), after these: the default stays a CPU policy.
#pragma once

#include <tuple>

#include <difftx/policy/reference/tag.hpp>
#if !defined(DIFFTX_CLI_FUZZ_REGISTRY)
#include <difftx/policy/simd/tag.hpp>
#endif

namespace difftx::cli {

#if defined(DIFFTX_CLI_FUZZ_REGISTRY)
// The fuzz build only (fuzz/CMakeLists.txt defines this for fuzz_run): the
// full registry's instantiations take too long to compile under the fuzzer and
// sanitizer instrumentation on two cores for CI. The oracle policy alone
// reaches the same argument, file and shape checks.
using built_policies = std::tuple<policy::reference>;
#else
using built_policies = std::tuple<policy::reference, policy::simd>;
#endif

// f(Policy{}) for each host policy of the registry, in its order.
template <class F>
void for_each_policy(F&& f) {
  std::apply([&](auto... policies) { (f(policies), ...); }, built_policies{});
}

}  // namespace difftx::cli
