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

#include "difftx/core/checks.hpp"
#include "difftx/core/sizes.hpp"
#include "difftx/ops/rope.hpp"

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

// RoPE's keys: rope_theta, rope_type, rope_factor and llama3's three more.
inline void describe_rope(architecture& a, const std::string& prefix, double theta, const rope_scaling& s) {
  a[prefix + "rope_theta"] = architecture_value(theta);
  a[prefix + "rope_type"] = rope_type_name(s.type);
  a[prefix + "rope_factor"] = architecture_value(s.factor);
  if (s.type != rope_type::llama3) return;
  a[prefix + "rope_low_freq_factor"] = architecture_value(s.low_freq_factor);
  a[prefix + "rope_high_freq_factor"] = architecture_value(s.high_freq_factor);
  a[prefix + "rope_original_max_positions"] = architecture_value(s.original_max_positions);
}

// The scaling that describe_rope recorded under prefix in a file's metadata.
// Files written before rope_type was recorded hold rope_factor alone (linear
// where it is not 1) or nothing (the default). input_error(where, label:
// __metadata__.<key>) for a value that is not a number or a known type.
inline rope_scaling recorded_rope_scaling(const architecture& meta, const std::string& prefix, std::string_view where,
                                          const std::string& label) {
  const auto key = [&](const char* name) { return prefix + name; };
  const auto number = [&](const char* name, double otherwise) {
    const auto it = meta.find(key(name));
    if (it == meta.end()) return otherwise;
    double v = 0;
    const auto& t = it->second;
    const auto [end, error] = std::from_chars(t.data(), t.data() + t.size(), v);
    require(error == std::errc() && end == t.data() + t.size(), where, label + ": __metadata__." + key(name),
            "a number", "'" + t + "'");
    return v;
  };
  rope_scaling s{.factor = number("rope_factor", 1.0)};
  const auto type = meta.find(key("rope_type"));
  if (type == meta.end()) {
    s.type = s.factor == 1.0 ? rope_type::standard : rope_type::linear;
    return s;
  }
  if (type->second == "llama3") {
    s.type = rope_type::llama3;
    s.low_freq_factor = number("rope_low_freq_factor", s.low_freq_factor);
    s.high_freq_factor = number("rope_high_freq_factor", s.high_freq_factor);
    s.original_max_positions = number("rope_original_max_positions", s.original_max_positions);
  } else if (type->second == "linear" || type->second == "default") {
    s.type = type->second == "linear" ? rope_type::linear : rope_type::standard;
  } else {
    require(false, where, label + ": __metadata__." + key("rope_type"), "default, linear or llama3",
            "'" + type->second + "'");
  }
  return s;
}

template <class Module>
architecture describe(const Module& module, const std::string& prefix = "") {
  architecture a;
  if constexpr (requires { module.describe_architecture(a, prefix); }) module.describe_architecture(a, prefix);
  return a;
}

}  // namespace difftx
