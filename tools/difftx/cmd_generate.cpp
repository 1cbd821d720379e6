// difftx generate: greedy decoding with a language model whose weights come
// from a safetensors file (LanguageModel's names), using the KV cache: the
// prompt in one prefill, then one decode step per new token. Prints the new
// tokens and how fast each phase ran.
#include <chrono>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <difftx/io/safetensors.hpp>

#include "commands.hpp"
#include "generator.hpp"
#include "weight_shapes.hpp"

namespace difftx::cli {

namespace {

struct generate_options {
  std::string weights;
  std::vector<index_t> prompt;
  index_t max_new_tokens = 16;
  index_t heads = 0;     // 0: from the weights (lambda_q1 gives D)
  index_t kv_heads = 0;  // 0: as many as heads
  double rope_theta = 10000.0, eps = 1e-5;
  int threads = 0;
  bool json = false;
  std::string dtype, policy;
};

// L, from the layers.<i>. prefixes: layers 0 .. L-1 must each have tensors
// (so L is at most the file's tensor count). Names that are not the
// Stack's (layers.01., layers.x.) are ignored like any other extra tensor.
index_t layer_count(const io::tensor_file& weights, const std::string& label) {
  const std::string prefix = "layers.";
  std::set<index_t> found;
  for (const auto& [name, tensor] : weights.tensors) {
    if (name.rfind(prefix, 0) != 0) continue;
    const auto dot = name.find('.', prefix.size());
    if (dot == std::string::npos) continue;
    const std::string digits = name.substr(prefix.size(), dot - prefix.size());
    const bool canonical = !digits.empty() && digits.size() <= 9 && (digits.size() == 1 || digits[0] != '0') &&
                           digits.find_first_not_of("0123456789") == std::string::npos;
    if (canonical) found.insert(std::stoll(digits));
  }
  require(!found.empty(), "generate", label + ": layers.0.*", "the tensors of at least one decoder layer "
          "(layers.<i>.<DecoderLayer name>)", "none");
  const index_t layers = *found.rbegin() + 1;
  for (index_t i = 0; i < layers; ++i)
    require(found.count(i) == 1, "generate", label + ": layers." + std::to_string(i) + ".*",
            "the tensors of every layer 0.." + std::to_string(layers - 1) + " (the file has layers." +
                std::to_string(layers - 1) + ")",
            "none");
  return layers;
}

// The architecture from the file: L from the layer prefixes, every layer's
// sizes from layer 0 (load_parameters then checks every other layer against
// them), V from embed_tokens.weight [V, C].
language_model_spec spec_from_file(const generate_options& o, const io::tensor_file& weights) {
  const std::string& label = o.weights;
  language_model_spec m;
  m.layers = layer_count(weights, label);
  const module_spec given{.kind = "decoder_layer", .heads = o.heads, .kv_heads = o.kv_heads,
                          .rope_theta = o.rope_theta, .eps = o.eps, .causal = true, .threads = o.threads};
  m.layer = spec_from_weights(given, weights, label, "generate", "layers.0.");
  const auto& embed = weights.at("embed_tokens.weight", "generate", label).shape;
  require(embed.size() == 2 && embed[0] > 0 && embed[1] == m.layer.d_model, "generate", label + ": embed_tokens.weight",
          "shape [V, " + std::to_string(m.layer.d_model) + "] with V >= 1 (C from layers.0.attn.q_proj.weight)",
          "shape " + shape_string(embed));
  m.vocab_size = embed[0];
  return m;
}

void require_prompt_in_vocabulary(const generate_options& o, index_t vocab_size) {
  for (std::size_t i = 0; i < o.prompt.size(); ++i)
    if (o.prompt[i] >= vocab_size)
      throw CLI::ValidationError("--prompt", "token id " + std::to_string(o.prompt[i]) + " (position " +
                                                 std::to_string(i) + ") is outside the vocabulary [0, " +
                                                 std::to_string(vocab_size) + ") of " + o.weights);
}

std::string joined(const std::vector<token_t>& tokens) {
  std::string out;
  for (const auto t : tokens) out += (out.empty() ? "" : ",") + std::to_string(t);
  return out;
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

void generate(const generate_options& o) {
  const auto type = checked_dtype(o.dtype, o.policy);
  if (!generates_on(o.policy))
    throw CLI::ValidationError("--policy", "generate runs on the CPU policies; policy '" + o.policy +
                                               "' has no language model in this tool yet");
  if (o.heads > 0 && o.kv_heads > 0 && o.heads % o.kv_heads != 0)
    throw CLI::ValidationError("--kv-heads", "must divide --heads " + std::to_string(o.heads));
  if (o.prompt.empty()) throw CLI::ValidationError("--prompt", "needs at least one token id");

  language_model_spec spec;
  std::unique_ptr<generator> model;
  {
    const auto weights = io::read_safetensors(o.weights);
    spec = spec_from_file(o, weights);
    require_prompt_in_vocabulary(o, spec.vocab_size);
    model = make_generator(spec, o.policy, type);
    model->load(weights, o.weights);
  }  // the file's bytes are freed before the cache exists

  const std::vector<token_t> prompt(o.prompt.begin(), o.prompt.end());
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

  const auto& l = spec.layer;
  if (o.json) {
    nlohmann::json j{{"tokens", generated}, {"prompt", prompt}, {"prompt_tokens", prompt_tokens},
                     {"new_tokens", o.max_new_tokens}, {"prefill_ms", prefill_ms},
                     {"prefill_tokens_per_s", prompt_tokens / prefill_ms * 1e3}, {"decode_steps", steps},
                     {"decode_ms", decode_ms}, {"layers", spec.layers}, {"vocab_size", spec.vocab_size},
                     {"d_model", l.d_model}, {"heads", l.heads}, {"kv_heads", l.kv_heads}, {"head_dim", l.head_dim},
                     {"ffn_dim", l.ffn_dim}, {"policy", o.policy}, {"policy_detail", policy_description(o.policy)},
                     {"dtype", o.dtype}, {"threads", model->threads()}};
    j["decode_ms_per_token"] = steps > 0 ? nlohmann::json(decode_ms / static_cast<double>(steps)) : nlohmann::json();
    j["decode_tokens_per_s"] = steps > 0 ? nlohmann::json(static_cast<double>(steps) / decode_ms * 1e3) : nlohmann::json();
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("difftx generate: %td layers, V = %td, C = %td, h = %td, g = %td, D = %td, F = %td; %s, %s, %d thread%s\n",
              spec.layers, spec.vocab_size, l.d_model, l.heads, l.kv_heads, l.head_dim, l.ffn_dim,
              policy_description(o.policy).c_str(), o.dtype.c_str(), model->threads(), model->threads() == 1 ? "" : "s");
  std::printf("tokens: %s\n", joined(generated).c_str());
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
  auto* cmd = app.add_subcommand("generate", "greedy decoding with a language model's weights, using the KV cache");
  cmd->add_option("--weights", o->weights,
                  "safetensors file of a LanguageModel of decoder layers under the spec's names: embed_tokens.weight "
                  "[V, C], layers.<i>.<decoder_layer names>, norm.weight, lm_head.weight (F64, F32, F16 or BF16; other "
                  "tensors in it are ignored)")
      ->required();
  cmd->add_option("--prompt", o->prompt, "token ids of the prompt, comma-separated (e.g. 1,2,3), each in [0, V)")
      ->delimiter(',')
      ->required()
      ->check(count_in(0));
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "tokens to generate")
      ->check(count_in(1))
      ->capture_default_str();
  cmd->add_option("--heads", o->heads, "heads h of every layer; default: q_proj rows / (2 D) with D from lambda_q1")
      ->check(count_in(1));
  cmd->add_option("--kv-heads", o->kv_heads, "key/value groups g (default: as many as heads)")->check(count_in(1));
  cmd->add_option("--rope-theta", o->rope_theta, "RoPE base")->check(positive_finite())->capture_default_str();
  cmd->add_option("--eps", o->eps, "RMSNorm epsilon (every layer's two norms and the final norm)")
      ->check(positive_finite())
      ->capture_default_str();
  add_dtype_option(*cmd, o->dtype);
  add_policy_option(*cmd, o->policy);
  add_threads_option(*cmd, o->threads, "OMP_NUM_THREADS or every core");
  cmd->add_flag("--json", o->json,
                "print one JSON object: tokens, prefill_ms and prefill_tokens_per_s, decode_ms, decode_ms_per_token "
                "and decode_tokens_per_s, the sizes, policy, dtype and threads");
  cmd->footer(
      "V and C come from embed_tokens.weight, the layer count from the layers.<i>. prefixes (layer i gets\n"
      "layer_index i), D, F and (unless given) h from layer 0's weights; every layer is checked against them.\n"
      "The first new token comes from the prefill's last logits, each further one from a decode step (the\n"
      "largest logit; the first of equal ones). Prints the new token ids, the prefill's prompt tokens per\n"
      "second and the decode steps' time per token (one run, no warm-up: what a user waits).\n" +
      exit_codes_help);
  cmd->callback([o] { generate(*o); });
}

}  // namespace difftx::cli
