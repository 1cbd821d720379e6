// difftx run: one module on weights from a safetensors file and an input from
// an .npy file; writes the output and, given dY, the input and weight
// gradients. With --model, a whole language model (a DiffLlama folder or a
// difftx file) on token ids from an .npy file; writes the logits.
#include <algorithm>
#include <filesystem>
#include <memory>
#include <utility>
#include <vector>

#include <difftx/io/npy.hpp>
#include <difftx/io/safetensors.hpp>

#include "commands.hpp"
#include "language_model_runner.hpp"
#include "model_source.hpp"
#include "runner.hpp"
#include "weight_shapes.hpp"

namespace difftx::cli {

namespace {

struct run_options {
  std::string module, weights, input, output, grad_output, grad_input, grad_weights;
  std::string model, tokens;  // --model: a language model on token ids
  index_t heads = 0;     // 0: from the weights (lambda_q1 gives D)
  index_t kv_heads = 0;  // 0: as many as heads
  index_t layer_index = 0, ffn_dim = 0;
  double rope_theta = 10000.0, eps = 1e-5;
  bool no_causal = false;
  int logit_bits = 16;  // low-bit inference (low_bit_options.cpp)
  std::string dtype, policy;
  policy_options computing;  // --threads, --bf16-product, --matmul, --amx/--no-amx, --cuda-attention, --packed-weights
};

// Two output options naming one file would keep only the last result.
void require_distinct_outputs(const run_options& o) {
  namespace fs = std::filesystem;
  std::vector<std::pair<std::string, std::string>> named{{"--output", o.output}};
  if (!o.grad_input.empty()) named.emplace_back("--grad-input", o.grad_input);
  if (!o.grad_weights.empty()) named.emplace_back("--grad-weights", o.grad_weights);
  std::error_code ec;
  for (std::size_t i = 0; i < named.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (fs::weakly_canonical(fs::absolute(named[i].second, ec), ec) ==
          fs::weakly_canonical(fs::absolute(named[j].second, ec), ec))
        throw CLI::ValidationError(named[i].first, "names the same file as " + named[j].first + " (" +
                                                       named[j].second + "); each output needs its own path");
}

// The flags against each other before any file is read (--kv-heads against
// --heads), by the module's own check: the sizes only the weights give stand
// in as values it accepts (C = 1, D = 2, h = g where only --kv-heads is given;
// V2 as differential, whose 2h query heads any g dividing h divides too), so
// only what the flags say can fail it. check_config runs again on the sizes
// read (spec_from_weights).
void check_flags(module_spec flags) {
  auto& a = flags.attention;
  a.d_model = 1;
  a.head_dim = 2;
  if (a.heads == 0) a.heads = std::max<index_t>(a.kv_heads, 1);
  check_config(flags, "run");
}

void run(const run_options& o) {
  const auto type = checked_dtype(o.dtype, o.policy);
  const module_kind& kind = *find_module_kind(o.module);  // --module takes only the table's names
  if (!kind.heads_from_weights() && o.heads == 0)
    throw CLI::RequiredError("--heads (for --module " + o.module + ")");
  const module_spec given{.kind = &kind,
                          .attention = {.heads = o.heads, .kv_heads = o.kv_heads, .rope_theta = o.rope_theta,
                                        .causal = !o.no_causal, .logit_bits = o.logit_bits},
                          .layer_index = o.layer_index, .ffn_dim = o.ffn_dim, .eps = o.eps};
  check_flags(given);
  require_distinct_outputs(o);

  // All or nothing: every output's temporary file is created first (a path
  // that cannot be written fails before any work), everything is read, checked
  // and computed, the results must be finite, and only then are the files
  // written and renamed over their targets. Any failure leaves every output
  // path as it was.
  io::remove_temporaries_on_signals();
  io::output_files outputs;
  const auto y_file = outputs.add(o.output, "write_npy");
  const auto dx_file = o.grad_input.empty() ? 0 : outputs.add(o.grad_input, "write_npy");
  const auto dw_file = o.grad_weights.empty() ? 0 : outputs.add(o.grad_weights, "write_safetensors");

  std::unique_ptr<runner> module;
  {
    const auto weights = io::read_safetensors(o.weights);
    module = make_runner(spec_from_weights(given, shapes_of(weights), o.weights, "run"), o.policy, type, o.computing);
    module->load(weights, o.weights);
  }
  module->set_input(io::read_npy(o.input), o.input);
  const bool backward = !o.grad_output.empty();
  if (backward) module->set_grad_output(io::read_npy(o.grad_output), o.grad_output);

  module->forward();
  module->require_finite_output();
  if (backward) {
    module->backward();
    module->require_finite_gradients();
  }

  const auto file_type = type == io::dtype::f64 ? io::dtype::f64 : io::dtype::f32;
  outputs.write(y_file, [&](std::ostream& out) { module->write_output(out, file_type, o.output); });
  if (!o.grad_input.empty())
    outputs.write(dx_file, [&](std::ostream& out) { module->write_grad_input(out, file_type, o.grad_input); });
  if (!o.grad_weights.empty())
    outputs.write(dw_file, [&](std::ostream& out) { io::write_safetensors_to(out, module->gradients(file_type)); });
  outputs.commit();
}

// --model: tokens [B, N] -> logits [B, N, V], all or nothing like the module run.
void run_model(const run_options& o, const model_flags& flags) {
  const auto type = checked_dtype(o.dtype, o.policy);
  io::remove_temporaries_on_signals();
  io::output_files outputs;
  const auto logits_file = outputs.add(o.output, "write_npy");
  const model_source source(o.model, flags);
  const auto tokens = io::read_npy_tokens(o.tokens, source.spec().model.vocab_size);
  const auto model = make_language_model_runner(source.spec(), o.policy, type, o.computing);
  source.load_into(*model);
  model->forward(tokens);
  const auto file_type = type == io::dtype::f64 ? io::dtype::f64 : io::dtype::f32;
  outputs.write(logits_file, [&](std::ostream& out) { model->write_logits(out, file_type, o.output); });
  outputs.commit();
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto o = std::make_shared<run_options>();
  auto* cmd = app.add_subcommand("run", "run one module forward (and backward) on weights and an input from files, "
                                        "or a language model on token ids");
  auto* module = add_module_option(*cmd, o->module);
  auto* weights = cmd->add_option("--weights", o->weights, "safetensors file of the module's weights under the spec's "
                                                           "names (F64, F32, F16 or BF16; other tensors in it are ignored)");
  auto* input = cmd->add_option("--input", o->input, ".npy file of X [B, N, C] (float32 or float64)");
  auto* model = cmd->add_option(
      "--model", o->model,
      "instead of --module: a language model, a Hugging Face DiffLlama folder (config.json and safetensors weights) "
      "or a difftx language model file (as `difftx convert` writes it), run on --tokens");
  auto* tokens = cmd->add_option("--tokens", o->tokens, "--model: .npy file of token ids [B, N] (int32 or int64)");
  cmd->add_option("--output", o->output,
                  ".npy file to write Y (--model: the logits [B, N, V]) to (float64 with --dtype float64, else float32)")
      ->required();
  auto* grad_output =
      cmd->add_option("--grad-output", o->grad_output, ".npy file of dY, the gradient at the output: runs the backward");
  cmd->add_option("--grad-input", o->grad_input, ".npy file to write dX to")->needs(grad_output);
  cmd->add_option("--grad-weights", o->grad_weights,
                  "safetensors file to write every parameter's gradient to, under the weights' names")
      ->needs(grad_output);
  model->excludes(module)->excludes(weights)->excludes(input)->excludes(grad_output)->needs(tokens);
  tokens->needs(model);
  auto* heads = cmd->add_option("--heads", o->heads,
                  "heads h (attention: H, required); default: q_proj rows / (2 D) with D from lambda_q1 (V2: the "
                  "rows of lambda_proj.weight; required for the V2 baseline, whose file has no lambda_proj.weight)")
      ->check(count_in(1));
  auto* kv_heads = cmd->add_option("--kv-heads", o->kv_heads,
                  "key/value groups g (default: as many as heads; V2: k_proj rows / D)")
      ->check(count_in(1));
  cmd->add_option("--layer-index", o->layer_index, "layer index l, sets lambda_init = 0.8 - 0.6 exp(-0.3 l)")
      ->check(count_in(0))
      ->capture_default_str();
  auto* rope_theta =
      cmd->add_option("--rope-theta", o->rope_theta, "RoPE base")->check(positive_finite())->capture_default_str();
  cmd->add_flag("--no-causal", o->no_causal, "attend to every position, not only earlier ones");
  add_logit_bits_option(*cmd, o->logit_bits);
  cmd->add_option("--ffn-dim", o->ffn_dim, "SwiGLU hidden size F (default: from gate_proj.weight)")
      ->check(count_in(1));
  auto* eps = cmd->add_option("--eps", o->eps, "RMSNorm epsilon (rmsnorm, and decoder_layer's two norms)")
      ->check(positive_finite())
      ->capture_default_str();
  add_dtype_option(*cmd, o->dtype);
  add_policy_option(*cmd, o->policy);
  add_policy_options(*cmd, o->computing, "OMP_NUM_THREADS or every core", true)
      .packed_weights->needs(model);
  cmd->footer(
      "d_model C and the head size D come from the weight shapes (q_proj.weight is [2hD, C] for multihead and\n"
      "decoder_layer, [HD, C] for attention) and are checked against each other and the input.\n"
      "multihead_v2 and decoder_layer_v2 (differential attention V2, the authors' Diff-Transformer-V2 names:\n"
      "q_proj [2hD, C], k_proj and v_proj [gD, C], o_proj [C, hD], lambda_proj [h, C]) take h from lambda_proj,\n"
      "D from q_proj and h, g from k_proj; a file without lambda_proj.weight is the V2 baseline (differential off:\n"
      "q_proj [hD, C]), run with --heads h. --layer-index does not apply to them.\n"
      "--model PATH --tokens IDS.npy: a language model (a Hugging Face DiffLlama folder, or a difftx file, whose\n"
      "architecture comes from its config or metadata) on token ids [B, N]; writes the logits [B, N, V].\n" +
      exit_codes_help);
  cmd->callback([o, heads, kv_heads, rope_theta, eps] {
    if (o->model.empty()) {
      for (const auto& [name, value] : {std::pair{"--module", &o->module}, {"--weights", &o->weights}, {"--input", &o->input}})
        if (value->empty()) throw CLI::RequiredError(std::string(name) + " (or --model with --tokens)");
      return run(*o);
    }
    // A model that records its architecture needs none of these; given, they must agree with it.
    model_flags flags{.heads = heads->count() ? o->heads : 0, .kv_heads = kv_heads->count() ? o->kv_heads : 0};
    if (rope_theta->count()) flags.rope_theta = o->rope_theta;
    if (eps->count()) flags.eps = o->eps;
    run_model(*o, flags);
  });
}

}  // namespace difftx::cli
