// A module's sizes read from the shapes of its weights, shared by `difftx run`
// (one module) and `difftx generate` (a language model's layers).
#pragma once

#include <string>
#include <string_view>

#include <difftx/io/tensor_file.hpp>

#include "runner.hpp"

namespace difftx::cli {

// C, D, F and, where `given` leaves them 0, the head count h (q_proj rows /
// 2D with D from lambda_q1), the key/value groups (as many as heads) and F
// (gate_proj rows), of a module of kind given.kind whose weights are
// weights[prefix + name]. Each size is checked against the others and against
// what given says, so a wrong flag (--heads, --kv-heads, --ffn-dim) or a wrong
// file says which: input_error(where, "<label>: <prefix + name>", ...). The
// rest of given (layer index, RoPE base, eps, threads, ...) passes through.
module_spec spec_from_weights(const module_spec& given, const io::tensor_file& weights, const std::string& label,
                              std::string_view where, const std::string& prefix = "");

}  // namespace difftx::cli
