// What module_kinds.hpp derives from a row: names, the config check, the
// default sizes and the FLOP counts.
#include "module_kinds.hpp"

#include <algorithm>

#include <CLI/CLI.hpp>

#include <difftx/modules/swiglu.hpp>
#include <difftx/policy/reference.hpp>

#include "flops.hpp"
#include "module_configs.hpp"

namespace difftx::cli {

index_t module_kind::query_heads(const module_spec& s) const {
  return v2() && s.differential ? 2 * s.attention.heads : s.attention.heads;
}

index_t module_kind::head_width(const module_spec& s) const { return v1() ? 2 * s.attention.heads : s.attention.heads; }

std::vector<std::string> command_line_kind_names() {
  std::vector<std::string> names;
  for (const auto& kind : module_kinds)
    if (kind.on_command_line) names.emplace_back(kind.name);
  return names;
}

std::string attention_kind_names() {
  std::string names;
  for (const auto& kind : module_kinds)
    if (kind.on_command_line && kind.has_attention()) names += (names.empty() ? "" : ", ") + std::string(kind.name);
  return names;
}

namespace {

// The module's checked() on its config, on the run-time head size in double
// on the reference policy: what depends on the number type or the policy (the
// low-bit paths) the module checks again when the runner builds it.
template <attention_kind A>
void check_attention_config(const module_spec& s) {
  attention_module<A, double, dynamic, policy::reference>::checked(attention_config<A>(s));
}

}  // namespace

void check_config(const module_spec& s, std::string_view where) {
  try {
    switch (s.kind->attention) {
      case attention_kind::none: return;
      case attention_kind::differential: return check_attention_config<attention_kind::differential>(s);
      case attention_kind::standard: return check_attention_config<attention_kind::standard>(s);
      case attention_kind::differential_v2: return check_attention_config<attention_kind::differential_v2>(s);
    }
  } catch (const input_error& e) {  // argument "config.kv_heads": field kv_heads
    constexpr std::string_view config = "config.";
    if (!e.argument().starts_with(config)) throw;
    const std::string field = e.argument().substr(config.size());
    size_origin origin{.argument = "--" + field};
    std::replace(origin.argument.begin(), origin.argument.end(), '_', '-');
    if (const auto it = s.origins.find(field); it != s.origins.end()) origin = it->second;
    const std::string detail = origin.detail.empty() ? "" : " (" + origin.detail + ")";
    if (origin.file)
      throw input_error(std::string(where), origin.argument,
                        e.expected() + " for " + e.where() + "'s " + e.argument(), e.got() + detail);
    throw CLI::ValidationError(origin.argument, "expected " + e.expected() + ", got " + e.got() + detail);
  }
}

module_spec with_default_sizes(module_spec s) {
  const auto& kind = *s.kind;
  const index_t C = s.d_model();
  if (kind.has_ffn() && s.ffn_dim == 0) s.ffn_dim = default_ffn_dim(C);
  if (!kind.has_attention()) return s;
  auto& a = s.attention;
  if (a.heads == 0) throw CLI::RequiredError("--heads (for --module " + std::string(kind.name) + ")");
  if (a.kv_heads == 0) a.kv_heads = a.heads;
  if (a.head_dim == 0) {
    const index_t width = kind.head_width(s);
    const std::string width_text = kind.v1() ? "(2 x heads)" : "heads";
    if (C % width != 0)
      throw CLI::ValidationError("--head-dim", "needed: d_model " + std::to_string(C) + " is not divisible by " +
                                                   std::to_string(width) + " " + width_text);
    a.head_dim = C / width;
    s.origins["head_dim"] = {.argument = "--head-dim",
                             .detail = "the default d_model / " + width_text + " = " + std::to_string(C) + " / " +
                                       std::to_string(width)};
  }
  return s;
}

// Matrix products and attention only (the bench's --help says how): the
// attention module's, SwiGLU's three projections, times the layers.
flop_count count_flops(const module_spec& s, index_t batch, index_t seq) {
  namespace f = difftx_bench;
  const auto& kind = *s.kind;
  const double b = static_cast<double>(batch), n = static_cast<double>(seq), c = static_cast<double>(s.d_model());
  const double h = static_cast<double>(s.attention.heads), g = static_cast<double>(s.attention.kv_heads);
  const double d = static_cast<double>(s.attention.head_dim), F = static_cast<double>(s.ffn_dim);
  const bool causal = s.attention.causal;
  flop_count count;
  switch (kind.attention) {
    case attention_kind::none: break;
    case attention_kind::differential:
      count = {f::multihead_forward(b, n, c, h, g, d, causal), f::multihead_backward(b, n, c, h, g, d, causal)};
      break;
    case attention_kind::differential_v2:
      // The V2 baseline is the standard attention with h heads (o_proj from hD); the head
      // combination a_2i - lambda a_2i+1 is elementwise, not counted.
      if (s.differential) {
        count = {f::multihead_v2_forward(b, n, c, h, g, d, causal), f::multihead_v2_backward(b, n, c, h, g, d, causal)};
        break;
      }
      [[fallthrough]];
    case attention_kind::standard:
      count = {f::baseline_forward(b, n, c, h, g, d, causal), f::baseline_backward(b, n, c, h, g, d, causal)};
      break;
  }
  if (kind.has_ffn()) {
    count.forward += 3 * f::linear_forward(b * n, F, c);
    count.backward += 3 * f::linear_backward(b * n, F, c);
  }
  const double layers = kind.parts == module_parts::stack ? static_cast<double>(s.layers) : 1;
  return {layers * count.forward, layers * count.backward};
}

}  // namespace difftx::cli
