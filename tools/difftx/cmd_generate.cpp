// difftx generate: greedy decoding with a language model, from a Hugging Face
// DiffLlama folder or a difftx file (model_source.hpp), using the KV cache:
// the prompt in one prefill, then one decode step per new token. Prints the
// new tokens (and their text, through the folder's tokenizer) and how
// fast each phase ran.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "language_model_runner.hpp"
#include "model_source.hpp"
#include "runner.hpp"  // policy_description
#include "tokenizer.hpp"

namespace difftx::cli {

namespace {

struct generate_options {
  std::string model, text;
  std::vector<index_t> prompt;
  index_t max_new_tokens = 16;
  model_flags flags;
  bool json = false;
  std::string dtype, policy;
  std::string weights_dtype = "same", kv_dtype = "same";  // low-bit inference (low_bit_options.cpp)
};

void require_prompt_in_vocabulary(const std::vector<token_t>& prompt, index_t vocab_size, const std::string& model) {
  for (std::size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= vocab_size)
      throw CLI::ValidationError("--prompt", "token id " + std::to_string(prompt[i]) + " (position " + std::to_string(i) +
                                                 ") is outside the vocabulary [0, " + std::to_string(vocab_size) +
                                                 ") of " + model);
}

void generate(const generate_options& o) {
  const auto type = checked_dtype(o.dtype, o.policy);
  if (!runs_language_models(o.policy))
    throw CLI::ValidationError("--policy", "generate runs on the CPU policies; policy '" + o.policy +
                                               "' has no language model in this tool yet");
  if (o.flags.heads > 0 && o.flags.kv_heads > 0 && o.flags.heads % o.flags.kv_heads != 0)
    throw CLI::ValidationError("--kv-heads", "must divide --heads " + std::to_string(o.flags.heads));

  const model_source source(o.model, o.flags);
  std::unique_ptr<text_tokenizer> tokenizer;
  std::vector<token_t> prompt(o.prompt.begin(), o.prompt.end());
  if (!o.text.empty()) {
    tokenizer = open_tokenizer(source.folder(), "--text");
    prompt = prompt_ids(o.model, *tokenizer, o.text);
  }
  auto spec = source.spec();
  spec.weights = storage_of(o.weights_dtype);
  spec.kv_cache = storage_of(o.kv_dtype);
  spec.decodes = true;
  require_prompt_in_vocabulary(prompt, spec.model.vocab_size, o.model);
  const auto model = make_language_model_runner(spec, o.policy, type);
  source.load_into(*model);

  const auto prompt_tokens = static_cast<index_t>(prompt.size());
  // The last new token is never fed back, so the cache holds one token fewer than the sequence.
  const index_t capacity = prompt_tokens + o.max_new_tokens - 1;
  std::vector<token_t> generated;
  auto start = std::chrono::steady_clock::now();
  generated.push_back(model->prefill(prompt, capacity));
  const double prefill_ms = ms_since(start);
  start = std::chrono::steady_clock::now();
  while (static_cast<index_t>(generated.size()) < o.max_new_tokens) generated.push_back(model->decode(generated.back()));
  const double decode_ms = ms_since(start);
  const index_t steps = o.max_new_tokens - 1;  // decode steps: every new token after the first

  const auto& l = spec.first();
  const auto& a = l.attention;
  if (o.json) {
    nlohmann::json j{{"tokens", generated}, {"prompt", prompt}, {"prompt_tokens", prompt_tokens},
                     {"new_tokens", o.max_new_tokens}, {"prefill_ms", prefill_ms},
                     {"prefill_tokens_per_s", prompt_tokens / prefill_ms * 1e3}, {"decode_steps", steps},
                     {"decode_ms", decode_ms}, {"model", o.model}, {"model_kind", source.kind()},
                     {"layers", spec.layers.size()}, {"vocab_size", spec.model.vocab_size},
                     {"d_model", a.d_model}, {"heads", a.heads}, {"kv_heads", a.kv_heads}, {"head_dim", a.head_dim},
                     {"ffn_dim", l.ffn_dim}, {"policy", o.policy}, {"policy_detail", policy_description(o.policy, model->bf16_product())},
                     {"dtype", o.dtype}, {"weights_dtype", o.weights_dtype}, {"kv_dtype", o.kv_dtype},
                     {"threads", model->threads()}};
    j["decode_ms_per_token"] = steps > 0 ? nlohmann::json(decode_ms / static_cast<double>(steps)) : nlohmann::json();
    j["decode_tokens_per_s"] = steps > 0 ? nlohmann::json(static_cast<double>(steps) / decode_ms * 1e3) : nlohmann::json();
    if (tokenizer) j["text"] = tokenizer->decode(generated);
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("difftx generate: %s, %zu layers, V = %td, C = %td, h = %td, g = %td, D = %td, F = %td; %s, %s "
              "(weights %s, KV cache %s), %d thread%s\n",
              source.kind().c_str(), spec.layers.size(), spec.model.vocab_size, a.d_model, a.heads, a.kv_heads,
              a.head_dim, l.ffn_dim, policy_description(o.policy, model->bf16_product()).c_str(), o.dtype.c_str(),
              o.weights_dtype.c_str(), o.kv_dtype.c_str(), model->threads(), model->threads() == 1 ? "" : "s");
  if (tokenizer) std::printf("prompt: %s\n", joined_ids(prompt).c_str());
  std::printf("tokens: %s\n", joined_ids(generated).c_str());
  if (tokenizer) std::printf("text: %s\n", tokenizer->decode(generated).c_str());
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
  auto* cmd = app.add_subcommand("generate", "greedy decoding with a language model, using the KV cache");
  add_model_options(*cmd, o->model, o->flags)->required();
  auto* prompt = cmd->add_option("--prompt", o->prompt, "token ids of the prompt, comma-separated (e.g. 1,2,3), each in [0, V)")
                     ->delimiter(',')
                     ->check(count_in(0));
  auto* text = cmd->add_option("--text", o->text,
                               "the prompt as text, encoded by the tokenizer beside the weights (tokenizer.json, else "
                               "tokenizer.model), beginning with the beginning-of-sequence token once (see difftx "
                               "tokenize); the new tokens are printed as text too");
  prompt->excludes(text);
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "tokens to generate")
      ->check(count_in(1))
      ->capture_default_str();
  add_dtype_option(*cmd, o->dtype);
  add_policy_option(*cmd, o->policy);
  add_threads_option(*cmd, o->flags.threads, "OMP_NUM_THREADS or every core");
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
      "them. The first new token comes from the prefill's last logits, each further one from a decode step (the\n"
      "largest logit; the first of equal ones). Prints the new token ids, the prefill's prompt tokens per\n"
      "second and the decode steps' time per token (one run, no warm-up: what a user waits).\n" +
      exit_codes_help);
  cmd->callback([o, prompt, text] {
    if (!prompt->count() && !text->count()) throw CLI::RequiredError("--prompt or --text");
    if (prompt->count() && o->prompt.empty()) throw CLI::ValidationError("--prompt", "needs at least one token id");
    generate(*o);
  });
}

}  // namespace difftx::cli
