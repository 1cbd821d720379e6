// A module's architecture as text: the constants its parameters' shapes do
// not imply (head counts, head size, layer index, RoPE base and scaling, the
// norms' eps, causality), keyed like its parameters (the same prefix, e.g.
// "layers.3.attn.heads"). io::store_parameters writes it into a model file's
// __metadata__ and io::load_parameters checks a file's against the module, so
// a file saved from layer 3 does not load silently into a module built as
// layer 0; the difftx tool reads it to build the model a file holds. Files
// carry it with architecture_marker beside it.
//
// A module describes itself with describe_architecture(architecture&, prefix)
// where it has such constants; describe(module) collects it, empty for a
// module without (Linear, SwiGLU: their shapes say everything).
#pragma once

#include <charconv>
#include <map>
#include <string>
#include <system_error>

#include "difftx/core/sizes.hpp"

namespace difftx {

using architecture = std::map<std::string, std::string>;

// The key that marks a file's architecture as difftx's (its value: the
// format's version): other writers' metadata may use the same words ("heads",
// "causal") in their own ways, so only a file with this key is checked.
inline constexpr const char* architecture_marker = "difftx.architecture";
inline constexpr const char* architecture_version = "1";

// The text of a value: integers in decimal, doubles in their shortest form
// that reads back to the same double, booleans as true/false.
inline std::string architecture_value(bool v) { return v ? "true" : "false"; }
inline std::string architecture_value(index_t v) { return std::to_string(v); }
inline std::string architecture_value(double v) {
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, v).ptr;
  return std::string(text, end);
}

// Whether a file's text for a value means the module's (written by
// architecture_value): numbers compare as numbers, so "1e-5" written by
// another program matches the module's "1e-05".
inline bool same_architecture_value(const std::string& module_text, const std::string& file_text) {
  if (module_text == file_text) return true;
  double a = 0, b = 0;
  const auto parsed = [](const std::string& s, double& v) {
    const auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), v);
    return error == std::errc() && end == s.data() + s.size();
  };
  return parsed(module_text, a) && parsed(file_text, b) && a == b;
}

template <class Module>
architecture describe(const Module& module, const std::string& prefix = "") {
  architecture a;
  if constexpr (requires { module.describe_architecture(a, prefix); }) module.describe_architecture(a, prefix);
  return a;
}

}  // namespace difftx
