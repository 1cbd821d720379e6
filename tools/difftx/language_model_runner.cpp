// make_language_model_runner: the dispatch to LanguageModel<DecoderLayer<T,
// dynamic, Policy>> of each host policy of the registry and number type (each
// instantiated in a unit of its own, policy_runners.hpp), and to policy::cuda's
// from runners_cuda.cu where the tool is built with CUDA. Only the run-time
// head size is instantiated: a compiled D runs the same kernels
// (docs/benchmarks.md), and each instantiation lengthens the build.
#include "language_model_runner.hpp"

#include "policy_runners.hpp"
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
    return detail::on_host_policy<T>("make_language_model_runner", policy, [&]<class Policy>() {
      return detail::make_language_model<T, Policy>(spec, options);
    });
  });
}

}  // namespace difftx::cli
