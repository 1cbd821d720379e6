// model_source (model_source.hpp): what model a folder or a file holds.
#include "model_source.hpp"

#include <charconv>
#include <optional>
#include <set>
#include <string>
#include <system_error>

#include <difftx/io/generation_settings.hpp>

#include "commands.hpp"
#include "weight_shapes.hpp"

namespace difftx::cli {

namespace {

constexpr std::string_view where = "load";

// L, from the layers.<i>. prefixes: layers 0 .. L-1 must each have tensors
// (so L is at most the file's tensor count). Names that are not the
// Stack's (layers.01., layers.x.) are ignored like any other extra tensor.
index_t layer_count(const shape_table& weights, const std::string& label) {
  const std::string prefix = "layers.";
  std::set<index_t> found;
  for (const auto& [name, tensor] : weights) {
    if (name.rfind(prefix, 0) != 0) continue;
    const auto dot = name.find('.', prefix.size());
    if (dot == std::string::npos) continue;
    const std::string digits = name.substr(prefix.size(), dot - prefix.size());
    const bool canonical = !digits.empty() && digits.size() <= 9 && (digits.size() == 1 || digits[0] != '0') &&
                           digits.find_first_not_of("0123456789") == std::string::npos;
    if (canonical) found.insert(std::stoll(digits));
  }
  require(!found.empty(), where, label + ": layers.0.*",
          "the tensors of at least one decoder layer (layers.<i>.<DecoderLayer name>)", "none");
  const index_t layers = *found.rbegin() + 1;
  for (index_t i = 0; i < layers; ++i)
    require(found.count(i) == 1, where, label + ": layers." + std::to_string(i) + ".*",
            "the tensors of every layer 0.." + std::to_string(layers - 1) + " (the file has layers." +
                std::to_string(layers - 1) + ")",
            "none");
  return layers;
}

// V, from embed_tokens.weight [V, C] with C the layers' width (from layer 0's q_proj).
index_t vocabulary(const shape_table& weights, const std::string& label, index_t width) {
  const auto it = weights.find("embed_tokens.weight");
  if (it == weights.end()) throw io::detail::missing_tensor(where, "embed_tokens.weight", label, weights.size());
  const auto& shape = it->second.shape;
  require(shape.size() == 2 && shape[0] > 0 && shape[1] == width, where, label + ": embed_tokens.weight",
          "shape [V, " + std::to_string(width) + "] with V >= 1 (C from layers.0.attn.q_proj.weight)",
          "shape " + shape_string(shape));
  return shape[0];
}

// A file without an architecture in its metadata (written elsewhere): the
// layer count from the layer prefixes, every layer's sizes from layer 0's
// weights and the flags (load_parameters then checks every other layer
// against them), layer i at index i.
language_model_spec spec_from_shapes(const shape_table& weights, const std::string& label, const model_flags& flags) {
  const module_spec given{.kind = &module_kind_named("decoder_layer"),
                          .attention = {.heads = flags.heads, .kv_heads = flags.kv_heads,
                                        .rope_theta = flags.rope_theta.value_or(10000.0)},
                          .eps = flags.eps.value_or(1e-5)};
  const auto layer = spec_from_weights(given, weights, label, where, "layers.0.");
  const index_t vocab = vocabulary(weights, label, layer.d_model()), width = layer.d_model();
  language_model_spec spec{.model = {.vocab_size = vocab, .d_model = width, .eps = layer.eps}};  // untied: lm_head.weight
  for (index_t i = 0, n = layer_count(weights, label); i < n; ++i)
    spec.layers.push_back({.attention = with_attention_heads(MultiHeadConfig{.layer_index = i}, layer.attention),
                           .ffn_dim = layer.ffn_dim,
                           .eps = layer.eps});
  return spec;
}

// A file that records its architecture (store_parameters, `difftx convert`):
// every layer as its metadata says, sizes from the weights.
language_model_spec spec_from_architecture(const std::map<std::string, std::string>& meta, const shape_table& weights,
                                           const std::string& label) {
  auto text = [&](const std::string& key) -> const std::string& {
    const auto it = meta.find(key);
    require(it != meta.end(), where, label + ": __metadata__." + key,
            "the key beside the other architecture keys (a file as difftx writes it)", "none");
    return it->second;
  };
  auto number = [&](const std::string& key) {
    const auto& t = text(key);
    double v = 0;
    const auto [end, error] = std::from_chars(t.data(), t.data() + t.size(), v);
    require(error == std::errc() && end == t.data() + t.size() && std::isfinite(v) && v >= 0, where,
            label + ": __metadata__." + key, "a number >= 0", "'" + t + "'");
    return v;
  };
  auto count = [&](const std::string& key) {
    const double v = number(key);
    require(v >= 1 && v <= double(index_t{1} << 24) && v == std::floor(v), where, label + ": __metadata__." + key,
            "a whole number in [1, 2^24]", text(key));
    return static_cast<index_t>(v);
  };
  const auto q = weights.find("layers.0.attn.q_proj.weight");
  if (q == weights.end()) throw io::detail::missing_tensor(where, "layers.0.attn.q_proj.weight", label, weights.size());
  require(q->second.shape.size() == 2, where, label + ": layers.0.attn.q_proj.weight", "shape [2hD, C]",
          "shape " + shape_string(q->second.shape));
  const index_t width = q->second.shape[1], vocab = vocabulary(weights, label, width);
  language_model_spec spec{.model = {.vocab_size = vocab, .d_model = width, .eps = number("norm.eps"),
                                     .tie_word_embeddings = text("tie_word_embeddings") == "true"}};
  for (index_t i = 0, n = count("layers"); i < n; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    const auto gate = weights.find(p + "ffn.gate_proj.weight");
    if (gate == weights.end()) throw io::detail::missing_tensor(where, p + "ffn.gate_proj.weight", label, weights.size());
    require(gate->second.shape.size() == 2, where, label + ": " + p + "ffn.gate_proj.weight", "shape [F, C]",
            "shape " + shape_string(gate->second.shape));
    const double eps = number(p + "attn_norm.eps");
    require(number(p + "ffn_norm.eps") == eps, where, label + ": __metadata__." + p + "ffn_norm.eps",
            text(p + "attn_norm.eps") + " (attn_norm's: a DecoderLayer's two norms share eps)", text(p + "ffn_norm.eps"));
    spec.layers.push_back({.attention = {.d_model = width, .heads = count(p + "attn.heads"),
                                         .kv_heads = count(p + "attn.kv_heads"),
                                         .layer_index = static_cast<index_t>(number(p + "attn.layer_index")),
                                         .rope_theta = number(p + "attn.rope_theta"),
                                         .causal = text(p + "attn.causal") == "true",
                                         .head_dim = count(p + "attn.head_dim"),
                                         .subln_eps = number(p + "attn.subln.eps"),
                                         .rope_scaling = recorded_rope_scaling(meta, p + "attn.", where, label)},
                           .ffn_dim = gate->second.shape[0],
                           .eps = eps});
  }
  return spec;
}

// A flag given for a model that records its architecture must agree with it.
void require_flags_agree(const model_flags& flags, const language_model_spec& spec, const std::string& label) {
  const auto& a = spec.first().attention;
  auto agree = [&](bool same, const std::string& flag, const std::string& recorded) {
    if (!same)
      throw CLI::ValidationError(flag, "disagrees with " + label + ", which records " + recorded +
                                           " (leave the flag out: the model's own architecture is used)");
  };
  if (flags.heads) agree(flags.heads == a.heads, "--heads", "h = " + std::to_string(a.heads));
  if (flags.kv_heads) agree(flags.kv_heads == a.kv_heads, "--kv-heads", "g = " + std::to_string(a.kv_heads));
  if (flags.rope_theta)
    agree(*flags.rope_theta == a.rope_theta, "--rope-theta", "rope_theta " + architecture_value(a.rope_theta));
  if (flags.eps) agree(*flags.eps == spec.first().eps, "--eps", "eps " + architecture_value(spec.first().eps));
}

}  // namespace

model_source::model_source(const std::filesystem::path& path, const model_flags& flags) : path_(path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    checkpoint_.emplace(path);
    const auto& c = checkpoint_->config();
    spec_.model = c.language_model();
    for (index_t i = 0; i < c.layers; ++i) spec_.layers.push_back(c.layer(i));
    eos_token_ids_ = io::read_generation_settings(path).eos_token_ids;
    require_flags_agree(flags, spec_, path.string());
  } else {
    file_.emplace(path);
    const auto shapes = shapes_of(*file_);
    if (file_->metadata().count(architecture_marker)) {
      spec_ = spec_from_architecture(file_->metadata(), shapes, file_->label());
      require_flags_agree(flags, spec_, path.string());
    } else {
      spec_ = spec_from_shapes(shapes, file_->label(), flags);
    }
  }
}

CLI::Option* add_model_options(CLI::App& command, std::string& model, model_flags& flags) {
  auto* option = command.add_option(
      "--model,--weights", model,
      "a Hugging Face DiffLlama folder (config.json and model.safetensors, or shards with their index), or a difftx "
      "language model file: one safetensors file under LanguageModel's names (embed_tokens.weight [V, C], "
      "layers.<i>.<decoder_layer names>, norm.weight, lm_head.weight), as `difftx convert` writes it");
  command.add_option("--heads", flags.heads, "heads h of every layer, for a file that does not record them; default: "
                                             "q_proj rows / (2 D) with D from lambda_q1")
      ->check(count_in(1));
  command.add_option("--kv-heads", flags.kv_heads,
                     "key/value groups g, for a file that does not record them; default: k_proj rows / (2 D)")
      ->check(count_in(1));
  command.add_option_function<double>("--rope-theta", [&flags](const double& theta) { flags.rope_theta = theta; },
                                      "RoPE base, for a file that does not record it (default 10000)")
      ->check(positive_finite());
  command.add_option_function<double>("--eps", [&flags](const double& eps) { flags.eps = eps; },
                                      "RMSNorm epsilon of every norm, for a file that does not record it (default 1e-5)")
      ->check(positive_finite());
  return option;
}

void model_source::load_into(language_model_runner& model) const {
  if (checkpoint_)
    model.load(*checkpoint_);
  else
    model.load(*file_);
}

}  // namespace difftx::cli
