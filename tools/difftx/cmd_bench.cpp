// difftx bench: times one module's forward (and forward + backward) on random
// weights and input, on one policy or several in turn (the same module, shape,
// dtype and input): the median of --repeats runs after a warm-up, as
// milliseconds, tokens/s and GFLOP/s (FLOPs as count_flops says), each policy
// timed its own way (runner::elapsed_ms: CUDA events for cuda) and compared
// with the first. With --model, a real language model's prefill and decode
// instead (bench_model.cpp).
#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <difftx/core/random.hpp>

#include "commands.hpp"
#include "model_source.hpp"
#include "runner.hpp"

namespace difftx::cli {

namespace {

struct bench_options {
  std::string module, dtype;
  std::vector<std::string> policies;
  index_t batch = 0, seq = 0, d_model = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn_dim = 0;
  bool no_causal = false, backward = false, json = false, decode = false;
  bool baseline = false;  // V2 kinds: differential off
  index_t context = 0;
  int repeats = 10;
  policy_options computing;  // --threads, --bf16-product, --matmul, --amx/--no-amx, --cuda-attention, --packed-weights
  std::string model;  // --model: a language model's prefill and decode instead
  index_t new_tokens = 32;
  int logit_bits = 16;                                  // low-bit inference (low_bit_options.cpp)
  std::string weights_dtype = "same", kv_dtype = "same";  // --decode only
  std::string qk_dtype = "same";
};

// Median milliseconds of `repeats` timed calls of f on the module's policy,
// after one untimed warm-up call (which also allocates what later calls reuse).
double median_ms(const runner& module, int repeats, const std::function<void()>& f) {
  module.elapsed_ms(f);
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) ms.push_back(module.elapsed_ms(f));
  std::sort(ms.begin(), ms.end());
  return (ms[(ms.size() - 1) / 2] + ms[ms.size() / 2]) / 2;
}

// The spec the flags give, with the default sizes (module_kinds.hpp), checked
// by the module's own check: every usage error before any work.
module_spec bench_spec(const bench_options& o) {
  const module_kind& kind = *find_module_kind(o.module);  // --module takes only the table's names
  if (o.baseline && !kind.v2())
    throw CLI::ValidationError("--baseline", "applies to multihead_v2 and decoder_layer_v2 only (the V1 baseline is "
                                             "--module attention with 2h heads)");
  const auto spec = with_default_sizes(
      {.kind = &kind,
       .attention = {.d_model = o.d_model, .heads = o.heads, .kv_heads = o.kv_heads, .causal = !o.no_causal,
                     .head_dim = o.head_dim, .logit_bits = o.logit_bits, .qk_dtype = storage_of(o.qk_dtype)},
       .ffn_dim = o.ffn_dim, .differential = !o.baseline});
  check_config(spec, "bench");
  return spec;
}

// One policy's timings.
struct bench_row {
  std::string policy, description;  // "simd", "simd (fma3+avx2)", "simd (avx512bw, vdpbf16ps)"
  kernel_report kernels;
  int threads = 1;
  double forward_ms = 0, both_ms = 0;
  double decode_ms = 0;  // --decode: one decode step
};

bench_row time_policy(const bench_options& o, const module_spec& spec, const std::string& policy, io::dtype type,
                      const io::stored_tensor& input) {
  auto module = make_runner(spec, policy, type, o.computing);
  module->set_input(input, "random input");
  module->set_grad_output(input, "random grad_output");
  const auto kernels = module->kernels();
  bench_row row{.policy = policy, .description = policy_description(policy, kernels.detail()), .kernels = kernels,
                .threads = module->threads()};
  if (o.decode) {
    module->prepare_decode(storage_of(o.weights_dtype), storage_of(o.kv_dtype));
    row.decode_ms = median_ms(*module, o.repeats, [&] { module->decode_step(); });
  } else {
    row.forward_ms = median_ms(*module, o.repeats, [&] { module->forward(); });
    if (o.backward)
      row.both_ms = median_ms(*module, o.repeats, [&] {
        module->forward();
        module->backward();
      });
  }
  if (const auto paths = module->attention_paths(); !paths.empty()) row.description += " [attention: " + paths + "]";
  return row;
}

// The shape line shared by both reports.
std::string describe_shape(const bench_options& o, const module_spec& spec, index_t seq) {
  std::string shape = "x [" + std::to_string(o.batch) + ", " + std::to_string(seq) + ", " + std::to_string(o.d_model) + "]";
  const auto& a = spec.attention;
  if (spec.kind->has_attention())
    shape += ", h = " + std::to_string(a.heads) + ", g = " + std::to_string(a.kv_heads) +
             ", D = " + std::to_string(a.head_dim) + (a.causal ? ", causal" : ", not causal");
  if (spec.kind->v2())
    shape += spec.differential ? ", V2 differential (" + std::to_string(2 * a.heads) + " query heads)"
                               : ", V2 baseline (differential off)";
  if (spec.ffn_dim) shape += ", F = " + std::to_string(spec.ffn_dim);
  return shape;
}

// --decode: one decode step (B new tokens) per policy.
void print_decode(const bench_options& o, const module_spec& spec, const std::vector<bench_row>& rows) {
  const double tokens = static_cast<double>(o.batch);
  if (o.json) {
    for (const auto& row : rows) {
      nlohmann::json j{{"module", o.module}, {"policy", row.policy}, {"policy_detail", row.description},
                       {"dtype", o.dtype}, {"threads", row.threads}, {"batch", o.batch}, {"context", o.context},
                       {"d_model", o.d_model}, {"repeats", o.repeats}, {"decode_step_ms", row.decode_ms},
                       {"decode_tokens_per_s", tokens / row.decode_ms * 1e3},
                       {"decode_speedup_vs_first", rows.front().decode_ms / row.decode_ms},
                       {"weights_dtype", o.weights_dtype}, {"kv_dtype", o.kv_dtype}, {"logit_bits", o.logit_bits}};
      if (spec.kind->has_attention())
        j.update({{"heads", spec.attention.heads}, {"kv_heads", spec.attention.kv_heads},
                  {"head_dim", spec.attention.head_dim}});
      if (spec.kind->v2()) j["differential"] = spec.differential;
      add_kernel_fields(j, row.kernels);
      std::printf("%s\n", j.dump().c_str());
    }
    return;
  }
  std::printf("difftx bench --decode: %s, one new token per sequence with %lld cached, prompt %s, %s; median of %d steps "
              "after a warm-up; x = the first policy's time / this one's\n",
              o.module.c_str(), static_cast<long long>(o.context), describe_shape(o, spec, o.context).c_str(),
              (o.dtype + ", weights " + o.weights_dtype + ", KV cache " + o.kv_dtype + ", logit bits " +
               std::to_string(o.logit_bits)).c_str(),
              o.repeats);
  std::printf("%-34s %7s %-16s %10s %12s %7s\n", "policy", "threads", "pass", "median ms", "tokens/s", "x");
  for (const auto& row : rows)
    std::printf("%-34s %7d %-16s %10.3f %12.1f %7.2f\n", row.description.c_str(), row.threads, "decode step",
                row.decode_ms, tokens / row.decode_ms * 1e3, rows.front().decode_ms / row.decode_ms);
}

void bench(const bench_options& o) {
  for (const auto& policy : o.policies) checked_dtype(o.dtype, policy);  // every usage error before any work
  const auto type = *io::parse_dtype_name(o.dtype);
  const auto spec = bench_spec(o);
  // --decode: the input is the prompt the cache holds, x [B, context, C].
  const index_t seq = o.decode ? o.context : o.seq;
  const auto count = checked_element_count(std::vector<index_t>{o.batch, seq, o.d_model}, "bench", "x [B, N, C]");
  random_stream rng(1);
  std::vector<double> x;
  try {
    x.resize(static_cast<std::size_t>(count));
  } catch (const std::bad_alloc&) {
    throw input_error("bench", "x [B, N, C]", "an input that fits in memory",
                      "input needs " + std::to_string(count * sizeof(double)) + " bytes, more than can be allocated");
  }
  for (auto& e : x) e = rng.normal();
  const auto input = io::stored_tensor::from_values(type, {o.batch, seq, o.d_model}, x);
  x = {};
  std::vector<bench_row> rows;
  for (const auto& policy : o.policies) rows.push_back(time_policy(o, spec, policy, type, input));
  if (o.decode) return print_decode(o, spec, rows);

  const auto flops = count_flops(spec, o.batch, o.seq);
  const double tokens = static_cast<double>(o.batch * o.seq);
  // GFLOP/s of `flop` in `ms`; none when nothing is counted (rmsnorm).
  auto gflops = [](double flop, double ms) { return flop > 0 ? nlohmann::json(flop / (ms * 1e6)) : nlohmann::json(); };
  const std::string shape = describe_shape(o, spec, o.seq);

  if (o.json) {
    for (const auto& row : rows) {
      nlohmann::json j{{"module", o.module}, {"policy", row.policy}, {"policy_detail", row.description},
                       {"dtype", o.dtype}, {"threads", row.threads}, {"batch", o.batch}, {"seq", o.seq},
                       {"logit_bits", o.logit_bits}, {"qk_dtype", o.qk_dtype},
                       {"d_model", o.d_model}, {"repeats", o.repeats}, {"forward_ms", row.forward_ms},
                       {"forward_tokens_per_s", tokens / row.forward_ms * 1e3}, {"forward_flops", flops.forward},
                       {"forward_gflops", gflops(flops.forward, row.forward_ms)},
                       {"forward_speedup_vs_first", rows.front().forward_ms / row.forward_ms}};
      if (spec.kind->has_attention())
        j.update({{"heads", spec.attention.heads}, {"kv_heads", spec.attention.kv_heads},
                  {"head_dim", spec.attention.head_dim},
                  {"causal", spec.attention.causal}});
      if (spec.kind->v2()) j["differential"] = spec.differential;
      add_kernel_fields(j, row.kernels);
      if (spec.ffn_dim) j["ffn_dim"] = spec.ffn_dim;
      if (o.backward)
        j.update({{"forward_backward_ms", row.both_ms}, {"forward_backward_tokens_per_s", tokens / row.both_ms * 1e3},
                  {"backward_flops", flops.backward},
                  {"forward_backward_gflops", gflops(flops.forward + flops.backward, row.both_ms)},
                  {"forward_backward_speedup_vs_first", rows.front().both_ms / row.both_ms}});
      std::printf("%s\n", j.dump().c_str());
    }
    return;
  }
  std::printf("difftx bench: %s on %s, %s; median of %d runs after a warm-up; x = the first policy's time / this one's\n",
              o.module.c_str(), shape.c_str(),
              (o.dtype + (o.logit_bits != 16 ? ", logit bits " + std::to_string(o.logit_bits) : "") +
               (o.qk_dtype == "int8" ? ", int8 Q·Kᵀ" : ""))
                  .c_str(),
              o.repeats);
  std::printf("%-34s %7s %-16s %10s %12s %9s %7s\n", "policy", "threads", "pass", "median ms", "tokens/s", "GFLOP/s", "x");
  auto line = [&](const bench_row& row, const char* pass, double ms, double first_ms, double flop) {
    char rate[32] = "-";
    if (flop > 0) std::snprintf(rate, sizeof rate, "%.3f", flop / (ms * 1e6));
    std::printf("%-34s %7d %-16s %10.3f %12.0f %9s %7.2f\n", row.description.c_str(), row.threads, pass, ms,
                tokens / ms * 1e3, rate, first_ms / ms);
  };
  for (const auto& row : rows) {
    line(row, "forward", row.forward_ms, rows.front().forward_ms, flops.forward);
    if (o.backward) line(row, "forward+backward", row.both_ms, rows.front().both_ms, flops.forward + flops.backward);
  }
  std::printf("FLOPs counted (matrix products and attention only; see --help): %.4g forward, %.4g backward\n",
              flops.forward, flops.backward);
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<bench_options>();
  auto* cmd = app.add_subcommand("bench", "time one module's forward (and backward) on random weights and input, or a "
                                          "language model's prefill and decode");
  auto* module = add_module_option(*cmd, o->module);
  add_policies_option(*cmd, o->policies);
  add_dtype_option(*cmd, o->dtype);
  const auto computing = add_policy_options(*cmd, o->computing, "OMP_NUM_THREADS or every core", true);
  auto* batch = cmd->add_option("--batch", o->batch, "batch size B")->check(count_in(1));
  auto* seq = cmd->add_option("--seq", o->seq, "sequence length N (needed unless --decode; --model: the prompt, "
                                               "default 128)")->check(count_in(1));
  auto* d_model = cmd->add_option("--d-model", o->d_model, "model width C")->check(count_in(1));
  auto* model = cmd->add_option("--model", o->model,
                                "instead of --module: time a language model (a Hugging Face DiffLlama folder or a "
                                "difftx file) on a random prompt of --seq tokens: its prefill, then --new-tokens "
                                "greedy decode steps with the KV cache");
  auto* new_tokens = cmd->add_option("--new-tokens", o->new_tokens, "--model: decode steps timed after the prefill")
                         ->check(count_in(1))
                         ->capture_default_str();
  model->excludes(module)->excludes(batch)->excludes(d_model);
  new_tokens->needs(model);
  computing.packed_weights->needs(model);
  auto* heads = cmd->add_option("--heads", o->heads,
                  "heads h (attention: H; V2: h output heads, 2h query heads); needed except for rmsnorm and swiglu")
      ->check(count_in(1));
  auto* kv_heads =
      cmd->add_option("--kv-heads", o->kv_heads, "key/value groups g (default: as many as heads)")->check(count_in(1));
  cmd->add_option("--head-dim", o->head_dim,
                  "half head size D (attention and V2: head size); default C / (2h) (attention: C / H; V2: C / h)")
      ->check(count_in(1));
  cmd->add_option("--ffn-dim", o->ffn_dim, "SwiGLU hidden size F (default: 8C/3 rounded up to a multiple of 64)")
      ->check(count_in(1));
  cmd->add_flag("--no-causal", o->no_causal, "attend to every position (costs twice the attention products)");
  cmd->add_flag("--baseline", o->baseline,
                "multihead_v2 and decoder_layer_v2: the authors' matched V2 baseline (differential off: h query heads, "
                "no lambda_proj), for A/B against the same command without it");
  auto* backward = cmd->add_flag("--backward", o->backward, "time forward + backward too");
  auto* decode = cmd->add_flag("--decode", o->decode,
                               "time one decode step with a KV cache instead: --batch new tokens, one per sequence, "
                               "each attending to --context cached ones (every module with attention)");
  auto* context = cmd->add_option("--context", o->context, "--decode: the tokens already in the cache")->check(count_in(1));
  decode->needs(context)->excludes(backward)->excludes(seq)->excludes(model);
  backward->excludes(model);
  context->needs(decode);
  add_logit_bits_option(*cmd, o->logit_bits);
  auto* weights_dtype = add_storage_option(*cmd, "--weights-dtype", o->weights_dtype,
                                          "--decode or --model: the projections' weights (int8: each output "
                                          "channel's, quantized once)");
  auto* kv_dtype = add_storage_option(*cmd, "--kv-dtype", o->kv_dtype, "--decode or --model: the KV cache's keys and values");
  add_storage_option(*cmd, "--qk-dtype", o->qk_dtype, "the forward's attention scores Q·Kᵀ (int8: on int8 queries and keys)");
  cmd->add_option("--repeats", o->repeats, "timed runs (after one warm-up run)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_flag("--json", o->json,
                "print one JSON object: forward_ms (and forward_backward_ms), both medians, tokens/s, GFLOP/s, "
                "FLOPs, the shape, module, policy, dtype and threads");
  cmd->footer(
      "FLOPs, as the benchmark suite counts them: matrix products only, 2·M·N·K each. A projection [in -> out]\n"
      "on B·N tokens: forward 2·BN·in·out, backward twice that (dX and dW). Attention per head over the (query,\n"
      "key) pairs P a kernel must visit (N(N+1)/2 causal: the masked half is not counted; N² otherwise), with\n"
      "query/key size d = D, value size dv (2D differential, D standard) and 2 maps (differential) or 1: forward\n"
      "P·maps·(2d + 2dv) (Q·Kᵀ, P·V); backward P·(4dv + maps·4d) (dV, dP; dQ, dK), without the scores the\n"
      "backward recomputes, so GFLOP/s are conservative. V2 (multihead_v2, decoder_layer_v2): 2h query heads (the\n"
      "baseline h) of one map each with d = dv = D, projections q, k, v, lambda_proj (h rows) and o_proj from hD.\n"
      "Not counted: RMSNorm, RoPE, softmax, the SwiGLU gate, V2's a_2i - lambda a_2i+1,\n"
      "residual adds (O(B·N·C) each), so rmsnorm reports no GFLOP/s.\n" +
      exit_codes_help);
  cmd->callback([o, heads, kv_heads, weights_dtype, kv_dtype] {
    for (const auto* storage : {weights_dtype, kv_dtype})
      if (storage->count() && !o->decode && o->model.empty())
        throw CLI::ValidationError(storage->get_name(), "applies to --decode or --model (the decode of a cache)");
    if (!o->model.empty())
      return bench_model({.model = o->model, .dtype = o->dtype, .policies = o->policies, .computing = o->computing,
                          .weights_dtype = o->weights_dtype, .kv_dtype = o->kv_dtype,
                          .flags = {.heads = heads->count() ? o->heads : 0, .kv_heads = kv_heads->count() ? o->kv_heads : 0},
                          .prompt_tokens = o->seq ? o->seq : 128, .new_tokens = o->new_tokens, .repeats = o->repeats,
                          .json = o->json});
    for (const auto& [name, missing] : {std::pair{"--module", o->module.empty()}, {"--batch", o->batch == 0},
                                        {"--d-model", o->d_model == 0}})
      if (missing) throw CLI::RequiredError(std::string(name) + " (or --model)");
    if (!o->decode && o->seq == 0) throw CLI::RequiredError("--seq");
    bench(*o);
  });
}

}  // namespace difftx::cli
