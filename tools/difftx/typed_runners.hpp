// make_typed_runner<T>: the runner of a host policy in the registry
// (policies.hpp) for number type T. Each runners_<type>.cpp instantiates it
// for one type, so the build splits.
#pragma once

#include <string>
#include <tuple>

#include "policies.hpp"
#include "runner_impl.hpp"

namespace difftx::cli {

template <class T>
std::unique_ptr<runner> make_typed_runner(const module_spec& spec, std::string_view policy, const policy_options& options) {
  std::unique_ptr<runner> made;
  std::apply(
      [&]<class... Entries>(Entries...) {
        auto try_entry = [&]<class Policy>(Policy) {
          if (policy != Policy::name) return;
          if constexpr (Policy::template supports<T>) made = detail::make_for_policy<T, Policy>(spec, options);
        };
        (try_entry(Entries{}), ...);
      },
      built_policies{});
  require(made != nullptr, "make_runner", "policy", "a policy built into difftx that computes in " +
          std::string(scalar_traits<T>::name), std::string(policy));
  return made;
}

}  // namespace difftx::cli
