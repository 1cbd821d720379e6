// The config.json of a Hugging Face DiffLlama checkpoint (transformers'
// DiffLlamaConfig), checked, and what it means in difftx's terms: H query
// heads of head_dim are h = H/2 differential heads, Hkv key/value heads are
// g = Hkv/2 groups, head_dim is the half head size D (docs/semantics.md,
// "Hugging Face DiffLlama checkpoints"). Both spellings transformers has used
// are read: rope_parameters (5.x) and the top-level rope_theta and
// rope_scaling (4.x); written files carry both, so either version reads them.
//
// Every key difftx cannot honour is refused with input_error("read_diffllama",
// "<config.json>: <key>", ...) naming it: another model_type, a hidden_act
// other than silu, attention_bias, a RoPE type other than default, linear or
// llama3, partial rotary embeddings, an odd or non-dividing head count.
#pragma once

#include <cmath>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "difftx/io/checkpoint_folder.hpp"
#include "difftx/modules/decoder_layer.hpp"
#include "difftx/modules/language_model.hpp"

namespace difftx::io {

struct diffllama_config {
  index_t vocab_size = 0;         // V
  index_t hidden_size = 0;        // C
  index_t intermediate_size = 0;  // F
  index_t layers = 0;             // L
  index_t attention_heads = 0;    // H query heads: two per differential head
  index_t kv_heads = 0;           // Hkv key/value heads: two per group
  index_t head_dim = 0;           // D, of each query/key/value head
  double rms_norm_eps = 1e-5;     // every RMSNorm: both of each layer, the per-head one, the final one
  double rope_theta = 10000.0;
  rope_scaling rope = {};         // rope_type default, linear or llama3 and its parameters
  bool tie_word_embeddings = false;
  std::string dtype;              // as config.json says ("bfloat16", ...), "" when it does not

  index_t heads() const noexcept { return attention_heads / 2; }  // h
  index_t groups() const noexcept { return kv_heads / 2; }        // g

  LanguageModelConfig language_model() const {
    return {.vocab_size = vocab_size, .d_model = hidden_size, .eps = rms_norm_eps,
            .tie_word_embeddings = tie_word_embeddings};
  }
  // Layer i (0-based, as transformers counts it for lambda_init).
  DecoderLayerConfig layer(index_t i) const {
    return {.attention = {.d_model = hidden_size, .heads = heads(), .kv_heads = groups(), .layer_index = i,
                          .rope_theta = rope_theta, .causal = true, .head_dim = head_dim,
                          .subln_eps = rms_norm_eps, .rope_scaling = rope},
            .ffn_dim = intermediate_size,
            .eps = rms_norm_eps};
  }

  // config.json for transformers (and the keys 4.x reads).
  nlohmann::json to_json() const {
    // 5.x's rope_parameters and 4.x's rope_scaling (its "type" spelling for linear, as 4.x wrote it)
    nlohmann::json scaling{{"rope_type", rope_type_name(rope.type)}};
    if (rope.type != rope_type::standard) scaling["factor"] = rope.factor;
    if (rope.type == rope_type::llama3) {
      scaling["low_freq_factor"] = rope.low_freq_factor;
      scaling["high_freq_factor"] = rope.high_freq_factor;
      scaling["original_max_position_embeddings"] = json_number(rope.original_max_positions);
    }
    auto parameters = scaling;
    parameters["rope_theta"] = rope_theta;
    auto legacy_scaling = scaling;
    if (rope.type == rope_type::linear) legacy_scaling = {{"type", "linear"}, {"factor", rope.factor}};
    nlohmann::json j{{"architectures", {"DiffLlamaForCausalLM"}},
                     {"model_type", "diffllama"},
                     {"vocab_size", vocab_size},
                     {"hidden_size", hidden_size},
                     {"intermediate_size", intermediate_size},
                     {"num_hidden_layers", layers},
                     {"num_attention_heads", attention_heads},
                     {"num_key_value_heads", kv_heads},
                     {"head_dim", head_dim},
                     {"hidden_act", "silu"},
                     {"rms_norm_eps", rms_norm_eps},
                     {"rope_parameters", parameters},
                     {"rope_theta", rope_theta},
                     {"rope_scaling", rope.type == rope_type::standard ? nlohmann::json(nullptr) : legacy_scaling},
                     {"tie_word_embeddings", tie_word_embeddings},
                     {"attention_bias", false},
                     {"attention_dropout", 0.0}};
    if (!dtype.empty()) j["dtype"] = j["torch_dtype"] = dtype;
    return j;
  }

 private:
  // A whole number as a JSON integer (transformers checks that
  // original_max_position_embeddings is an int), anything else as a double.
  static nlohmann::json json_number(double v) {
    return v == std::floor(v) && std::abs(v) < 9e15 ? nlohmann::json(static_cast<long long>(v)) : nlohmann::json(v);
  }
};

namespace detail {

// Reads config.json's keys, each error naming the file and the key.
class config_reader {
 public:
  config_reader(const nlohmann::json& j, std::string label) : j_(j), label_(std::move(label)) {
    if (!j_.is_object()) fail("", "a JSON object", j_.type_name());
  }

  [[noreturn]] void fail(const std::string& key, const std::string& expected, const std::string& got) const {
    throw input_error("read_diffllama", key.empty() ? label_ : label_ + ": " + key, expected, got);
  }
  // j's value at key, null when it is absent.
  const nlohmann::json& at(const nlohmann::json& object, const std::string& key) const {
    static const nlohmann::json null;
    const auto it = object.find(key);
    return it == object.end() ? null : *it;
  }
  const nlohmann::json& at(const std::string& key) const { return at(j_, key); }

  index_t count(const std::string& key, std::optional<index_t> otherwise = std::nullopt) const {
    const auto& v = at(key);
    if (v.is_null()) {
      if (otherwise) return *otherwise;
      fail(key, "a count (the key is required)", "none");
    }
    if (!v.is_number_integer() || v.get<long long>() < 1 || v.get<long long>() > (index_t{1} << 24))
      fail(key, "a whole number in [1, 2^24]", v.dump());
    return v.get<index_t>();
  }
  double positive(const nlohmann::json& v, const std::string& key, double otherwise) const {
    if (v.is_null()) return otherwise;
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
      fail(key, "a finite number > 0", v.dump());
    return v.get<double>();
  }
  bool flag(const std::string& key, bool otherwise) const {
    const auto& v = at(key);
    if (v.is_null()) return otherwise;
    if (!v.is_boolean()) fail(key, "true or false", v.dump());
    return v.get<bool>();
  }
  std::string text(const nlohmann::json& v, const std::string& key, const std::string& otherwise) const {
    if (v.is_null()) return otherwise;
    if (!v.is_string()) fail(key, "a string", v.dump());
    return v.get<std::string>();
  }

 private:
  const nlohmann::json& j_;
  std::string label_;
};

// rope_theta and the scaling from rope_parameters (5.x) or the top-level
// rope_theta and rope_scaling (4.x). yarn, longrope and dynamic are refused:
// their frequencies (and yarn's attention factor, dynamic's dependence on the
// sequence length) are not implemented.
inline void read_rope(const config_reader& r, diffllama_config& c) {
  const bool current = !r.at("rope_parameters").is_null();
  const std::string where = current ? "rope_parameters" : "rope_scaling";
  const auto& rope = r.at(where);
  if (!rope.is_null() && !rope.is_object()) r.fail(where, "an object (or null)", rope.dump());
  c.rope_theta = r.positive(current && rope.contains("rope_theta") ? rope["rope_theta"] : r.at("rope_theta"),
                            current && rope.contains("rope_theta") ? where + ".rope_theta" : "rope_theta", 10000.0);
  if (rope.is_null()) return;
  const std::string type_key = rope.contains("rope_type") ? "rope_type" : "type";
  const auto type = r.text(r.at(rope, type_key), where + "." + type_key, "default");
  const auto required = [&](const char* key, const char* what) {
    if (r.at(rope, key).is_null()) r.fail(where + "." + key, what, "none");
    return r.positive(rope[key], where + "." + key, 1.0);
  };
  if (type == "linear") {
    c.rope = {.type = rope_type::linear, .factor = required("factor", "the linear scaling factor")};
  } else if (type == "llama3") {
    c.rope = {.type = rope_type::llama3,
              .factor = required("factor", "llama3's scaling factor"),
              .low_freq_factor = required("low_freq_factor", "llama3's low_freq_factor"),
              .high_freq_factor = required("high_freq_factor", "llama3's high_freq_factor"),
              .original_max_positions =
                  required("original_max_position_embeddings", "llama3's original context length")};
    if (!(c.rope.high_freq_factor > c.rope.low_freq_factor))
      r.fail(where + ".high_freq_factor", "more than low_freq_factor (" + std::to_string(c.rope.low_freq_factor) + ")",
             std::to_string(c.rope.high_freq_factor));
  } else if (type != "default") {
    r.fail(where + "." + type_key, "default, linear or llama3 (the RoPE types difftx implements)", "'" + type + "'");
  }
  const double partial = r.positive(r.at(rope, "partial_rotary_factor"), where + ".partial_rotary_factor", 1.0);
  if (partial != 1.0)
    r.fail(where + ".partial_rotary_factor", "1 (RoPE on every dimension, as DiffLlama does)", std::to_string(partial));
}

}  // namespace detail

// config.json's content as a diffllama_config; `label` (the file) names errors.
inline diffllama_config parse_diffllama_config(const nlohmann::json& j, const std::string& label) {
  const detail::config_reader r(j, label);
  const auto model_type = r.text(r.at("model_type"), "model_type", "");
  if (model_type != "diffllama")
    r.fail("model_type", "diffllama (a transformers DiffLlama checkpoint)",
           model_type.empty() ? "none" : "'" + model_type + "'");
  diffllama_config c;
  c.vocab_size = r.count("vocab_size");
  c.hidden_size = r.count("hidden_size");
  c.intermediate_size = r.count("intermediate_size");
  c.layers = r.count("num_hidden_layers");
  c.attention_heads = r.count("num_attention_heads");
  c.kv_heads = r.count("num_key_value_heads", c.attention_heads);
  if (c.hidden_size < c.attention_heads)
    r.fail("hidden_size", "at least num_attention_heads (" + std::to_string(c.attention_heads) + ")",
           std::to_string(c.hidden_size));
  c.head_dim = r.count("head_dim", c.hidden_size / c.attention_heads);
  c.rms_norm_eps = r.positive(r.at("rms_norm_eps"), "rms_norm_eps", 1e-5);
  c.tie_word_embeddings = r.flag("tie_word_embeddings", false);
  c.dtype = r.text(r.at("dtype"), "dtype", r.text(r.at("torch_dtype"), "torch_dtype", ""));
  detail::read_rope(r, c);

  // silu and swish are the same function in transformers (x · sigmoid(x)).
  const auto act = r.text(r.at("hidden_act"), "hidden_act", "silu");
  if (act != "silu" && act != "swish") r.fail("hidden_act", "silu (DiffLlama's SwiGLU)", "'" + act + "'");
  if (r.flag("attention_bias", false)) r.fail("attention_bias", "false (difftx's projections have no bias)", "true");
  if (c.attention_heads % 2 != 0)
    r.fail("num_attention_heads", "an even count (a differential head is two query heads)",
           std::to_string(c.attention_heads));
  if (c.kv_heads % 2 != 0)
    r.fail("num_key_value_heads", "an even count (transformers' DiffLlama splits the values in two halves of the heads)",
           std::to_string(c.kv_heads));
  if (c.attention_heads % c.kv_heads != 0)
    r.fail("num_key_value_heads", "a divisor of num_attention_heads (" + std::to_string(c.attention_heads) + ")",
           std::to_string(c.kv_heads));
  if (c.head_dim % 2 != 0)
    r.fail("head_dim", "an even size (RoPE rotates pairs)", std::to_string(c.head_dim));
  return c;
}

inline diffllama_config read_diffllama_config(const std::filesystem::path& folder) {
  const auto path = folder / "config.json";
  return parse_diffllama_config(read_json_file(path, "read_diffllama"), path.string());
}

}  // namespace difftx::io
