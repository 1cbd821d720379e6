// spec_from_weights (weight_shapes.hpp).
#include "weight_shapes.hpp"

#include <algorithm>
#include <vector>

namespace difftx::cli {

namespace {

// The V2 kinds (multihead_v2, decoder_layer_v2): differential when
// lambda_proj.weight [h, C] is there (h from it), else the baseline (h from
// --heads); D = q_proj rows / (2h) (baseline: / h), checked against o_proj
// [C, hD]; g = k_proj rows / D (or --kv-heads), dividing the query heads.
// s has C from q_proj.
template <class ShapeOf, class Named, class RowsOf>
module_spec v2_spec_from_weights(module_spec s, const module_spec& given, const std::vector<index_t>& q, ShapeOf&& shape_of,
                                 Named&& named, RowsOf&& rows_of, std::string_view where, const std::string& attn,
                                 bool has_lambda) {
  const std::string q_name = named(attn + "q_proj.weight"), lambda_name = attn + "lambda_proj.weight";
  s.differential = has_lambda;
  std::string heads_from = " (--heads)";
  if (has_lambda) {
    const auto lambda = shape_of(lambda_name, 2);  // [h, C]
    require(given.heads == 0 || given.heads == lambda[0], where, named(lambda_name),
            "shape [h, C] with h = " + std::to_string(given.heads) + " (--heads)", "shape " + shape_string(lambda));
    s.heads = lambda[0];
    if (given.heads == 0) heads_from = " (from lambda_proj.weight)";
  } else {
    require(given.heads > 0, where, named(lambda_name),
            "a tensor [h, C] (differential V2), or --heads to run the V2 baseline (differential off) without it",
            "no tensor of that name");
  }
  const index_t query_heads = s.differential ? 2 * s.heads : s.heads;
  const std::string rows_text = s.differential ? "2·h·D" : "h·D (the V2 baseline: no lambda_proj.weight)";
  require(q[0] % query_heads == 0, where, q_name,
          "rows = " + rows_text + " divisible by " + std::to_string(query_heads) + " with h = " +
              std::to_string(s.heads) + heads_from,
          "shape " + shape_string(q));
  s.head_dim = q[0] / query_heads;
  const auto o = shape_of(attn + "o_proj.weight", 2);  // [C, hD]
  const auto o_columns = rows_of(s.heads, s.head_dim, named(attn + "o_proj.weight"));
  require(o[0] == s.d_model && o[1] == o_columns, where, named(attn + "o_proj.weight"),
          "shape [" + std::to_string(s.d_model) + ", " + std::to_string(o_columns) + "] = [C, h·D] with h = " +
              std::to_string(s.heads) + heads_from + " and D = " + std::to_string(s.head_dim) + " (from q_proj.weight)",
          "shape " + shape_string(o));
  const std::string k_name = named(attn + "k_proj.weight");
  const auto k = shape_of(attn + "k_proj.weight", 2);  // [gD, C]
  if (given.kv_heads == 0) {
    require(k[0] % s.head_dim == 0, where, k_name,
            "rows = g·D divisible by D = " + std::to_string(s.head_dim) + " (from q_proj.weight)",
            "shape " + shape_string(k));
    s.kv_heads = k[0] / s.head_dim;
  } else {
    const auto k_rows = rows_of(given.kv_heads, s.head_dim, k_name);
    require(k[0] == k_rows, where, k_name,
            std::to_string(k_rows) + " rows = g·D with g = " + std::to_string(given.kv_heads) + " (--kv-heads) and D = " +
                std::to_string(s.head_dim),
            "shape " + shape_string(k));
  }
  require(query_heads % s.kv_heads == 0, where, k_name,
          "g = " + std::to_string(s.kv_heads) + " key/value heads dividing the " + std::to_string(query_heads) +
              " query heads",
          "shape " + shape_string(k));
  require(s.head_dim % 2 == 0, where, q_name, "an even head size D (RoPE rotates pairs)",
          "D = " + std::to_string(s.head_dim));
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
  module_spec s = given;
  const std::string& kind = given.kind;
  auto named = [&](const std::string& name) { return label + ": " + prefix + name; };
  auto shape_of = [&](const std::string& name, std::size_t rank) {
    const auto it = weights.find(prefix + name);
    if (it == weights.end()) throw io::detail::missing_tensor(where, prefix + name, label, weights.size());
    if (!it->second.decodable) throw io::detail::undecodable_tensor(where, prefix + name, label, it->second.dtype_name);
    const auto& shape = it->second.shape;
    require(shape.size() == rank && std::all_of(shape.begin(), shape.end(), [](index_t e) { return e > 0; }), where,
            named(name), rank == 1 ? "a non-empty vector [n]" : "a non-empty matrix [rows, columns]",
            "shape " + shape_string(shape));
    return shape;
  };
  // heads · D, checked (--heads is at most 2^24, D a file's dimension).
  auto rows_of = [&](index_t heads, index_t head_dim, const std::string& name) {
    return static_cast<index_t>(checked_multiply(static_cast<std::uint64_t>(heads), static_cast<std::uint64_t>(head_dim),
                                                 max_tensor_elements, where, name, "a row count heads · D"));
  };
  const bool layer = kind == "decoder_layer" || kind == "decoder_layer_v2";
  const std::string attn = layer ? "attn." : "", ffn = layer ? "ffn." : "";
  if (kind == "rmsnorm") {
    s.d_model = shape_of("weight", 1)[0];
    return s;
  }
  if (kind == "swiglu" || layer) {
    const auto gate = shape_of(ffn + "gate_proj.weight", 2);  // [F, C]
    require(given.ffn_dim == 0 || given.ffn_dim == gate[0], where, named(ffn + "gate_proj.weight"),
            "shape [F, C] with F = " + std::to_string(given.ffn_dim) + " (--ffn-dim)", "shape " + shape_string(gate));
    s.ffn_dim = gate[0];
    s.d_model = gate[1];
    if (kind == "swiglu") return s;
  }
  const auto q = shape_of(attn + "q_proj.weight", 2);  // [2hD, C] (attention: [HD, C])
  s.d_model = q[1];
  const std::string q_name = named(attn + "q_proj.weight");
  if (is_v2(kind))
    return v2_spec_from_weights(s, given, q, shape_of, named, rows_of, where, attn,
                                weights.count(prefix + attn + "lambda_proj.weight") > 0);
  const index_t maps = is_differential(kind) ? 2 : 1;
  if (maps == 2) {
    s.head_dim = shape_of(attn + "lambda_q1", 1)[0];
    if (s.heads == 0) s.heads = std::max<index_t>(1, q[0] / (2 * s.head_dim));
    const auto rows = rows_of(2 * s.heads, s.head_dim, q_name);
    require(q[0] == rows, where, q_name,
            std::to_string(rows) + " rows = 2·h·D with h = " + std::to_string(s.heads) +
                (given.heads ? " (--heads)" : "") + " and D = " + std::to_string(s.head_dim) + " (from lambda_q1)",
            "shape " + shape_string(q));
  } else {
    require(q[0] % s.heads == 0, where, q_name,
            "rows = H·D divisible by H = " + std::to_string(s.heads) + " (--heads)", "shape " + shape_string(q));
    s.head_dim = q[0] / s.heads;
  }
  const auto k = shape_of(attn + "k_proj.weight", 2);
  const std::string k_name = named(attn + "k_proj.weight");
  const std::string k_rows_text = maps == 2 ? "2·g·D" : "G·D";
  if (s.kv_heads == 0) {  // from k_proj: its rows are maps · groups · D
    require(k[0] % (maps * s.head_dim) == 0, where, k_name,
            "rows = " + k_rows_text + " divisible by " + std::to_string(maps * s.head_dim) + " (D = " +
                std::to_string(s.head_dim) + ")",
            "shape " + shape_string(k));
    s.kv_heads = k[0] / (maps * s.head_dim);
  }
  const auto k_rows = rows_of(maps * s.kv_heads, s.head_dim, k_name);
  require(k[0] == k_rows, where, k_name,
          std::to_string(k_rows) + " rows = " + k_rows_text + " with " + (maps == 2 ? "g = " : "G = ") +
              std::to_string(s.kv_heads) + " (--kv-heads) and D = " + std::to_string(s.head_dim),
          "shape " + shape_string(k));
  require(s.heads % s.kv_heads == 0, where, k_name,
          (maps == 2 ? "g = " : "G = ") + std::to_string(s.kv_heads) + " key/value groups dividing the " +
              std::to_string(s.heads) + " heads",
          "shape " + shape_string(k));
  require(s.head_dim % 2 == 0, where, q_name, "an even head size D (RoPE rotates pairs)",
          "D = " + std::to_string(s.head_dim));
  return s;
}

}  // namespace difftx::cli
