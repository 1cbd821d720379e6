// The registry's queries, and make_runner's dispatch on the policy and the
// number type (each host policy and type's instantiations live in a unit of
// their own, policy_runners.hpp; policy::cuda's in runners_cuda.cu).
#include <algorithm>

#include <nlohmann/json.hpp>

#include "policies.hpp"
#include "policy_runners.hpp"
#include "runner.hpp"
#if defined(DIFFTX_CLI_CUDA)
#include "cuda_policy.hpp"
#endif

namespace difftx::cli {

namespace {

std::vector<std::string> host_policy_names() {
  std::vector<std::string> names;
  for_each_policy([&](auto policy) { names.emplace_back(decltype(policy)::name); });
  return names;
}

#if defined(DIFFTX_CLI_CUDA)
bool is_cuda(std::string_view policy) { return policy == cuda_policy::name; }
#endif

}  // namespace

void add_kernel_fields(nlohmann::json& j, const kernel_report& kernels) {
  const auto text_or_null = [](const std::string& s) { return s.empty() ? nlohmann::json() : nlohmann::json(s); };
  j["product_kernel"] = text_or_null(kernels.products);
  j["decode_product_kernel"] = text_or_null(kernels.decoding_products);
  j["score_tile_kernel"] = text_or_null(kernels.score_tiles);
  j["amx_tiles"] = kernels.amx_tiles;
}

std::vector<std::string> built_policy_names() {
  auto names = host_policy_names();
#if defined(DIFFTX_CLI_CUDA)
  names.emplace_back(cuda_policy::name);
#endif
  return names;
}

// A host policy, so the default runs on every machine the tool runs on.
std::string fastest_policy() { return host_policy_names().back(); }

std::string unavailable_reason([[maybe_unused]] std::string_view policy) {
#if defined(DIFFTX_CLI_CUDA)
  if (is_cuda(policy)) return cuda_policy::unavailable_reason();
#endif
  return "";
}

std::string policy_description(std::string_view policy, const std::string& detail) {
#if defined(DIFFTX_CLI_CUDA)
  if (is_cuda(policy)) return cuda_policy::description();
#endif
  std::string description(policy), in_parentheses = detail;
  for_each_policy([&](auto tag) {
    using Policy = decltype(tag);
    if constexpr (requires { Policy::instruction_set(); })
      if (policy == Policy::name) in_parentheses = Policy::instruction_set() + (detail.empty() ? "" : ", " + detail);
  });
  return in_parentheses.empty() ? description : description + " (" + in_parentheses + ")";
}

bool computes_in(std::string_view policy, io::dtype type) {
#if defined(DIFFTX_CLI_CUDA)
  if (is_cuda(policy)) return cuda_policy::computes_in(type);
#endif
  return with_type(type, [&]<class T>() {
    bool supported = false;
    for_each_policy([&](auto tag) {
      using Policy = decltype(tag);
      if (policy == Policy::name) supported = Policy::template supports<T>;
    });
    return supported;
  });
}

std::unique_ptr<runner> make_runner(const module_spec& spec, std::string_view policy, io::dtype type,
                                    const policy_options& options) {
#if defined(DIFFTX_CLI_CUDA)
  if (is_cuda(policy)) return cuda_policy::make_runner(spec, type, options);
#endif
  return with_type(type, [&]<class T>() {
    return detail::on_host_policy<T>("make_runner", policy,
                                     [&]<class Policy>() { return detail::make_for_policy<T, Policy>(spec, options); });
  });
}

}  // namespace difftx::cli
