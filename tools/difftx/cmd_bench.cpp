// difftx bench: times one module's forward (and forward + backward) on random
// weights and input: the median of --repeats runs after a warm-up, as
// milliseconds, tokens/s and GFLOP/s (FLOPs as count_flops says).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <new>

#include <nlohmann/json.hpp>

#include <difftx/core/random.hpp>
#include <difftx/modules/swiglu.hpp>

#include "commands.hpp"
#include "flops.hpp"
#include "runner.hpp"

namespace difftx::cli {

namespace {

struct bench_options {
  std::string module, policy, dtype;
  index_t batch = 0, seq = 0, d_model = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn_dim = 0;
  bool no_causal = false, backward = false, json = false;
  int repeats = 10, threads = 0;
};

struct flop_count {
  double forward = 0, backward = 0;
};

// FLOPs of one forward and of one backward of the module on x [B, N, C], as
// the benchmark suite counts them (benchmarks/flops.hpp): matrix products only,
// 2·M·N·K each (a projection's backward twice its forward: dX and dW);
// attention per head over the (query, key) pairs a kernel must visit (N(N+1)/2
// causal, N² otherwise), per pair and map 2d + 2dv forward (Q·Kᵀ, P·V) and per
// pair 4dv + maps·4d backward (dV, dP; dQ, dK), not counting the scores the
// backward recomputes. RMSNorm, RoPE, softmax, the SwiGLU gate and residual adds
// are not counted, so rmsnorm counts none.
flop_count count_flops(const module_spec& s, index_t batch, index_t seq) {
  const double b = static_cast<double>(batch), n = static_cast<double>(seq), c = static_cast<double>(s.d_model);
  const double h = static_cast<double>(s.heads), g = static_cast<double>(s.kv_heads), d = static_cast<double>(s.head_dim);
  const double f = static_cast<double>(s.ffn_dim);
  if (s.kind == "multihead")
    return {difftx_bench::multihead_forward(b, n, c, h, g, d, s.causal), difftx_bench::multihead_backward(b, n, c, h, g, d, s.causal)};
  if (s.kind == "attention")
    return {difftx_bench::baseline_forward(b, n, c, h, g, d, s.causal), difftx_bench::baseline_backward(b, n, c, h, g, d, s.causal)};
  if (s.kind == "decoder_layer")
    return {difftx_bench::decoder_forward(b, n, c, h, g, d, f, s.causal),
            difftx_bench::decoder_backward(b, n, c, h, g, d, f, s.causal)};
  if (s.kind == "swiglu") return {3 * difftx_bench::linear_forward(b * n, f, c), 3 * difftx_bench::linear_backward(b * n, f, c)};
  return {};
}

// Median milliseconds of `repeats` calls of f, after one untimed warm-up call.
template <class F>
double median_ms(int repeats, F&& f) {
  f();
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return (ms[(ms.size() - 1) / 2] + ms[ms.size() / 2]) / 2;
}

module_spec bench_spec(const bench_options& o) {
  module_spec s{.kind = o.module, .d_model = o.d_model, .heads = o.heads, .kv_heads = o.kv_heads,
                .head_dim = o.head_dim, .ffn_dim = o.ffn_dim, .causal = !o.no_causal, .threads = o.threads};
  if (s.kind == "swiglu" || s.kind == "decoder_layer") s.ffn_dim = o.ffn_dim ? o.ffn_dim : default_ffn_dim(o.d_model);
  if (!uses_head_dim(s.kind)) return s;
  if (o.heads == 0) throw CLI::RequiredError("--heads (for --module " + o.module + ")");
  if (s.kv_heads == 0) s.kv_heads = s.heads;
  if (s.heads % s.kv_heads != 0) throw CLI::ValidationError("--kv-heads", "must divide --heads " + std::to_string(s.heads));
  const index_t width = is_differential(s.kind) ? 2 * s.heads : s.heads;  // q_proj rows = width · D
  if (s.head_dim == 0) {
    if (s.d_model % width != 0)
      throw CLI::ValidationError("--head-dim", "needed: d_model " + std::to_string(s.d_model) +
                                                   " is not divisible by " + std::to_string(width) +
                                                   (width == s.heads ? " heads" : " (2 x heads)"));
    s.head_dim = s.d_model / width;
  }
  const auto dims = built_head_dims(o.policy);
  if (std::find(dims.begin(), dims.end(), s.head_dim) == dims.end())
    throw CLI::ValidationError("--head-dim", "head size " + std::to_string(s.head_dim) + " is not built for policy " +
                                                 o.policy + " (built: " + shape_string(dims) + ")");
  return s;
}

void bench(const bench_options& o) {
  const auto type = checked_dtype(o.dtype, o.policy);
  const auto spec = bench_spec(o);
  const auto count = checked_element_count(std::vector<index_t>{o.batch, o.seq, o.d_model}, "bench", "x [B, N, C]");
  auto module = make_runner(spec, o.policy, type);
  random_stream rng(1);
  std::vector<double> x;
  try {
    x.resize(static_cast<std::size_t>(count));
  } catch (const std::bad_alloc&) {
    throw input_error("bench", "x [B, N, C]", "an input that fits in memory",
                      "input needs " + std::to_string(count * sizeof(double)) + " bytes, more than can be allocated");
  }
  for (auto& e : x) e = rng.normal();
  const auto input = io::stored_tensor::from_values(type, {o.batch, o.seq, o.d_model}, x);
  module->set_input(input, "random input");
  module->set_grad_output(input, "random grad_output");

  const double forward_ms = median_ms(o.repeats, [&] { module->forward(); });
  const double both_ms = o.backward ? median_ms(o.repeats, [&] {
    module->forward();
    module->backward();
  })
                                    : 0.0;
  const auto flops = count_flops(spec, o.batch, o.seq);
  const double tokens = static_cast<double>(o.batch * o.seq);
  // GFLOP/s of `flop` in `ms`; none when nothing is counted (rmsnorm).
  auto gflops = [](double flop, double ms) { return flop > 0 ? nlohmann::json(flop / (ms * 1e6)) : nlohmann::json(); };

  nlohmann::json j{{"module", o.module},   {"policy", o.policy},   {"policy_detail", policy_description(o.policy)}, {"dtype", o.dtype},
                   {"threads", module->threads()}, {"batch", o.batch}, {"seq", o.seq},
                   {"d_model", o.d_model}, {"repeats", o.repeats}, {"forward_ms", forward_ms},
                   {"forward_tokens_per_s", tokens / forward_ms * 1e3}, {"forward_flops", flops.forward},
                   {"forward_gflops", gflops(flops.forward, forward_ms)}};
  std::string shape = "x [" + std::to_string(o.batch) + ", " + std::to_string(o.seq) + ", " + std::to_string(o.d_model) + "]";
  if (uses_head_dim(spec.kind)) {
    j.update({{"heads", spec.heads}, {"kv_heads", spec.kv_heads}, {"head_dim", spec.head_dim}, {"causal", spec.causal}});
    shape += ", h = " + std::to_string(spec.heads) + ", g = " + std::to_string(spec.kv_heads) +
             ", D = " + std::to_string(spec.head_dim) + (spec.causal ? ", causal" : ", not causal");
  }
  if (spec.ffn_dim) {
    j["ffn_dim"] = spec.ffn_dim;
    shape += ", F = " + std::to_string(spec.ffn_dim);
  }
  if (o.backward)
    j.update({{"forward_backward_ms", both_ms}, {"forward_backward_tokens_per_s", tokens / both_ms * 1e3},
              {"backward_flops", flops.backward}, {"forward_backward_gflops", gflops(flops.forward + flops.backward, both_ms)}});
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("difftx bench: %s on %s; policy %s, %s, %d thread%s; median of %d runs after a warm-up\n", o.module.c_str(),
              shape.c_str(), policy_description(o.policy).c_str(), o.dtype.c_str(), module->threads(), module->threads() == 1 ? "" : "s",
              o.repeats);
  std::printf("%-18s %10s %12s %9s\n", "", "median ms", "tokens/s", "GFLOP/s");
  auto row = [&](const char* name, double ms, double flop) {
    char rate[32] = "-";
    if (flop > 0) std::snprintf(rate, sizeof rate, "%.3f", flop / (ms * 1e6));
    std::printf("%-18s %10.3f %12.0f %9s\n", name, ms, tokens / ms * 1e3, rate);
  };
  row("forward", forward_ms, flops.forward);
  if (o.backward) row("forward+backward", both_ms, flops.forward + flops.backward);
  std::printf("FLOPs counted (matrix products and attention only; see --help): %.4g forward, %.4g backward\n",
              flops.forward, flops.backward);
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<bench_options>();
  auto* cmd = app.add_subcommand("bench", "time one module's forward (and backward) on random weights and input");
  add_module_option(*cmd, o->module);
  add_policy_option(*cmd, o->policy);
  add_dtype_option(*cmd, o->dtype);
  add_threads_option(*cmd, o->threads, "OMP_NUM_THREADS or every core");
  cmd->add_option("--batch", o->batch, "batch size B")->required()->check(count_in(1));
  cmd->add_option("--seq", o->seq, "sequence length N")->required()->check(count_in(1));
  cmd->add_option("--d-model", o->d_model, "model width C")->required()->check(count_in(1));
  cmd->add_option("--heads", o->heads, "heads h (attention: H); needed except for rmsnorm and swiglu")
      ->check(count_in(1));
  cmd->add_option("--kv-heads", o->kv_heads, "key/value groups g (default: as many as heads)")->check(count_in(1));
  cmd->add_option("--head-dim", o->head_dim, "half head size D (attention: head size); default C / (2h) (attention: C / H)")
      ->check(count_in(1));
  cmd->add_option("--ffn-dim", o->ffn_dim, "SwiGLU hidden size F (default: 8C/3 rounded up to a multiple of 64)")
      ->check(count_in(1));
  cmd->add_flag("--no-causal", o->no_causal, "attend to every position (costs twice the attention products)");
  cmd->add_flag("--backward", o->backward, "time forward + backward too");
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
      "backward recomputes, so GFLOP/s are conservative. Not counted: RMSNorm, RoPE, softmax, the SwiGLU gate,\n"
      "residual adds (O(B·N·C) each), so rmsnorm reports no GFLOP/s.\n" +
      exit_codes_help);
  cmd->callback([o] { bench(*o); });
}

}  // namespace difftx::cli
