// The runners of one host policy and number type: a module's (runner.hpp)
// and a language model's (language_model_runner.hpp). Declared here for the
// dispatch (runner.cpp, language_model_runner.cpp), defined in runner_impl.hpp
// and language_model_runner_impl.hpp, and instantiated once per policy and
// type by a unit that tools/CMakeLists.txt makes from policy_runners.cpp.in
// (difftx_policy_runners, cmake/difftx_policy_runners.cmake). The units
// build side by side, and a kernel header rebuilds only its own policy's.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <tuple>

#include "language_model_runner.hpp"
#include "policies.hpp"
#include "runner.hpp"

namespace difftx::cli::detail {

template <class T, class Policy>
std::unique_ptr<runner> make_for_policy(const module_spec& s, const policy_options& o);

template <class T, class Policy>
std::unique_ptr<language_model_runner> make_language_model(const language_model_spec& spec,
                                                           const policy_options& options);

// make.template operator()<Policy>() for the host policy named `policy`, which
// must compute in T; input_error from `where` naming the policy otherwise.
template <class T, class Make>
auto on_host_policy(std::string_view where, std::string_view policy, Make&& make) {
  decltype(make.template operator()<std::tuple_element_t<0, built_policies>>()) made;
  for_each_policy([&](auto tag) {
    using Policy = decltype(tag);
    if constexpr (Policy::template supports<T>)
      if (policy == Policy::name) made = make.template operator()<Policy>();
  });
  require(made != nullptr, where, "policy",
          "a policy built into difftx that computes in " + std::string(scalar_traits<T>::name), std::string(policy));
  return made;
}

}  // namespace difftx::cli::detail
