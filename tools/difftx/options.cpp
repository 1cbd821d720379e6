// Options shared by several commands.
#include <cmath>

#include "commands.hpp"
#include "runner.hpp"

namespace difftx::cli {

namespace {
std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}
}  // namespace

CLI::Validator count_in(long long low) {
  return CLI::Validator(
      [low](std::string& text) -> std::string {
        long long n = 0;
        if (!CLI::detail::lexical_cast(text, n) || n < low || n > max_count)
          return "expected an integer from " + std::to_string(low) + " to " + std::to_string(max_count) + ", got " + text;
        return "";
      },
      "INT in [" + std::to_string(low) + ", 2^24]");
}

CLI::Validator positive_finite(bool allow_zero) {
  return CLI::Validator(
      [allow_zero](std::string& text) -> std::string {
        double x = 0;
        if (!CLI::detail::lexical_cast(text, x) || !std::isfinite(x) || x < 0 || (x == 0 && !allow_zero))
          return std::string("expected a finite number ") + (allow_zero ? ">= 0" : "> 0") + ", got " + text;
        return "";
      },
      allow_zero ? "FLOAT >= 0" : "FLOAT > 0");
}

namespace {
// A built policy that can run on this machine (cuda needs a device).
CLI::Validator runnable_policy() {
  return CLI::Validator(
      [](std::string& name) -> std::string {
        const auto names = built_policy_names();
        if (std::find(names.begin(), names.end(), name) == names.end())
          return "policy '" + name + "' is not built into this difftx (built: " + joined(names) + ")";
        if (const auto reason = unavailable_reason(name); !reason.empty())
          return "policy '" + name + "' cannot run here: " + reason;
        return "";
      },
      "{" + joined(built_policy_names()) + "}");
}
}  // namespace

CLI::Option* add_policy_option(CLI::App& command, std::string& policy) {
  policy = fastest_policy();
  return command.add_option("--policy", policy, "how to compute (default: the fastest built for the CPU)")
      ->check(runnable_policy())
      ->capture_default_str();
}

CLI::Option* add_policies_option(CLI::App& command, std::vector<std::string>& policies) {
  policies = {fastest_policy()};
  return command
      .add_option("--policy", policies,
                  "how to compute; a comma-separated list runs each on the same module, shape and dtype, one table "
                  "row per policy (default: the fastest built for the CPU)")
      ->delimiter(',')
      ->check(runnable_policy())
      ->capture_default_str();
}

CLI::Option* add_dtype_option(CLI::App& command, std::string& dtype) {
  dtype = "float32";
  std::vector<std::string> names;
  for (auto t : {io::dtype::f64, io::dtype::f32, io::dtype::bf16, io::dtype::f16}) names.emplace_back(io::dtype_name(t));
  return command.add_option("--dtype", dtype, "number type of the module")->check(CLI::IsMember(names))->capture_default_str();
}

CLI::Option* add_module_option(CLI::App& command, std::string& module) {
  return command.add_option("--module", module, "the module")->check(CLI::IsMember(command_line_kind_names()));
}

io::dtype checked_dtype(const std::string& dtype, const std::string& policy) {
  const auto type = *io::parse_dtype_name(dtype);
  if (!computes_in(policy, type))
    throw CLI::ValidationError("--dtype", "policy '" + policy + "' does not compute in " + dtype);
  return type;
}

}  // namespace difftx::cli
