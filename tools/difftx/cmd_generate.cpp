// difftx generate: text generation with a language model, from a Hugging Face
// DiffLlama folder or a difftx file (model_source.hpp), through the library's
// generate (generation/generate.hpp): the prompt in one prefill, then one
// decode step per new token, greedy or sampled, until the folder's
// end-of-sequence token or --max-new-tokens. Prints the new tokens (and their
// text as it is generated, through the folder's tokenizer) and how fast each
// phase ran. --prompts-file generates for every line of a file at once and
// prints one JSON line per prompt.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <difftx/tokenizer/incremental_detokenizer.hpp>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "language_model_runner.hpp"
#include "model_source.hpp"
#include "runner.hpp"  // policy_description
#include "tokenizer.hpp"

namespace difftx::cli {

namespace {

struct generate_options {
  std::string model, text, prompts_file;
  std::vector<index_t> prompt;
  index_t max_new_tokens = 16;
  sampling_options sampling;
  bool ignore_eos = false;
  model_flags flags;
  bool json = false;
  std::string dtype, policy;
  std::string weights_dtype = "same", kv_dtype = "same";  // low-bit inference (low_bit_options.cpp)
  policy_options computing;  // --threads, --bf16-product, --matmul, --amx/--no-amx, --cuda-attention, --packed-weights
};

void require_prompt_in_vocabulary(const std::vector<token_t>& prompt, index_t vocab_size, const std::string& model) {
  for (std::size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= vocab_size)
      throw CLI::ValidationError("--prompt", "token id " + std::to_string(prompt[i]) + " (position " + std::to_string(i) +
                                                 ") is outside the vocabulary [0, " + std::to_string(vocab_size) +
                                                 ") of " + model);
}

// The text of the new tokens, printed as they come: each token's text once,
// whole characters only (tokenizer/incremental_detokenizer.hpp).
class text_stream {
 public:
  explicit text_stream(const text_tokenizer* tokenizer) {
    if (tokenizer) stream_.emplace(*tokenizer);
  }
  void push(token_t t) {
    if (stream_) print(stream_->push(t));
  }
  void finish() {
    if (!stream_) return;
    print(stream_->finish());
    std::printf("\n");
    std::fflush(stdout);
  }

 private:
  static void print(const std::string& text) {
    if (text.empty()) return;
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  }

  std::optional<tokenizer::incremental_detokenizer> stream_;
};

// --prompts-file's lines (a trailing \r dropped); input_error naming the file,
// or the line, for a file that cannot be read, holds no prompt or an empty line.
std::vector<std::string> prompt_lines(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  std::error_code ec;
  require(in.good() && !std::filesystem::is_directory(file, ec), "generate", "--prompts-file " + file,
          "a readable file of prompts, one a line",
          std::filesystem::exists(file, ec) ? "a file that cannot be read" : "no such file");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (line.ends_with('\r')) line.pop_back();
    const std::string where = file + ": line " + std::to_string(lines.size() + 1);
    require(!line.empty(), "generate", where, "a prompt (one a line)", "an empty line");
    lines.push_back(std::move(line));
  }
  require(!lines.empty(), "generate", "--prompts-file " + file, "at least one prompt", "an empty file");
  return lines;
}

// What every JSON output of generate says of the run: the model, how it ran, the generation settings.
nlohmann::json run_fields(const generate_options& o, const model_source& source, const language_model_spec& spec,
                          const language_model_runner& model, const std::string& policy_detail,
                          const std::vector<token_t>& stop_tokens) {
  const auto& l = spec.first();
  const auto& a = l.attention;
  return {{"max_new_tokens", o.max_new_tokens}, {"eos_token_ids", stop_tokens},
          {"temperature", o.sampling.temperature}, {"top_k", o.sampling.top_k}, {"top_p", o.sampling.top_p},
          {"min_p", o.sampling.min_p}, {"repetition_penalty", o.sampling.repetition_penalty},
          {"presence_penalty", o.sampling.presence_penalty}, {"frequency_penalty", o.sampling.frequency_penalty},
          {"model", o.model}, {"model_kind", source.kind()}, {"layers", spec.layers.size()},
          {"vocab_size", spec.model.vocab_size}, {"d_model", a.d_model}, {"heads", a.heads},
          {"kv_heads", a.kv_heads}, {"head_dim", a.head_dim}, {"ffn_dim", l.ffn_dim}, {"policy", o.policy},
          {"policy_detail", policy_detail}, {"dtype", o.dtype}, {"weights_dtype", o.weights_dtype},
          {"kv_dtype", o.kv_dtype}, {"packed_weights", o.computing.packed_weights}, {"threads", model.threads()}};
}

// --prompts-file: every line's prompt (encoded as --text encodes it) decoded
// together; prompt i samples with --seed + i, as `generate --text LINE --seed
// SEED+i` alone would. One JSON line per prompt, in the file's order.
void generate_each_line(const generate_options& o, const std::vector<std::vector<token_t>>& prompts,
                        const text_tokenizer& tokenizer, const language_model_runner& model, nlohmann::json run) {
  std::vector<generation_options> options(prompts.size(), {.max_new_tokens = o.max_new_tokens,
                                                           .stop_tokens = run.at("eos_token_ids").get<std::vector<token_t>>(),
                                                           .sampling = o.sampling});
  for (std::size_t i = 0; i < options.size(); ++i) options[i].sampling.seed = o.sampling.seed + i;
  // Every prompt's first token comes from the one prefill; the rest from decode steps.
  const auto start = std::chrono::steady_clock::now();
  double prefill_ms = 0;
  std::size_t first_tokens = 0;
  const auto generated = model.generate(std::span(prompts), std::span<const generation_options>(options),
                                        [&](std::size_t, token_t) {
                                          if (++first_tokens == prompts.size()) prefill_ms = ms_since(start);
                                        });
  const double decode_ms = ms_since(start) - prefill_ms;
  index_t steps = 0;  // tokens from decode steps
  for (const auto& g : generated) steps += static_cast<index_t>(g.size()) - 1;
  run["prompts"] = prompts.size();
  run["prefill_ms"] = prefill_ms;
  run["decode_ms"] = decode_ms;
  run["decode_tokens_per_s"] = steps > 0 ? nlohmann::json(static_cast<double>(steps) / decode_ms * 1e3) : nlohmann::json();
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const auto& g = generated[i];
    const bool stopped = std::ranges::find(options[i].stop_tokens, g.back()) != options[i].stop_tokens.end();
    auto j = run;
    j.update(nlohmann::json{{"line", i + 1}, {"prompt", prompts[i]}, {"prompt_tokens", prompts[i].size()},
                            {"tokens", g}, {"new_tokens", g.size()}, {"stop", stopped ? "eos" : "length"},
                            {"seed", options[i].sampling.seed}, {"text", tokenizer.decode(g)}});
    std::printf("%s\n", j.dump().c_str());
  }
}

void generate(const generate_options& o) {
  const auto type = checked_dtype(o.dtype, o.policy);
  if (o.flags.heads > 0 && o.flags.kv_heads > 0 && o.flags.heads % o.flags.kv_heads != 0)
    throw CLI::ValidationError("--kv-heads", "must divide --heads " + std::to_string(o.flags.heads));

  const auto lines = o.prompts_file.empty() ? std::vector<std::string>{} : prompt_lines(o.prompts_file);
  const model_source source(o.model, o.flags);
  std::unique_ptr<text_tokenizer> tokenizer;
  std::vector<token_t> prompt(o.prompt.begin(), o.prompt.end());
  if (!o.text.empty()) {
    tokenizer = open_tokenizer(source.folder(), "--text");
    prompt = prompt_ids(o.model, *tokenizer, o.text);
  }
  std::vector<std::vector<token_t>> prompts;
  if (!lines.empty()) tokenizer = open_tokenizer(source.folder(), "--prompts-file");
  for (std::size_t i = 0; i < lines.size(); ++i) try {
      prompts.push_back(prompt_ids(o.model, *tokenizer, lines[i]));
    } catch (const input_error& e) {  // text the tokenizer refuses (not UTF-8): name the line
      throw input_error("generate", o.prompts_file + ": line " + std::to_string(i + 1), e.expected(), e.got());
    }
  auto spec = source.spec();
  spec.weights = storage_of(o.weights_dtype);
  spec.kv_cache = storage_of(o.kv_dtype);
  spec.decodes = true;
  require_prompt_in_vocabulary(prompt, spec.model.vocab_size, o.model);
  const auto model = make_language_model_runner(spec, o.policy, type, o.computing);
  source.load_into(*model);
  const auto kernels = model->kernels();
  const auto policy_detail = policy_description(o.policy, kernels.detail());
  auto run = run_fields(o, source, spec, *model, policy_detail,
                        o.ignore_eos ? std::vector<token_t>{} : source.eos_token_ids());
  add_kernel_fields(run, kernels);
  if (!prompts.empty()) return generate_each_line(o, prompts, *tokenizer, *model, run);

  const auto prompt_tokens = static_cast<index_t>(prompt.size());
  const generation_options options{.max_new_tokens = o.max_new_tokens,
                                   .stop_tokens = run.at("eos_token_ids").get<std::vector<token_t>>(),
                                   .sampling = o.sampling};
  const auto& l = spec.first();
  const auto& a = l.attention;
  if (!o.json)
    std::printf("difftx generate: %s, %zu layers, V = %td, C = %td, h = %td, g = %td, D = %td, F = %td; %s, %s "
                "(weights %s%s, KV cache %s), %d thread%s\n",
                source.kind().c_str(), spec.layers.size(), spec.model.vocab_size, a.d_model, a.heads, a.kv_heads,
                a.head_dim, l.ffn_dim, policy_detail.c_str(), o.dtype.c_str(), o.weights_dtype.c_str(),
                o.computing.packed_weights ? ", the layers' packed for oneDNN" : "", o.kv_dtype.c_str(),
                model->threads(), model->threads() == 1 ? "" : "s");
  if (tokenizer && !o.json) std::printf("prompt: %s\n", joined_ids(prompt).c_str());
  if (tokenizer && !o.json) std::printf("text: ");
  std::fflush(stdout);

  // The first token's time is the prefill's; the rest are decode steps.
  text_stream stream(o.json ? nullptr : tokenizer.get());  // --json: the text is a field
  const auto start = std::chrono::steady_clock::now();
  double prefill_ms = 0;
  const auto generated = model->generate(prompt, options, [&](token_t t) {
    if (prefill_ms == 0) prefill_ms = ms_since(start);
    stream.push(t);
  });
  const double decode_ms = ms_since(start) - prefill_ms;
  stream.finish();
  const auto steps = static_cast<index_t>(generated.size()) - 1;  // every new token after the first
  const bool stopped = std::ranges::find(options.stop_tokens, generated.back()) != options.stop_tokens.end();

  if (o.json) {
    auto j = run;
    j.update(nlohmann::json{{"tokens", generated}, {"prompt", prompt}, {"prompt_tokens", prompt_tokens},
                            {"new_tokens", generated.size()}, {"stop", stopped ? "eos" : "length"},
                            {"seed", o.sampling.seed}, {"prefill_ms", prefill_ms},
                            {"prefill_tokens_per_s", prompt_tokens / prefill_ms * 1e3}, {"decode_steps", steps},
                            {"decode_ms", decode_ms}});
    j["decode_ms_per_token"] = steps > 0 ? nlohmann::json(decode_ms / static_cast<double>(steps)) : nlohmann::json();
    j["decode_tokens_per_s"] = steps > 0 ? nlohmann::json(static_cast<double>(steps) / decode_ms * 1e3) : nlohmann::json();
    if (tokenizer) j["text"] = tokenizer->decode(generated);
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("tokens: %s\n", joined_ids(generated).c_str());
  std::printf("stop: %s\n", stopped ? "end-of-sequence token" : "--max-new-tokens");
  std::printf("prefill: %td prompt tokens in %.3f ms, %.0f tokens/s\n", prompt_tokens, prefill_ms,
              prompt_tokens / prefill_ms * 1e3);
  if (steps > 0)
    std::printf("decode: %td tokens in %.3f ms, %.3f ms/token, %.0f tokens/s\n", steps, decode_ms,
                decode_ms / static_cast<double>(steps), static_cast<double>(steps) / decode_ms * 1e3);
  else
    std::printf("decode: no steps (the one new token comes from the prefill)\n");
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto o = std::make_shared<generate_options>();
  auto* cmd = app.add_subcommand("generate", "text generation with a language model (greedy or sampled), using the KV cache");
  add_model_options(*cmd, o->model, o->flags)->required();
  auto* prompt = cmd->add_option("--prompt", o->prompt, "token ids of the prompt, comma-separated (e.g. 1,2,3), each in [0, V)")
                     ->delimiter(',')
                     ->check(count_in(0));
  auto* text = cmd->add_option("--text", o->text,
                               "the prompt as text, encoded by the tokenizer beside the weights (tokenizer.json, else "
                               "tokenizer.model), beginning with the beginning-of-sequence token once (see difftx "
                               "tokenize); the new tokens are printed as text too");
  prompt->excludes(text);
  auto* prompts_file = cmd->add_option("--prompts-file", o->prompts_file,
                                       "generate for every line of FILE at once, each line's text encoded as --text "
                                       "encodes it; prints one JSON line per prompt, in the file's order (prompt i "
                                       "samples with --seed + i)");
  prompts_file->excludes(prompt)->excludes(text);
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "tokens to generate at most")
      ->check(count_in(1))
      ->capture_default_str();
  cmd->add_option("--temperature", o->sampling.temperature,
                  "sample with this temperature (logits divided by it); 0: greedy, the largest logit")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  auto* top_k = cmd->add_option("--top-k", o->sampling.top_k, "sample among the k most likely tokens only (0: all)")
                    ->check(CLI::NonNegativeNumber)
                    ->capture_default_str();
  auto* top_p = cmd->add_option("--top-p", o->sampling.top_p,
                                "sample among the most likely tokens whose probability reaches p (1: all)")
                    ->check(CLI::Range(std::nextafter(0.0, 1.0), 1.0))
                    ->capture_default_str();
  auto* min_p = cmd->add_option("--min-p", o->sampling.min_p,
                                "sample among the tokens at least min-p times as likely as the most likely (0: all)")
                    ->check(CLI::Range(0.0, 1.0))
                    ->capture_default_str();
  cmd->add_option("--repetition-penalty", o->sampling.repetition_penalty,
                  "transformers' penalty on every token of the prompt or generated so far: a logit x becomes x / r "
                  "if x > 0, else x * r (1: none; greedy too)")
      ->check(CLI::Range(std::nextafter(0.0, 1.0), 1e6))
      ->capture_default_str();
  cmd->add_option("--presence-penalty", o->sampling.presence_penalty,
                  "OpenAI's: the logit of every token generated so far lowered by this (0: none; greedy too)")
      ->check(CLI::Range(-1e6, 1e6))
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", o->sampling.frequency_penalty,
                  "OpenAI's: the logit of a token generated c times so far lowered by c times this (0: none; greedy "
                  "too)")
      ->check(CLI::Range(-1e6, 1e6))
      ->capture_default_str();
  cmd->add_option("--seed", o->sampling.seed,
                  "the sampler's seed: the same seed gives the same tokens on every CPU policy and thread count")
      ->capture_default_str();
  cmd->add_flag("--ignore-eos", o->ignore_eos,
                "go on to --max-new-tokens past the end-of-sequence token (generation_config.json's or "
                "config.json's eos_token_id)");
  add_dtype_option(*cmd, o->dtype);
  add_policy_option(*cmd, o->policy);
  add_policy_options(*cmd, o->computing, "OMP_NUM_THREADS or every core", true);
  add_storage_option(*cmd, "--weights-dtype", o->weights_dtype,
                     "the projections' and the LM head's weights (int8: each output channel's, quantized as they load)");
  add_storage_option(*cmd, "--kv-dtype", o->kv_dtype, "the KV cache's keys and values");
  cmd->add_flag("--json", o->json,
                "print one JSON object: tokens (and text), prefill_ms and prefill_tokens_per_s, decode_ms, "
                "decode_ms_per_token and decode_tokens_per_s, the sizes, policy, dtype and threads");
  cmd->footer(
      "A DiffLlama folder's config.json gives every size; a difftx file gives them in its metadata when difftx\n"
      "wrote it, else V and C come from embed_tokens.weight, the layer count from the layers.<i>. prefixes (layer\n"
      "i gets layer_index i), D, F, h and g from layer 0's weights (or the flags); every layer is checked against\n"
      "them. The first new token comes from the prefill (the head at the prompt's last token only), each further\n"
      "one from a decode step: after the repetition, presence and frequency penalties, the largest logit (the\n"
      "first of equal ones), or with --temperature a draw after temperature, top-k, top-p and min-p, in that\n"
      "order (docs/semantics.md, Generation). Generation stops after an end-of-sequence token (printed; the\n"
      "folder's eos_token_id, as transformers reads it) unless --ignore-eos. Prints the new token ids (and with\n"
      "--text their text as it comes), the prefill's prompt tokens per second and the decode steps' time per\n"
      "token (one run, no warm-up: what a user waits). --prompts-file decodes its prompts together, each as it\n"
      "would be alone, and prints one JSON object a line: line, prompt, tokens, text, stop, and the batch's\n"
      "prefill_ms, decode_ms and decode_tokens_per_s.\n" +
      exit_codes_help);
  cmd->callback([o, prompt, text, prompts_file, top_k, top_p, min_p] {
    if (!prompt->count() && !text->count() && !prompts_file->count())
      throw CLI::RequiredError("--prompt, --text or --prompts-file");
    if (o->sampling.temperature == 0)
      for (auto* option : {top_k, top_p, min_p})
        if (option->count())
          throw CLI::ValidationError(option->get_name(), "applies to sampling: give --temperature > 0 as well");
    if (prompt->count() && o->prompt.empty()) throw CLI::ValidationError("--prompt", "needs at least one token id");
    generate(*o);
  });
}

}  // namespace difftx::cli
