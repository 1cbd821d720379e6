// --model PATH for run, generate and bench: a Hugging Face DiffLlama folder
// (config.json beside its safetensors weights) or a difftx language model
// file (one safetensors file under LanguageModel's names). Opening reads
// and checks everything the model's shape depends on, maps the weights
// (nothing is read yet) and says what model they make; load_into then
// decodes them straight into a built model.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <difftx/io/diffllama.hpp>
#include <difftx/io/mapped_safetensors.hpp>

#include "language_model_runner.hpp"

namespace difftx::cli {

// What the command line may say of a difftx file without an architecture in
// its metadata (0: read from the weights). For a file or folder that records
// its architecture, a flag that disagrees with it is a usage error.
struct model_flags {
  index_t heads = 0, kv_heads = 0;
  std::optional<double> rope_theta = {}, eps = {};
};

class model_source {
 public:
  model_source(const std::filesystem::path& path, const model_flags& flags);

  const language_model_spec& spec() const noexcept { return spec_; }
  // "DiffLlama folder" or "difftx file", for the report line.
  std::string kind() const { return checkpoint_ ? "DiffLlama folder" : "difftx file"; }
  const std::filesystem::path& path() const noexcept { return path_; }
  // The folder beside the weights, where a tokenizer may lie.
  std::filesystem::path folder() const { return checkpoint_ ? path_ : path_.parent_path(); }
  // The end-of-sequence ids of a DiffLlama folder, as transformers reads them
  // (io::read_generation_settings: generation_config.json where there is one,
  // else config.json; one id or a list); empty where it names none.
  const std::vector<token_t>& eos_token_ids() const noexcept { return eos_token_ids_; }

  void load_into(language_model_runner& model) const;

 private:
  std::filesystem::path path_;
  std::optional<io::diffllama_checkpoint> checkpoint_;
  std::optional<io::mapped_safetensors> file_;
  std::vector<token_t> eos_token_ids_;
  language_model_spec spec_;
};

// bench --model (bench_model.cpp): prefill and decode of a real model.
struct model_bench_options {
  std::string model, dtype;
  std::vector<std::string> policies;
  policy_options computing;
  std::string weights_dtype = "same", kv_dtype = "same";  // language_model_spec's weights and kv_cache, by name
  model_flags flags;
  index_t prompt_tokens = 128, new_tokens = 32;
  int repeats = 10;
  bool json = false;
};
void bench_model(const model_bench_options& o);

// --model PATH and the flags for a file that does not record its
// architecture (--heads, --kv-heads, --rope-theta, --eps), into model and
// flags; returns --model's option.
CLI::Option* add_model_options(CLI::App& command, std::string& model, model_flags& flags);

}  // namespace difftx::cli
