// difftx check: every module, every policy built and every number type on a
// small random input: forward and backward, a gradient check in float64
// against finite differences (testing::gradcheck), and each policy and type
// against the reference policy in float64 within testing::tolerance<T>.
// Prints one table; exits 1 when any row fails.
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>

#include <difftx/core/random.hpp>
#include <difftx/testing/compare.hpp>
#include <difftx/testing/gradcheck.hpp>
#include <difftx/testing/tolerance.hpp>

#include "commands.hpp"
#include "runner.hpp"

namespace difftx::cli {

namespace {

constexpr std::uint64_t seed = 20251121;
constexpr index_t batch = 2, seq = 5, entries_per_tensor = 12;
constexpr io::dtype types[] = {io::dtype::f64, io::dtype::f32, io::dtype::bf16, io::dtype::f16};

// The check's modules, one per row of the table (and V2's baseline beside
// V2): small, grouped heads, a layer index > 0 so lambda_init is not the
// default; the standard attention with H = 2h heads of size D, the matched baseline.
std::vector<module_spec> check_modules(index_t head_dim) {
  std::vector<module_spec> specs;
  for (const auto& kind : module_kinds) {
    module_spec spec{.kind = &kind, .attention = {.d_model = 16, .heads = 2, .kv_heads = 1, .head_dim = head_dim},
                     .layer_index = 1, .ffn_dim = 24};
    if (kind.attention == attention_kind::standard) {
      spec.attention.heads = 4;
      spec.attention.kv_heads = 2;
    }
    specs.push_back(spec);
    if (kind.v2() && kind.parts == module_parts::attention) {  // h = 2 output heads of D: 4 query heads, its baseline 2
      spec.differential = false;
      specs.push_back(spec);
    }
  }
  return specs;
}

// The table's name of a module: its kind, and "baseline" for V2 with differential off.
std::string module_label(const module_spec& spec) {
  return std::string(spec.kind->name) + (spec.kind->v2() && !spec.differential ? " baseline" : "");
}

// A head size no policy compiles (tools/difftx/policies.hpp), so the check
// runs the difftx::dynamic path that serves every checkpoint's odd-sized D.
constexpr index_t check_head_dim = 6;

std::vector<double> normal_values(std::size_t n, random_stream& rng) {
  std::vector<double> v(n);
  for (auto& e : v) e = rng.normal();
  return v;
}

// The module's own initial weights, each value moved by 20% of its tensor's
// RMS, so norm weights differ from 1 and every gradient is exercised.
io::tensor_file random_weights(runner& module, random_stream& rng) {
  auto weights = module.parameters(io::dtype::f64);
  for (auto& [name, t] : weights.tensors) {
    auto v = t.values();
    double rms = 0;
    for (double e : v) rms += e * e / static_cast<double>(v.size());
    for (double& e : v) e += 0.2 * std::sqrt(rms) * rng.normal();
    t = io::stored_tensor::from_values(io::dtype::f64, t.shape, v);
  }
  return weights;
}

// The same values stored as `type`: what a module in that type holds exactly.
io::tensor_file as_type(const io::tensor_file& file, io::dtype type) {
  io::tensor_file out;
  for (const auto& [name, t] : file.tensors) out.tensors[name] = io::stored_tensor::from_values(type, t.shape, t.values());
  return out;
}

struct run_result {
  std::vector<double> output, grad_input;
  io::tensor_file gradients;
};

run_result forward_backward(runner& module, const io::tensor_file& weights, const io::stored_tensor& x,
                            const io::stored_tensor& dy) {
  module.load(weights, "check");
  module.set_input(x, "check");
  module.set_grad_output(dy, "check");
  module.zero_grad();
  module.forward();
  module.backward();
  return {module.output(io::dtype::f64).values(), module.grad_input(io::dtype::f64).values(),
          module.gradients(io::dtype::f64)};
}

double difference(const std::vector<double>& a, const std::vector<double>& b, double floor = 0) {
  return testing::normwise_difference(a.data(), b.data(), static_cast<index_t>(b.size()), floor);
}

// The worst of dx and every parameter gradient, each against at least a tenth
// of the largest reference gradient (testing::gradient_floor_fraction says why).
double gradients_difference(const run_result& ours, const run_result& ref) {
  double scale = testing::max_abs(ref.grad_input.data(), static_cast<index_t>(ref.grad_input.size()));
  std::map<std::string, std::vector<double>> ref_grads;
  for (const auto& [name, g] : ref.gradients.tensors) {
    ref_grads[name] = g.values();
    scale = std::max(scale, testing::max_abs(ref_grads[name].data(), static_cast<index_t>(ref_grads[name].size())));
  }
  const double floor = testing::gradient_floor_fraction * scale;
  double worst = difference(ours.grad_input, ref.grad_input, floor);
  for (const auto& [name, g] : ref_grads) worst = std::max(worst, difference(ours.gradients.tensors.at(name).values(), g, floor));
  return worst;
}

// testing::gradcheck through the runner interface, so it works for any policy
// and memory: the input and every parameter are variables kept on the host
// and loaded into the module before each evaluation.
testing::gradcheck_result gradcheck(runner& module, const io::tensor_file& weights, const io::stored_tensor& x,
                                    const io::stored_tensor& dy) {
  struct variable {
    std::string name;
    std::vector<index_t> shape;
    std::vector<double> value, grad;
  };
  std::vector<variable> variables{{"input", x.shape, x.values(), {}}};
  for (const auto& [name, t] : weights.tensors) variables.push_back({name, t.shape, t.values(), {}});
  for (auto& v : variables) v.grad.resize(v.value.size());
  auto forward = [&] {
    io::tensor_file current;
    for (std::size_t i = 1; i < variables.size(); ++i)
      current.tensors[variables[i].name] =
          io::stored_tensor::from_values(io::dtype::f64, variables[i].shape, variables[i].value);
    module.load(current, "gradcheck");
    module.set_input(io::stored_tensor::from_values(io::dtype::f64, variables[0].shape, variables[0].value), "gradcheck");
    module.forward();
  };
  const auto dy_values = dy.values();
  auto loss = [&]() -> long double {
    forward();
    const auto y = module.output(io::dtype::f64).values();
    long double l = 0;
    for (std::size_t i = 0; i < y.size(); ++i) l += static_cast<long double>(dy_values[i]) * y[i];
    return l;
  };
  auto gradients = [&] {
    forward();
    module.zero_grad();
    module.set_grad_output(dy, "gradcheck");
    module.backward();
    const auto dx = module.grad_input(io::dtype::f64).values();
    std::copy(dx.begin(), dx.end(), variables[0].grad.begin());  // in place: gradcheck holds pointers
    const auto grads = module.gradients(io::dtype::f64);
    for (std::size_t i = 1; i < variables.size(); ++i) {
      const auto g = grads.tensors.at(variables[i].name).values();
      std::copy(g.begin(), g.end(), variables[i].grad.begin());
    }
  };
  std::vector<testing::gradcheck_variable<double>> checked;
  for (auto& v : variables) checked.push_back({v.name, v.shape, v.value.data(), v.grad.data()});
  testing::gradcheck_options options;
  options.max_entries_per_tensor = entries_per_tensor;
  options.seed = seed;
  return testing::gradcheck<double>(checked, loss, gradients, options);
}

std::string scientific(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2e", v);
  return text;
}

int check(const policy_options& computing) {
  const int threads = computing.threads;
  const auto policies = built_policy_names();
  std::printf("difftx check: every module on x [%td, %td, 16] with random weights, policies built: ", batch, seq);
  for (const auto& p : policies) std::printf("%s%s", policy_description(p).c_str(), &p == &policies.back() ? "\n" : ", ");
  std::printf("  modules: C = 16, h = 2, g = 1, l = 1, F = 24; attention H = 4, G = 2; decoder_stack = 2 decoder layers;"
              " V2: h = 2 output heads (4 query heads; baseline: 2), g = 1; %d thread%s\n", threads,
              threads == 1 ? "" : "s");
  std::printf("  gradcheck: float64, %td sampled entries per tensor against five-point finite differences, bar %.0e\n",
              entries_per_tensor, testing::gradcheck_options{}.tolerance);
  std::printf("  vs ref: max|a - b| / max|b| against the reference policy in float64 on the same weights and input;\n"
              "  grads: the worst of dx and every parameter gradient, with max|b| at least %.0f%% of the largest gradient\n",
              100 * testing::gradient_floor_fraction);
  std::printf("  bars (testing::tolerance<T>, output / gradients):");
  for (auto t : types)
    with_type(t, [&]<class T>() {
      std::printf(" %s %.1e / %.1e%s", std::string(io::dtype_name(t)).c_str(), testing::tolerance<T>::forward,
                  testing::tolerance<T>::backward, t == types[3] ? "\n\n" : ",");
    });
  std::printf("| module                | policy    | dtype    | D | gradcheck | output vs ref | grads vs ref | result |\n");
  std::printf("|-----------------------|-----------|----------|--:|----------:|--------------:|-------------:|--------|\n");

  int rows = 0, failures = 0;
  std::vector<std::string> skipped;  // "cuda: no CUDA device was found (...)"
  random_stream rng(seed);
  for (const auto& policy : policies) {
    if (const auto reason = unavailable_reason(policy); !reason.empty()) {
      std::printf("| %-21s | %-9s | %-8s | %1s | %9s | %13s | %12s | %-6s |\n", "every module", policy.c_str(), "every",
                  "-", "-", "-", "-", "skip");
      skipped.push_back(policy + ": " + reason);
      continue;
    }
    for (const auto& spec : check_modules(check_head_dim)) {
      auto reference = make_runner(spec, "reference", io::dtype::f64, computing);
      const auto weights = random_weights(*reference, rng);
      const std::vector<index_t> shape{batch, seq, spec.d_model()};
      const auto x = normal_values(batch * seq * spec.d_model(), rng), dy = normal_values(x.size(), rng);
      for (auto type : types) {
        std::string gradcheck_text = "-", output_text = "-", grads_text = "-", result = "pass";
        if (!computes_in(policy, type)) {
          result = "n/a";
        } else {
          // Weights and inputs rounded to the type, so both sides see the same numbers.
          const auto typed_weights = as_type(weights, type);
          const auto typed_x = io::stored_tensor::from_values(type, shape, x);
          const auto typed_dy = io::stored_tensor::from_values(type, shape, dy);
          auto module = make_runner(spec, policy, type, computing);
          const auto ours = forward_backward(*module, typed_weights, typed_x, typed_dy);
          bool ok = true;
          if (type == io::dtype::f64) {
            const auto result_check = gradcheck(*module, typed_weights, typed_x, typed_dy);
            gradcheck_text = scientific(result_check.worst_error());
            ok = result_check.passed();
          }
          if (policy != "reference" || type != io::dtype::f64) {
            const auto ref = forward_backward(*reference, typed_weights, typed_x, typed_dy);
            const double output_diff = difference(ours.output, ref.output);
            const double grads_diff = gradients_difference(ours, ref);
            output_text = scientific(output_diff);
            grads_text = scientific(grads_diff);
            ok = ok && with_type(type, [&]<class T>() {
                   return output_diff <= testing::tolerance<T>::forward && grads_diff <= testing::tolerance<T>::backward;
                 });
          }
          result = ok ? "pass" : "FAIL";
          failures += ok ? 0 : 1;
          ++rows;
        }
        std::printf("| %-21s | %-9s | %-8s | %1s | %9s | %13s | %12s | %-6s |\n", module_label(spec).c_str(), policy.c_str(),
                    std::string(io::dtype_name(type)).c_str(),
                    spec.kind->has_attention() ? std::to_string(check_head_dim).c_str() : "-",
                    gradcheck_text.c_str(), output_text.c_str(), grads_text.c_str(), result.c_str());
      }
    }
  }
  std::printf("\n%d of %d checks pass\n", rows - failures, rows);
  for (const auto& line : skipped) std::printf("skipped %s\n", line.c_str());
  return failures == 0 ? 0 : 1;
}

}  // namespace

void add_check_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("check", "check every module on every policy built and every number type");
  cmd->footer(
      "For each module (rmsnorm, swiglu, multihead, attention, decoder_layer, a 2-layer decoder_stack, multihead_v2,\n"
      "multihead_v2 with differential off (its baseline) and decoder_layer_v2), each policy\n"
      "built and each dtype (float64, float32, bfloat16, float16): random weights and input, forward and backward;\n"
      "in float64 a gradient check against finite differences; every policy and dtype against the reference policy\n"
      "in float64 on the same (rounded) numbers within testing::tolerance<T>. A policy that cannot run here (cuda\n"
      "without a device) is listed as skipped and does not fail the check.\n" +
      exit_codes_help);
  // One thread by default: at these sizes threads only add overhead, and on a
  // busy machine OpenMP's spinning makes a 3-second check take minutes.
  auto computing = std::make_shared<policy_options>(policy_options{.threads = 1});
  add_policy_options(*cmd, *computing, "1", false);
  cmd->callback([computing] {
    if (const int status = check(*computing); status != 0) throw CLI::RuntimeError(status);
  });
}

}  // namespace difftx::cli
