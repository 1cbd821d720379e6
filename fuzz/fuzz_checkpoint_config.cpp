// libFuzzer target: a Hugging Face checkpoint folder's JSON files, from the
// input's bytes: io::parse_json_text, then the text as config.json
// (io::parse_diffllama_config) and as model.safetensors.index.json
// (io::parse_weight_map).
//
// input_error is the documented answer to a malformed file: fine. Anything else
// (a sanitizer report, another exception, a stack overflow on deep nesting) is
// a finding. A config the reader accepts must also build its model's layer
// configs as the loader does, and write back (to_json) a config that reads
// back the same.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <difftx/io/checkpoint_folder.hpp>
#include <difftx/io/diffllama_config.hpp>

#include "fuzz_checks.hpp"

namespace {
[[noreturn]] void finding(const char* what) { difftx::fuzz::finding("fuzz_checkpoint_config", what); }
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace io = difftx::io;
  nlohmann::json j;
  try {
    j = io::parse_json_text(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz", "config.json");
  } catch (const difftx::input_error&) {
    return 0;
  }
  try {
    (void)io::parse_weight_map(j, "fuzz", "model.safetensors.index.json");
  } catch (const difftx::input_error&) {
  }
  io::diffllama_config c;
  try {
    c = io::parse_diffllama_config(j, "config.json");
  } catch (const difftx::input_error&) {
    return 0;
  }
  if (c.heads() < 1 || c.groups() < 1 || c.heads() % c.groups() != 0 || c.head_dim % 2 != 0)
    finding("accepted a config whose heads, groups or head size a layer cannot have");
  (void)c.language_model();
  (void)c.layer(c.layers - 1);
  io::diffllama_config back;
  try {
    back = io::parse_diffllama_config(c.to_json(), "config.json (written back)");
  } catch (const difftx::input_error&) {
    finding("cannot read back the config it wrote from an accepted one");
  }
  if (back.rope != c.rope || back.rope_theta != c.rope_theta || back.vocab_size != c.vocab_size ||
      back.layers != c.layers || back.head_dim != c.head_dim || back.kv_heads != c.kv_heads)
    finding("the config written back reads as another");
  return 0;
}
