// The low-bit inference options (docs/semantics.md, "Low-bit inference"):
// --logit-bits, --weights-dtype, --kv-dtype.
#include <string>

#include "commands.hpp"

namespace difftx::cli {

CLI::Option* add_logit_bits_option(CLI::App& command, int& bits) {
  return command
      .add_option("--logit-bits", bits,
                  "quantize the attention logits to B bits (dynamic absmax per query row of each map, the paper's "
                  "section 3.7): 4 to 8, or 16 for not at all")
      ->check(CLI::IsMember({4, 5, 6, 7, 8, 16}))
      ->capture_default_str();
}

CLI::Option* add_storage_option(CLI::App& command, const std::string& name, std::string& storage,
                                const std::string& what) {
  return command.add_option(name, storage, what + ": int8 (a step per vector, docs/semantics.md) or same (--dtype's)")
      ->check(CLI::IsMember({"same", "int8"}))
      ->capture_default_str();
}

inference_dtype storage_of(const std::string& storage) {
  return storage == "int8" ? inference_dtype::int8 : inference_dtype::same;
}

}  // namespace difftx::cli
