// The module kinds of the tool, in one table. A row says what a kind is made
// of (a norm, an FFN, an attention module, a decoder layer or a stack of them)
// and which attention it has (differential V1, standard, differential V2);
// everything the commands do per kind follows from the row, each in one place:
//   the runner (a type, policy and head size):   detail::build_module, runner_impl.hpp
//   the library config and its check:            module_configs.hpp, check_config below
//   the spec's default sizes (bench):            with_default_sizes below
//   the FLOPs (benchmarks/flops.hpp):            count_flops below
//   the sizes from a weight file (run, --model): spec_from_weights, weight_shapes.hpp
// run and bench take a kind by name (--module), check runs every row.
// Adding a kind that is a new combination of parts and attention (a standard
// attention layer, say) is adding its row.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <difftx/modules/attention_heads.hpp>

namespace difftx::cli {

// The attention a kind has.
enum class attention_kind {
  none,
  differential,     // V1: MultiHead, h heads of two maps with a learned lambda
  standard,         // Attention: H softmax heads (the paper's matched baseline)
  differential_v2,  // MultiHeadV2: 2h query heads paired by a per-token lambda; run-time head size only
};

// What a kind is made of.
enum class module_parts {
  norm,       // RMSNorm
  ffn,        // SwiGLU
  attention,  // the attention module alone
  layer,      // a decoder layer: RMSNorm, attention, RMSNorm, SwiGLU (weights under attn. and ffn.)
  stack,      // spec.layers decoder layers, layer i at layer index l + i
};

struct module_spec;

struct module_kind {
  std::string_view name;
  module_parts parts;
  attention_kind attention = attention_kind::none;
  bool on_command_line = true;  // run and bench take it; false: the check's only (decoder_stack)

  constexpr bool has_attention() const { return attention != attention_kind::none; }
  constexpr bool v1() const { return attention == attention_kind::differential; }
  constexpr bool v2() const { return attention == attention_kind::differential_v2; }
  constexpr bool has_ffn() const { return parts != module_parts::norm && parts != module_parts::attention; }
  constexpr bool in_layers() const { return parts == module_parts::layer || parts == module_parts::stack; }
  // The weights' names: a layer's attention under "attn.", its FFN under "ffn.".
  constexpr std::string_view attention_prefix() const { return in_layers() ? "attn." : ""; }
  constexpr std::string_view ffn_prefix() const { return in_layers() ? "ffn." : ""; }
  // Whether the weights say the head count: the standard attention's q_proj [H·D, C] does not.
  constexpr bool heads_from_weights() const { return attention != attention_kind::standard; }
  // The heads a key/value group count must divide: h (V1), H (standard), 2h (V2; its baseline h).
  index_t query_heads(const module_spec& s) const;
  // What D multiplies in q_proj's rows (V1: 2h) or o_proj's columns (standard, V2: h): bench's default D is C / this.
  index_t head_width(const module_spec& s) const;
};

// The table. Its order is check's; run and bench list the kinds on the command line in it.
inline constexpr module_kind module_kinds[] = {
    {.name = "rmsnorm", .parts = module_parts::norm},
    {.name = "swiglu", .parts = module_parts::ffn},
    {.name = "multihead", .parts = module_parts::attention, .attention = attention_kind::differential},
    {.name = "attention", .parts = module_parts::attention, .attention = attention_kind::standard},
    {.name = "decoder_layer", .parts = module_parts::layer, .attention = attention_kind::differential},
    {.name = "decoder_stack", .parts = module_parts::stack, .attention = attention_kind::differential,
     .on_command_line = false},
    {.name = "multihead_v2", .parts = module_parts::attention, .attention = attention_kind::differential_v2},
    {.name = "decoder_layer_v2", .parts = module_parts::layer, .attention = attention_kind::differential_v2},
};

// The row named `name`, or nullptr.
constexpr const module_kind* find_module_kind(std::string_view name) {
  for (const auto& kind : module_kinds)
    if (kind.name == name) return &kind;
  return nullptr;
}
// The row of a name the code spells (a compile-time error for a name not in the table).
consteval const module_kind& module_kind_named(std::string_view name) { return *find_module_kind(name); }
// --module's choices: the kinds on the command line.
std::vector<std::string> command_line_kind_names();
// "multihead, attention, ...": the kinds on the command line that have attention (for messages).
std::string attention_kind_names();

// Where a size of a spec came from, where that was not its own flag: a tensor
// of a weight file (a bad value is bad input) or another flag's default (a usage error).
struct size_origin {
  std::string argument = {};  // "w.safetensors: attn.lambda_q1" or "--head-dim"
  std::string detail = {};    // "shape [5]", "the default d_model / (2 x heads) = 20 / 4"
  bool file = false;
};

// A module as the commands give it: its kind and its sizes (how to compute it
// is policy_options.hpp's).
struct module_spec {
  const module_kind* kind = nullptr;
  // C (of every kind) and the attention's h (attention: H; V2: h output heads),
  // g (0: as many as heads), D (V1: the half head size), RoPE, causality and
  // low-bit switches: the library's config of every attention kind holds these.
  AttentionHeadsConfig attention = {};
  index_t layer_index = 0;   // l (V1); layer i of decoder_stack has l + i
  index_t ffn_dim = 0;       // F; 0 means the library's default for C
  index_t layers = 2;        // decoder_stack only
  double eps = 1e-5;         // the RMSNorms' (rmsnorm; a layer's two norms)
  bool differential = true;  // V2 only: false is the authors' matched baseline (h query heads, no lambda_proj)
  // By field name ("head_dim"), the sizes that did not come from their own flag.
  std::map<std::string, size_origin, std::less<>> origins = {};

  index_t d_model() const noexcept { return attention.d_model; }
};

// The module's own check of the config the spec makes (its checked(): MultiHead,
// Attention, MultiHeadV2), as the tool says it: a field the module rejects is
// a usage error naming its flag (CLI::ValidationError, exit 2), or bad input
// naming the tensor it was read from (input_error(where, ...), exit 3), per
// spec.origins. Kinds without attention have nothing to check here (their
// sizes are positive by the flags' and the files' own checks).
void check_config(const module_spec& spec, std::string_view where);

// bench's sizes where the flags leave them: F = default_ffn_dim(C), g = h,
// D = C / head_width. Usage errors: no --heads for a kind with attention, a C
// that head_width does not divide.
module_spec with_default_sizes(module_spec spec);

// FLOPs of one forward and of one backward on x [B, N, C], as the benchmark
// suite counts them (benchmarks/flops.hpp; `difftx bench --help` says how).
struct flop_count {
  double forward = 0, backward = 0;
};
flop_count count_flops(const module_spec& spec, index_t batch, index_t seq);

}  // namespace difftx::cli
