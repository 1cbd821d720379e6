// spec_from_weights (weight_shapes.hpp).
#include "weight_shapes.hpp"

#include <algorithm>
#include <vector>

namespace difftx::cli {

namespace {

// A module's weights by name under a prefix ("layers.0."), with the errors that name them.
struct weight_reader {
  const shape_table& weights;
  const std::string& label;
  std::string_view where;
  const std::string& prefix;

  // "<label>: <prefix><name>", as errors name a tensor.
  std::string named(const std::string& name) const { return label + ": " + prefix + name; }
  bool has(const std::string& name) const { return weights.count(prefix + name) > 0; }
  // The shape of a non-empty tensor of this rank.
  const std::vector<index_t>& shape(const std::string& name, std::size_t rank) const {
    const auto it = weights.find(prefix + name);
    if (it == weights.end()) throw io::detail::missing_tensor(where, prefix + name, label, weights.size());
    if (!it->second.decodable) throw io::detail::undecodable_tensor(where, prefix + name, label, it->second.dtype_name);
    const auto& shape = it->second.shape;
    require(shape.size() == rank && std::all_of(shape.begin(), shape.end(), [](index_t e) { return e > 0; }), where,
            named(name), rank == 1 ? "a non-empty vector [n]" : "a non-empty matrix [rows, columns]",
            "shape " + shape_string(shape));
    return shape;
  }
  // heads · D, checked (--heads is at most 2^24, D a file's dimension).
  index_t rows(index_t heads, index_t head_dim, const std::string& name) const {
    return static_cast<index_t>(checked_multiply(static_cast<std::uint64_t>(heads), static_cast<std::uint64_t>(head_dim),
                                                 max_tensor_elements, where, name, "a row count heads · D"));
  }
  // Where spec's `field` was read from: this tensor (bad input if the module rejects it).
  size_origin origin(const std::string& name) const {
    return {.argument = named(name), .detail = "shape " + shape_string(weights.at(prefix + name).shape), .file = true};
  }
};

// V1 (multihead, decoder_layer): D from lambda_q1 [D], h = q_proj rows / 2D
// (or --heads), g = k_proj rows / 2D (or --kv-heads). The standard attention:
// H from --heads, D = q_proj rows / H, G = k_proj rows / D (or --kv-heads).
module_spec attention_from_weights(module_spec s, const weight_reader& w, const std::string& attn,
                                   const std::vector<index_t>& q) {
  auto& a = s.attention;
  const bool given_heads = a.heads > 0;
  const std::string q_name = w.named(attn + "q_proj.weight"), k_name = w.named(attn + "k_proj.weight");
  const index_t maps = s.kind->v1() ? 2 : 1;
  if (maps == 2) {
    a.head_dim = w.shape(attn + "lambda_q1", 1)[0];
    s.origins["head_dim"] = w.origin(attn + "lambda_q1");
    if (!given_heads) a.heads = std::max<index_t>(1, q[0] / (2 * a.head_dim));
    const auto rows = w.rows(2 * a.heads, a.head_dim, q_name);
    require(q[0] == rows, w.where, q_name,
            std::to_string(rows) + " rows = 2·h·D with h = " + std::to_string(a.heads) + (given_heads ? " (--heads)" : "") +
                " and D = " + std::to_string(a.head_dim) + " (from lambda_q1)",
            "shape " + shape_string(q));
  } else {
    require(q[0] % a.heads == 0, w.where, q_name,
            "rows = H·D divisible by H = " + std::to_string(a.heads) + " (--heads)", "shape " + shape_string(q));
    a.head_dim = q[0] / a.heads;
    s.origins["head_dim"] = w.origin(attn + "q_proj.weight");
  }
  if (!given_heads) s.origins["heads"] = w.origin(attn + "q_proj.weight");
  const auto k = w.shape(attn + "k_proj.weight", 2);
  const std::string k_rows_text = maps == 2 ? "2·g·D" : "G·D";
  if (a.kv_heads == 0) {  // from k_proj: its rows are maps · groups · D
    require(k[0] % (maps * a.head_dim) == 0, w.where, k_name,
            "rows = " + k_rows_text + " divisible by " + std::to_string(maps * a.head_dim) + " (D = " +
                std::to_string(a.head_dim) + ")",
            "shape " + shape_string(k));
    a.kv_heads = k[0] / (maps * a.head_dim);
    s.origins["kv_heads"] = w.origin(attn + "k_proj.weight");
  }
  const auto k_rows = w.rows(maps * a.kv_heads, a.head_dim, k_name);
  require(k[0] == k_rows, w.where, k_name,
          std::to_string(k_rows) + " rows = " + k_rows_text + " with " + (maps == 2 ? "g = " : "G = ") +
              std::to_string(a.kv_heads) + " (--kv-heads) and D = " + std::to_string(a.head_dim),
          "shape " + shape_string(k));
  return s;
}

// V2 (multihead_v2, decoder_layer_v2): differential when lambda_proj.weight
// [h, C] is there (h from it), else the baseline (h from --heads); D = q_proj
// rows / (2h) (baseline: / h), checked against o_proj [C, hD]; g = k_proj rows
// / D (or --kv-heads).
module_spec v2_from_weights(module_spec s, const weight_reader& w, const std::string& attn,
                            const std::vector<index_t>& q) {
  auto& a = s.attention;
  const index_t given_heads = a.heads;
  const std::string q_name = w.named(attn + "q_proj.weight"), lambda_name = attn + "lambda_proj.weight";
  s.differential = w.has(lambda_name);
  std::string heads_from = " (--heads)";
  if (s.differential) {
    const auto lambda = w.shape(lambda_name, 2);  // [h, C]
    require(given_heads == 0 || given_heads == lambda[0], w.where, w.named(lambda_name),
            "shape [h, C] with h = " + std::to_string(given_heads) + " (--heads)", "shape " + shape_string(lambda));
    a.heads = lambda[0];
    if (given_heads == 0) {
      heads_from = " (from lambda_proj.weight)";
      s.origins["heads"] = w.origin(lambda_name);
    }
  } else {
    require(given_heads > 0, w.where, w.named(lambda_name),
            "a tensor [h, C] (differential V2), or --heads to run the V2 baseline (differential off) without it",
            "no tensor of that name");
  }
  const index_t query_heads = s.kind->query_heads(s);
  const std::string rows_text = s.differential ? "2·h·D" : "h·D (the V2 baseline: no lambda_proj.weight)";
  require(q[0] % query_heads == 0, w.where, q_name,
          "rows = " + rows_text + " divisible by " + std::to_string(query_heads) + " with h = " +
              std::to_string(a.heads) + heads_from,
          "shape " + shape_string(q));
  a.head_dim = q[0] / query_heads;
  s.origins["head_dim"] = w.origin(attn + "q_proj.weight");
  const std::string o_name = w.named(attn + "o_proj.weight");
  const auto o = w.shape(attn + "o_proj.weight", 2);  // [C, hD]
  const auto o_columns = w.rows(a.heads, a.head_dim, o_name);
  require(o[0] == a.d_model && o[1] == o_columns, w.where, o_name,
          "shape [" + std::to_string(a.d_model) + ", " + std::to_string(o_columns) + "] = [C, h·D] with h = " +
              std::to_string(a.heads) + heads_from + " and D = " + std::to_string(a.head_dim) + " (from q_proj.weight)",
          "shape " + shape_string(o));
  const std::string k_name = w.named(attn + "k_proj.weight");
  const auto k = w.shape(attn + "k_proj.weight", 2);  // [gD, C]
  if (a.kv_heads == 0) {
    require(k[0] % a.head_dim == 0, w.where, k_name,
            "rows = g·D divisible by D = " + std::to_string(a.head_dim) + " (from q_proj.weight)",
            "shape " + shape_string(k));
    a.kv_heads = k[0] / a.head_dim;
    s.origins["kv_heads"] = w.origin(attn + "k_proj.weight");
  } else {
    const auto k_rows = w.rows(a.kv_heads, a.head_dim, k_name);
    require(k[0] == k_rows, w.where, k_name,
            std::to_string(k_rows) + " rows = g·D with g = " + std::to_string(a.kv_heads) + " (--kv-heads) and D = " +
                std::to_string(a.head_dim),
            "shape " + shape_string(k));
  }
  return s;
}

}  // namespace

shape_table shapes_of(const io::tensor_file& file) {
  shape_table shapes;
  for (const auto& [name, t] : file.tensors) shapes[name] = {t.shape, std::string(io::safetensors_name(t.type))};
  for (const auto& [name, dtype] : file.undecodable) shapes[name] = {{}, dtype, false};
  return shapes;
}

shape_table shapes_of(const io::mapped_safetensors& file) {
  shape_table shapes;
  for (const auto& [name, t] : file.tensors()) shapes[name] = {t.shape, t.dtype_name, t.type.has_value()};
  return shapes;
}

module_spec spec_from_weights(const module_spec& given, const shape_table& weights, const std::string& label,
                              std::string_view where, const std::string& prefix) {
  const weight_reader w{weights, label, where, prefix};
  const module_kind& kind = *given.kind;
  module_spec s = given;
  if (kind.parts == module_parts::norm) {
    s.attention.d_model = w.shape("weight", 1)[0];
    return s;
  }
  if (kind.has_ffn()) {
    const std::string gate_name = std::string(kind.ffn_prefix()) + "gate_proj.weight";
    const auto gate = w.shape(gate_name, 2);  // [F, C]
    require(given.ffn_dim == 0 || given.ffn_dim == gate[0], where, w.named(gate_name),
            "shape [F, C] with F = " + std::to_string(given.ffn_dim) + " (--ffn-dim)", "shape " + shape_string(gate));
    s.ffn_dim = gate[0];
    s.attention.d_model = gate[1];
  }
  if (kind.has_attention()) {
    const std::string attn(kind.attention_prefix());
    const auto q = w.shape(attn + "q_proj.weight", 2);  // [2hD, C] (standard: [HD, C]; V2: [2hD, C] or [hD, C])
    s.attention.d_model = q[1];
    s = kind.v2() ? v2_from_weights(s, w, attn, q) : attention_from_weights(s, w, attn, q);
    // What the module itself requires of these sizes (g dividing the query heads,
    // an even D): its own check, naming the tensor a size came from.
    check_config(s, where);
  }
  return s;
}

}  // namespace difftx::cli
