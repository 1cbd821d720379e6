// Hugging Face DiffLlama checkpoints in and out: a folder that transformers'
// DiffLlamaForCausalLM.save_pretrained writes (config.json, model.safetensors
// or shards with model.safetensors.index.json) read into a LanguageModel of
// DecoderLayers, and a difftx language model file written back as such a
// folder. The mapping and why it is exact: docs/semantics.md, "Hugging Face
// DiffLlama checkpoints".
//
//   auto model = difftx::io::load_diffllama<float, difftx::policy::simd>("DiffLlama-0.3B/");
//   Tensor<float, 3> logits(model.output_shape(tokens.shape()));
//   model.forward(tokens, logits);
//
// Reading maps, it does not copy: each tensor is decoded from the mapped file
// straight into the model's parameter, its rows reordered on the way (the
// query and key heads into difftx's (head, map) pairs and each head's
// rotate-half RoPE layout into interleaved pairs; the value heads into
// groups), and its pages given back once decoded. Every name, dtype and shape
// the config implies is checked before the model is built.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "difftx/io/checkpoint_folder.hpp"
#include "difftx/io/diffllama_config.hpp"
#include "difftx/io/parameters.hpp"
#include "difftx/io/safetensors.hpp"

namespace difftx::io {

namespace detail {

// Where difftx's rows of one layer's projections are in the checkpoint:
// q[r] is the checkpoint row of difftx's q_proj row r, and so for k and v.
struct diffllama_rows {
  std::vector<index_t> q, k, v;

  explicit diffllama_rows(const diffllama_config& c) {
    const index_t h = c.heads(), g = c.groups(), D = c.head_dim;
    // Element e of a difftx head (pairs 2j, 2j + 1) is element j or j + D/2 of
    // transformers' head (pairs j, j + D/2): the same rotation, other places.
    auto rotate_half = [D](index_t e) { return e % 2 == 0 ? e / 2 : e / 2 + D / 2; };
    // difftx's heads (head, map, e) are transformers' head map·heads + head.
    auto heads_of = [&](index_t heads) {
      std::vector<index_t> rows;
      for (index_t i = 0; i < heads; ++i)
        for (index_t m = 0; m < 2; ++m)
          for (index_t e = 0; e < D; ++e) rows.push_back((m * heads + i) * D + rotate_half(e));
      return rows;
    };
    q = heads_of(h);
    k = heads_of(g);
    // Group j's 2D values are transformers' value heads j and j + g, one after the other.
    for (index_t j = 0; j < g; ++j)
      for (index_t t = 0; t < 2 * D; ++t) v.push_back((t < D ? j : j + g) * D + t % D);
  }
};

// One of difftx's parameters and where it comes from: the checkpoint's
// tensor `theirs` (empty: the per-head norm's weight, which transformers does
// not have: ones) with its rows in `order` (empty: as stored).
struct diffllama_tensor {
  std::string ours, theirs;
  std::vector<index_t> shape;
  std::span<const index_t> order;
};

inline std::vector<diffllama_tensor> diffllama_tensors(const diffllama_config& c, const diffllama_rows& rows) {
  const index_t V = c.vocab_size, C = c.hidden_size, F = c.intermediate_size, D = c.head_dim;
  const index_t HD = c.attention_heads * D, KD = c.kv_heads * D;
  std::vector<diffllama_tensor> all{{"embed_tokens.weight", "model.embed_tokens.weight", {V, C}, {}}};
  for (index_t i = 0; i < c.layers; ++i) {
    const std::string ours = "layers." + std::to_string(i) + ".", theirs = "model.layers." + std::to_string(i) + ".";
    const std::string attn = theirs + "self_attn.";
    all.push_back({ours + "attn_norm.weight", theirs + "input_layernorm.weight", {C}, {}});
    all.push_back({ours + "attn.q_proj.weight", attn + "q_proj.weight", {HD, C}, rows.q});
    all.push_back({ours + "attn.k_proj.weight", attn + "k_proj.weight", {KD, C}, rows.k});
    all.push_back({ours + "attn.v_proj.weight", attn + "v_proj.weight", {KD, C}, rows.v});
    all.push_back({ours + "attn.out_proj.weight", attn + "o_proj.weight", {C, HD}, {}});
    for (const char* lambda : {"lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"})
      all.push_back({ours + "attn." + lambda, attn + lambda, {D}, {}});
    all.push_back({ours + "attn.subln.weight", "", {2 * D}, {}});
    all.push_back({ours + "ffn_norm.weight", theirs + "post_attention_layernorm.weight", {C}, {}});
    all.push_back({ours + "ffn.gate_proj.weight", theirs + "mlp.gate_proj.weight", {F, C}, {}});
    all.push_back({ours + "ffn.up_proj.weight", theirs + "mlp.up_proj.weight", {F, C}, {}});
    all.push_back({ours + "ffn.down_proj.weight", theirs + "mlp.down_proj.weight", {C, F}, {}});
  }
  all.push_back({"norm.weight", "model.norm.weight", {C}, {}});
  if (!c.tie_word_embeddings) all.push_back({"lm_head.weight", "lm_head.weight", {V, C}, {}});
  return all;
}

// The sizes behind a tensor's shape, for errors: what config.json says.
inline std::string config_sizes(const diffllama_config& c) {
  return "config.json: vocab_size " + std::to_string(c.vocab_size) + ", hidden_size " + std::to_string(c.hidden_size) +
         ", intermediate_size " + std::to_string(c.intermediate_size) + ", num_attention_heads " +
         std::to_string(c.attention_heads) + ", num_key_value_heads " + std::to_string(c.kv_heads) + ", head_dim " +
         std::to_string(c.head_dim);
}

}  // namespace detail

// A DiffLlama checkpoint folder seen under difftx's names: a tensor_source
// (io/parameters.hpp) for load_parameters, which decodes each tensor straight
// from the mapped file. Opening reads config.json (diffllama_config.hpp) and
// checks every tensor the config implies: input_error("read_diffllama",
// "<file>: <tensor>", ...) for one that is missing, in a dtype difftx does not
// decode, or of another shape.
class diffllama_checkpoint {
 public:
  explicit diffllama_checkpoint(const std::filesystem::path& folder)
      : label_(folder.string()),
        config_(read_diffllama_config(folder)),
        weights_(folder),
        rows_(config_),
        tensors_(detail::diffllama_tensors(config_, rows_)),
        ones_(static_cast<std::size_t>(2 * config_.head_dim), 1.0f) {
    constexpr std::string_view where = "read_diffllama";
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      const auto& t = tensors_[i];
      index_[t.ours] = i;
      if (t.theirs.empty()) continue;
      require(weights_.contains(t.theirs), where, weights_.weights_file() + ": " + t.theirs,
              "a tensor named '" + t.theirs + "' (" + detail::config_sizes(config_) + ", num_hidden_layers " +
                  std::to_string(config_.layers) + ")",
              "none");
      const auto stored = weights_.at(t.theirs, where);
      stored.require_decodable(where, weights_.file_of(t.theirs) + ": " + t.theirs, weights_.file_of(t.theirs));
      require(std::ranges::equal(stored.shape, t.shape), where, weights_.file_of(t.theirs) + ": " + t.theirs,
              "shape " + shape_string(t.shape) + " (" + detail::config_sizes(config_) + ")",
              "shape " + shape_string(stored.shape));
    }
  }

  const diffllama_config& config() const noexcept { return config_; }
  // The folder, as errors name it.
  const std::string& label() const noexcept { return label_; }

  // difftx's tensor `name` (LanguageModel's names): the checkpoint's, rows reordered.
  tensor_ref at(const std::string& name, std::string_view where = "read_diffllama") const {
    const auto it = index_.find(name);
    if (it == index_.end()) throw io::detail::missing_tensor(where, name, label_, index_.size());
    const auto& t = tensors_[it->second];
    if (t.theirs.empty()) return {"F32", dtype::f32, t.shape, std::as_bytes(std::span(ones_))};
    auto stored = weights_.at(t.theirs, where);
    stored.row_order = t.order;
    return stored;
  }
  void release(const tensor_ref& t) const noexcept { weights_.release(t); }

  // Every tensor under difftx's names, each in its stored dtype with its rows
  // in difftx's order (the per-head norm's ones in the dtype of its layer's
  // q_proj), and the model's architecture as metadata: the single file
  // `difftx convert` writes.
  tensor_file to_difftx_file() const {
    tensor_file file;
    dtype layer_type = dtype::f32;
    for (const auto& t : tensors_) {
      if (t.theirs.empty()) {
        file.tensors[t.ours] = stored_tensor::from_values(layer_type, t.shape, std::vector<double>(ones_.size(), 1.0));
        continue;
      }
      const auto ref = at(t.ours);
      if (t.ours.ends_with("attn.q_proj.weight")) layer_type = *ref.type;
      file.tensors[t.ours] = stored_tensor{*ref.type, t.shape, ref.ordered_bytes()};
      release(ref);
    }
    std::vector<DecoderLayerConfig> layers;
    for (index_t i = 0; i < config_.layers; ++i) layers.push_back(config_.layer(i));
    describe_architecture(file.metadata, "", config_.language_model(), std::span<const DecoderLayerConfig>(layers));
    file.metadata[architecture_marker] = architecture_version;
    return file;
  }

 private:
  std::string label_;
  diffllama_config config_;
  checkpoint_folder weights_;
  detail::diffllama_rows rows_;
  std::vector<detail::diffllama_tensor> tensors_;
  std::map<std::string, std::size_t> index_;  // difftx's name -> tensors_
  std::vector<float> ones_;                   // the per-head norm's weight
};

// The LanguageModel a DiffLlama checkpoint is: its layers run on the run-time
// head size (difftx::dynamic: the same kernels as a compiled one).
template <Scalar T, class Policy = policy::reference>
using diffllama_model = LanguageModel<DecoderLayer<T, dynamic, Policy>>;

// The model config describes, parameters left zero (to be loaded).
template <Scalar T, class Policy = policy::reference>
diffllama_model<T, Policy> make_diffllama_model(const diffllama_config& config, const Policy& policy = {}) {
  const uninitialised_parameters loaded_next;
  std::vector<DecoderLayer<T, dynamic, Policy>> layers;
  layers.reserve(static_cast<std::size_t>(config.layers));
  for (index_t i = 0; i < config.layers; ++i) layers.emplace_back(config.layer(i), policy);
  return diffllama_model<T, Policy>(config.language_model(), std::move(layers));
}

// The checkpoint in `folder` as a model in T on `policy`: every value
// rounded to T as io::load_parameters does (a copy where the file's dtype is
// T's own).
template <Scalar T, class Policy = policy::reference>
diffllama_model<T, Policy> load_diffllama(const std::filesystem::path& folder, const Policy& policy = {}) {
  const diffllama_checkpoint checkpoint(folder);
  auto model = make_diffllama_model<T>(checkpoint.config(), policy);
  load_parameters(model, checkpoint);
  return model;
}

namespace detail {

// A difftx language model file's architecture (its __metadata__, as
// describe(LanguageModel) writes it) as a DiffLlama config; input_error naming
// the key where the model is not one transformers' DiffLlama can express.
inline diffllama_config diffllama_config_of(const tensor_file& file, const std::string& label) {
  constexpr std::string_view where = "write_diffllama";
  auto meta = [&](const std::string& key) -> const std::string& {
    const auto it = file.metadata.find(key);
    require(it != file.metadata.end(), where, label + ": __metadata__." + key,
            "the architecture of a difftx language model (written by difftx: store_parameters, convert)", "none");
    return it->second;
  };
  auto number = [&](const std::string& key) {
    double v = 0;
    const auto& text = meta(key);
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), v);
    require(error == std::errc() && end == text.data() + text.size() && std::isfinite(v), where,
            label + ": __metadata__." + key, "a number", "'" + text + "'");
    return v;
  };
  auto count = [&](const std::string& key) { return static_cast<index_t>(number(key)); };
  auto same = [&](const std::string& key, double expected, const std::string& why) {
    const double v = number(key);
    require(v == expected, where, label + ": __metadata__." + key, architecture_value(expected) + " (" + why + ")",
            meta(key));
  };
  auto shape = [&](const std::string& name) { return file.at(name, where, label).shape; };

  meta(architecture_marker);
  diffllama_config c;
  c.layers = count("layers");
  require(c.layers >= 1, where, label + ": __metadata__.layers", "at least one layer", meta("layers"));
  const auto& embed = shape("embed_tokens.weight");
  require(embed.size() == 2, where, label + ": embed_tokens.weight", "shape [V, C]", "shape " + shape_string(embed));
  c.vocab_size = embed[0];
  c.hidden_size = embed[1];
  c.intermediate_size = shape("layers.0.ffn.gate_proj.weight").at(0);
  c.attention_heads = 2 * count("layers.0.attn.heads");
  c.kv_heads = 2 * count("layers.0.attn.kv_heads");
  c.head_dim = count("layers.0.attn.head_dim");
  c.rope_theta = number("layers.0.attn.rope_theta");
  c.rope = recorded_rope_scaling(file.metadata, "layers.0.attn.", where, label);
  c.rms_norm_eps = number("norm.eps");
  c.tie_word_embeddings = meta("tie_word_embeddings") == "true";
  c.dtype = std::string(dtype_name(file.at("embed_tokens.weight", where, label).type));
  const std::string one_eps = "transformers' DiffLlama has one rms_norm_eps for every norm";
  for (index_t i = 0; i < c.layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    same(p + "attn.heads", double(c.heads()), "layer 0's: one head count for every layer");
    same(p + "attn.kv_heads", double(c.groups()), "layer 0's: one group count for every layer");
    same(p + "attn.head_dim", double(c.head_dim), "layer 0's");
    same(p + "attn.rope_theta", c.rope_theta, "layer 0's");
    require(recorded_rope_scaling(file.metadata, p + "attn.", where, label) == c.rope, where,
            label + ": __metadata__." + p + "attn.rope_*", "layer 0's RoPE scaling (transformers' DiffLlama has one)",
            "another");
    same(p + "attn.layer_index", double(i), "transformers sets lambda_init from the layer's position");
    require(meta(p + "attn.causal") == "true", where, label + ": __metadata__." + p + "attn.causal",
            "true (a causal language model)", meta(p + "attn.causal"));
    for (const char* norm : {"attn_norm.eps", "ffn_norm.eps", "attn.subln.eps"}) same(p + norm, c.rms_norm_eps, one_eps);
    const auto ones = file.at(p + "attn.subln.weight", where, label).values();
    const auto other = std::ranges::find_if(ones, [](double w) { return w != 1.0; });
    require(other == ones.end(), where, label + ": " + p + "attn.subln.weight",
            "all ones (transformers' per-head norm has no weight)",
            other == ones.end() ? "" : std::to_string(*other) + " at " + std::to_string(other - ones.begin()));
  }
  return c;
}

}  // namespace detail

// `file`, a difftx language model (LanguageModel's names and its architecture
// in __metadata__: what store_parameters or `difftx convert` writes), as a
// DiffLlama folder that transformers' from_pretrained loads: config.json and
// one model.safetensors, each tensor in its stored dtype with its rows in
// transformers' order. The folder is written whole or not at all (an existing
// folder must be empty); input_error("write_diffllama", ...) names the key or
// tensor transformers' DiffLlama cannot express (differing eps, a subln weight
// other than ones, a layer index other than its position, a non-causal layer).
inline void write_diffllama(const tensor_file& file, const std::string& label, const std::filesystem::path& folder) {
  constexpr std::string_view where = "write_diffllama";
  const auto config = detail::diffllama_config_of(file, label);
  const detail::diffllama_rows rows(config);
  tensor_file out;
  out.metadata["format"] = "pt";  // what transformers' loader expects of a safetensors file
  for (const auto& t : detail::diffllama_tensors(config, rows)) {
    if (t.theirs.empty()) continue;
    const auto& stored = file.at(t.ours, where, label);
    require(stored.shape == t.shape, where, label + ": " + t.ours,
            "shape " + shape_string(t.shape) + " (from the file's architecture)", "shape " + shape_string(stored.shape));
    // transformers' row order[r] holds difftx's row r.
    auto bytes = stored.bytes;
    if (!t.order.empty()) {
      const std::size_t row_bytes = bytes.size() / t.order.size();
      for (std::size_t r = 0; r < t.order.size(); ++r)
        std::copy_n(stored.bytes.begin() + static_cast<std::ptrdiff_t>(r * row_bytes), row_bytes,
                    bytes.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(t.order[r]) * row_bytes));
    }
    out.tensors[t.theirs] = stored_tensor{stored.type, t.shape, std::move(bytes)};
  }
  output_folder written(folder, where);
  written.write("config.json", [&](std::ostream& o) { o << config.to_json().dump(2) << "\n"; });
  written.write("model.safetensors", [&](std::ostream& o) { write_safetensors_to(o, out); });
  written.commit();
}

}  // namespace difftx::io
