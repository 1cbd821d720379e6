// A module's sizes read from the shapes of its weights, shared by `difftx run`
// (one module) and `difftx generate` (a language model's layers).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <difftx/io/mapped_safetensors.hpp>
#include <difftx/io/tensor_file.hpp>

#include "runner.hpp"

namespace difftx::cli {

// Every tensor by name, whatever its dtype: what the sizes are read from.
struct stored_shape {
  std::vector<index_t> shape;  // empty where the dtype is not one difftx decodes and the file did not keep it
  std::string dtype_name;      // as the file spells it
  bool decodable = true;
};
using shape_table = std::map<std::string, stored_shape>;
shape_table shapes_of(const io::tensor_file& file);
shape_table shapes_of(const io::mapped_safetensors& file);

// C, D, F and, where `given` leaves them 0, the head count h (q_proj rows /
// 2D with D from lambda_q1), the key/value groups (k_proj rows / 2D) and F
// (gate_proj rows), of a module of kind *given.kind (module_kinds.hpp) whose
// weights are weights[prefix + name]. Each size is checked against the others
// and against what given says, so a wrong flag (--heads, --kv-heads,
// --ffn-dim) or a wrong file says which: input_error(where, "<label>: <prefix
// + name>", ...); then the module's own check (check_config) on the sizes,
// with spec.origins naming the tensor each was read from. The rest of given
// (layer index, RoPE base, eps, threads, ...) passes through.
module_spec spec_from_weights(const module_spec& given, const shape_table& weights, const std::string& label,
                              std::string_view where, const std::string& prefix = "");

}  // namespace difftx::cli
