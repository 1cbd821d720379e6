// make_language_model_runner: LanguageModel<DecoderLayer<T, dynamic, Policy>>
// for each host policy of the registry (policies.hpp) and each number type,
// and policy::cuda's from runners_cuda.cu where the tool is built with
// CUDA. Only the run-time head size is instantiated: a compiled D runs the
// same kernels (docs/benchmarks.md), and each instantiation lengthens the build.
#include "language_model_runner.hpp"

#include <tuple>

#include "language_model_runner_impl.hpp"
#include "policies.hpp"
#if defined(DIFFTX_CLI_CUDA)
#include "cuda_policy.hpp"
#endif

namespace difftx::cli {

std::unique_ptr<language_model_runner> make_language_model_runner(const language_model_spec& spec,
                                                                  std::string_view policy, io::dtype type,
                                                                  const policy_options& options) {
#if defined(DIFFTX_CLI_CUDA)
  if (policy == cuda_policy::name) return cuda_policy::make_language_model_runner(spec, type, options);
#endif
  return with_type(type, [&]<class T>() {
    std::unique_ptr<language_model_runner> made;
    for_each_policy([&](auto tag) {
      using Policy = decltype(tag);
      if constexpr (Policy::template supports<T>)
        if (policy == Policy::name) made = detail::make_language_model<T, Policy>(spec, options);
    });
    require(made != nullptr, "make_language_model_runner", "policy",
            "a policy built into difftx that computes in " + std::string(scalar_traits<T>::name),
            std::string(policy));
    return made;
  });
}

}  // namespace difftx::cli
