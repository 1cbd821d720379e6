// difftx convert: a Hugging Face DiffLlama folder into one difftx file (the
// tensors under LanguageModel's names in their stored dtypes, the
// architecture in __metadata__, so run and generate need no flags), or such a
// file back into a DiffLlama folder that transformers' from_pretrained loads
// (io/diffllama.hpp). Nothing is written unless the whole conversion succeeds.
#include <filesystem>
#include <memory>
#include <string>

#include <difftx/io/diffllama.hpp>
#include <difftx/io/safetensors.hpp>

#include "commands.hpp"

namespace difftx::cli {

namespace {

struct convert_options {
  std::string input, output;
};

void convert(const convert_options& o) {
  io::remove_temporaries_on_signals();
  std::error_code ec;
  if (std::filesystem::is_directory(o.input, ec)) {
    io::output_files outputs;  // fails now if the output cannot be written, before any work
    const auto file = outputs.add(o.output, "write_safetensors");
    const auto converted = io::diffllama_checkpoint(o.input).to_difftx_file();
    outputs.write(file, [&](std::ostream& out) { io::write_safetensors_to(out, converted); });
    outputs.commit();
    return;
  }
  io::write_diffllama(io::read_safetensors(o.input), o.input, o.output);
}

}  // namespace

void add_convert_command(CLI::App& app) {
  auto o = std::make_shared<convert_options>();
  auto* cmd = app.add_subcommand("convert", "convert a Hugging Face DiffLlama folder to one difftx file, or back");
  cmd->add_option("--input", o->input,
                  "a DiffLlama folder (config.json and model.safetensors, or shards with their index), or a difftx "
                  "language model file (LanguageModel's names, its architecture in the metadata)")
      ->required();
  cmd->add_option("--output", o->output,
                  "for a folder: the difftx .safetensors file to write; for a file: the DiffLlama folder to create "
                  "(absent, or empty)")
      ->required();
  cmd->footer(
      "DiffLlama -> difftx: query and key rows reordered into difftx's (head, map) pairs with interleaved RoPE\n"
      "pairs, value heads into groups, the per-head norm's weight as ones, every dtype kept (docs/semantics.md).\n"
      "difftx -> DiffLlama: the inverse, and config.json; refused where transformers' DiffLlama cannot express\n"
      "the model (one rms_norm_eps for every norm, per-head norm weights all one, layer i at index i, causal).\n" +
      exit_codes_help);
  cmd->callback([o] { convert(*o); });
}

}  // namespace difftx::cli
