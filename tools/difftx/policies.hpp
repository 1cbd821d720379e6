// The policies this difftx is built with: the one place that lists them.
//
// Each entry names a policy and the half head sizes D its modules are compiled
// for (D is a template parameter; the tool picks the instantiation at run time
// from this list). Entries go slowest first: the last one is "the fastest
// policy built", every command's default. Adding a policy that the host
// compiler builds is adding its header and one entry here (as simd was).
// A policy with a `threads` member runs its kernels on that many OpenMP threads
// (0: OpenMP's default, OMP_NUM_THREADS); the others count as one.
// policy::cuda is not listed yet: its headers compile only under nvcc, so its
// instantiations need a runners file of their own (.cu, only where DIFFTX_CUDA
// is on), `check` must skip it on a machine without a device, and `bench` must
// synchronise its stream before reading the clock.
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
  static constexpr std::array<index_t, sizeof...(D)> head_dims{D...};
};

#if defined(DIFFTX_CLI_FUZZ_REGISTRY)
// The fuzz build only (fuzz/CMakeLists.txt defines this for fuzz_run): the
// full registry's instantiations (4 number types x 2 policies x 7 head sizes x
// 4 module kinds) take about 25 minutes to compile under the fuzzer and
// sanitizer instrumentation on two cores, too long for CI (this one: about 5
// minutes on one core, all three targets). The oracle policy on three small
// head sizes reaches the same argument, file and shape checks.
using built_policies = std::tuple<policy_entry<policy::reference, 2, 4, 8>>;
#else
using built_policies = std::tuple<policy_entry<policy::reference, 2, 4, 8, 16, 32, 64, 128>,
                                  policy_entry<policy::simd, 4, 8, 16, 32, 64, 128>>;
#endif

}  // namespace difftx::cli
