// difftx generate: text generation with a language model, from a Hugging Face
// DiffLlama folder or a difftx file (model_source.hpp), through the library's
// generate (generation/generate.hpp): the prompt in one prefill, then one
// decode step per new token, greedy or sampled, until the folder's
// end-of-sequence token or --max-new-tokens. Prints the new tokens (and their
// text as it is generated, through the folder's tokenizer) and how fast each
// phase ran.
#include <algorithm>
#include <chrono>
#include <cmath>
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
  sampling_options sampling;
  bool ignore_eos = false;
  model_flags flags;
  bool json = false;
  std::string dtype, policy;
  std::string weights_dtype = "same", kv_dtype = "same";  // low-bit inference (low_bit_options.cpp)
  policy_options computing;  // --threads, --bf16-product, --matmul, --amx, --cuda-attention, --packed-weights
};

void require_prompt_in_vocabulary(const std::vector<token_t>& prompt, index_t vocab_size, const std::string& model) {
  for (std::size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= vocab_size)
      throw CLI::ValidationError("--prompt", "token id " + std::to_string(prompt[i]) + " (position " + std::to_string(i) +
                                                 ") is outside the vocabulary [0, " + std::to_string(vocab_size) +
                                                 ") of " + model);
}

// The text of the new tokens, printed as they come: each time the new part of
// the decoded text, held back while it ends inside a character (a byte-level
// token may carry part of one; the decoder then ends with U+FFFD).
class text_stream {
 public:
  explicit text_stream(const text_tokenizer* tokenizer) : tokenizer_(tokenizer) {}
  void push(token_t t) {
    ids_.push_back(t);
    if (tokenizer_) print(complete_part(tokenizer_->decode(ids_)));
  }
  void finish() {
    if (!tokenizer_) return;
    print(tokenizer_->decode(ids_));
    std::printf("\n");
    std::fflush(stdout);
  }

 private:
  static std::string complete_part(std::string text) {
    static constexpr std::string_view replacement = "\xEF\xBF\xBD";
    while (text.ends_with(replacement)) text.resize(text.size() - replacement.size());
    return text;
  }
  void print(const std::string& text) {
    if (text.size() <= printed_) return;
    std::fwrite(text.data() + printed_, 1, text.size() - printed_, stdout);
    std::fflush(stdout);
    printed_ = text.size();
  }

  const text_tokenizer* tokenizer_;
  std::vector<token_t> ids_;
  std::size_t printed_ = 0;
};

void generate(const generate_options& o) {
  const auto type = checked_dtype(o.dtype, o.policy);
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
  const auto model = make_language_model_runner(spec, o.policy, type, o.computing);
  source.load_into(*model);
  const auto kernels = model->kernels();
  const auto policy_detail = policy_description(o.policy, kernels.detail());

  const auto prompt_tokens = static_cast<index_t>(prompt.size());
  const generation_options options{.max_new_tokens = o.max_new_tokens,
                                   .stop_tokens = o.ignore_eos ? std::vector<token_t>{} : source.eos_token_ids(),
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
  text_stream stream(tokenizer.get());
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
    nlohmann::json j{{"tokens", generated}, {"prompt", prompt}, {"prompt_tokens", prompt_tokens},
                     {"new_tokens", generated.size()}, {"max_new_tokens", o.max_new_tokens},
                     {"stop", stopped ? "eos" : "length"}, {"eos_token_ids", options.stop_tokens},
                     {"temperature", o.sampling.temperature}, {"top_k", o.sampling.top_k},
                     {"top_p", o.sampling.top_p}, {"seed", o.sampling.seed}, {"prefill_ms", prefill_ms},
                     {"prefill_tokens_per_s", prompt_tokens / prefill_ms * 1e3}, {"decode_steps", steps},
                     {"decode_ms", decode_ms}, {"model", o.model}, {"model_kind", source.kind()},
                     {"layers", spec.layers.size()}, {"vocab_size", spec.model.vocab_size},
                     {"d_model", a.d_model}, {"heads", a.heads}, {"kv_heads", a.kv_heads}, {"head_dim", a.head_dim},
                     {"ffn_dim", l.ffn_dim}, {"policy", o.policy}, {"policy_detail", policy_detail},
                     {"dtype", o.dtype}, {"weights_dtype", o.weights_dtype}, {"kv_dtype", o.kv_dtype},
                     {"packed_weights", o.computing.packed_weights}, {"threads", model->threads()}};
    add_kernel_fields(j, kernels);
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
      "one from a decode step: the largest logit (the first of equal ones), or with --temperature a draw after\n"
      "temperature, top-k and top-p, in that order (docs/semantics.md, Generation). Generation stops after an\n"
      "end-of-sequence token (printed) unless --ignore-eos. Prints the new token ids (and with --text their text\n"
      "as it comes), the prefill's prompt tokens per second and the decode steps' time per token (one run, no\n"
      "warm-up: what a user waits).\n" +
      exit_codes_help);
  cmd->callback([o, prompt, text, top_k, top_p] {
    if (!prompt->count() && !text->count()) throw CLI::RequiredError("--prompt or --text");
    if (o->sampling.temperature == 0)
      for (auto* option : {top_k, top_p})
        if (option->count())
          throw CLI::ValidationError(option->get_name(), "applies to sampling: give --temperature > 0 as well");
    if (prompt->count() && o->prompt.empty()) throw CLI::ValidationError("--prompt", "needs at least one token id");
    generate(*o);
  });
}

}  // namespace difftx::cli
