// difftx retrieval: trains a small Differential Transformer and its matched
// Transformer (and, with --arch, differential attention V2) on multi-needle
// retrieval and writes a report comparing them (accuracy by needles and depth,
// attention to the answer vs noise, activation outliers), after the paper's
// Section 3.4, Table 2, Table 3 and Table 5.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <difftx/difftx.hpp>
#include <difftx/policy/simd.hpp>

#include "commands.hpp"
#include "retrieval/experiment.hpp"
#include "retrieval/report.hpp"

namespace difftx::cli {

namespace {

using namespace difftx::retrieval;

// The policies --policy offers: both models compute with the one chosen.
// policy::reference is the default the run is sized for (its results are
// bit-identical for any --jobs); policy::simd is several times faster.
constexpr const char* policy_names[] = {"reference", "simd"};

// --arch's names, in the order the report lists them (the Transformer last).
constexpr const char* architecture_names[] = {"diff", "v2", "baseline"};

struct options {
  run_setup setup;
  std::filesystem::path out;
  bool quiet = false;
};

std::string duration(double seconds) {
  const auto s = static_cast<long>(seconds + 0.5);
  char b[32];
  if (s >= 60)
    std::snprintf(b, sizeof b, "%ldm%02lds", s / 60, s % 60);
  else
    std::snprintf(b, sizeof b, "%lds", s);
  return b;
}

// Progress lines on stderr, one model per line, at every 5% of the steps and
// at least every 20 seconds: step, mean loss since the last line, tokens/s, time left.
class progress {
 public:
  progress(const run_setup& s, bool quiet) : setup_(s), quiet_(quiet) {}

  auto reporter(const std::string& name) {
    return [this, name, last_time = 0.0, last_step = index_t{0}, loss_sum = 0.0,
            acc_sum = 0.0](const step_record& r) mutable {
      loss_sum += r.loss;
      acc_sum += r.accuracy;
      const index_t steps = setup_.train.steps, every = std::max<index_t>(1, steps / 20);
      if (quiet_ || !(r.step == steps || r.step % every == 0 || r.seconds - last_time > 20)) return;
      const auto n = static_cast<double>(r.step - last_step);
      const double tokens = static_cast<double>(r.step * setup_.train.batch * setup_.task.context);
      const double left = r.seconds / static_cast<double>(r.step) * static_cast<double>(steps - r.step);
      print("%-8s step %5td/%td  loss %.3f  answer acc %.2f  %6.0f tok/s  %s elapsed, ~%s left\n", name.c_str(), r.step,
            steps, loss_sum / n, acc_sum / n, tokens / r.seconds, duration(r.seconds).c_str(), duration(left).c_str());
      last_time = r.seconds;
      last_step = r.step;
      loss_sum = acc_sum = 0;
    };
  }

  template <class... Args>
  void print(const char* format, Args... args) {
    if (quiet_) return;
    std::lock_guard lock(mutex_);
    std::fprintf(stderr, format, args...);
    std::fflush(stderr);
  }

 private:
  const run_setup& setup_;
  bool quiet_;
  std::mutex mutex_;
};

// make_model(bits): an untrained model of t's architecture with its attention logits quantized to `bits`.
template <class Layer, class MakeModel>
model_run train_and_evaluate(trainer<Layer>& t, const std::string& name, const std::string& label, const run_setup& s,
                             progress& p, const MakeModel& make_model) {
  model_run r;
  r.name = name;
  r.label = label;
  r.parameters = t.parameter_count();
  const auto start = std::chrono::steady_clock::now();
  t.train(p.reporter(name));
  const auto trained = std::chrono::steady_clock::now();
  r.train_seconds = std::chrono::duration<double>(trained - start).count();
  r.tokens_per_second = static_cast<double>(s.train.steps * s.train.batch * s.task.context) / r.train_seconds;
  p.print("%-8s evaluating: %td sequences per (N, R, depth), greedy decoding\n", name.c_str(), s.eval.per_cell);
  r.eval = t.evaluate(s.eval);
  p.print("%-8s evaluating with attention logits quantized to 8, 6 and 4 bits\n", name.c_str());
  t.evaluate_logit_bits(s.eval, make_model, r.eval);
  r.eval_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - trained).count();
  r.history = t.history();
  return r;
}

template <class Policy>
void run(const options& o, const Policy& policy) {
  const auto start = std::chrono::steady_clock::now();
  run_setup s = o.setup;
  const index_t D = half_head_dim(s.model);
  s.head_dim = D;
  const index_t V = vocabulary(s.task).size;
  auto wanted = [&](const char* name) {
    return std::find(s.architectures.begin(), s.architectures.end(), name) != s.architectures.end();
  };
  std::optional<trainer<DecoderLayer<float, dynamic, Policy>>> diff;
  std::optional<trainer<DecoderLayerV2<float, dynamic, Policy>>> v2;
  trainer base(make_baseline_model(s.model, V, policy), s.task, s.train);
  if (wanted("diff")) diff.emplace(make_diff_model(s.model, V, policy), s.task, s.train);
  if (wanted("v2")) v2.emplace(make_v2_model(s.model, V, policy), s.task, s.train);
  auto quantized = [&](int bits) {  // the run's model_config with its attention logits quantized
    model_config m = s.model;
    m.logit_bits = bits;
    return m;
  };
  progress p(s, o.quiet);

  // One job per model, in report order; each writes only its own result.
  struct job {
    std::string name, label, short_label, shape;
    index_t parameters;
    std::function<model_run()> work;
  };
  std::vector<job> jobs;
  auto add = [&](auto& t, const std::string& name, const std::string& label, const std::string& short_label,
                 const std::string& shape, auto make_model) {
    jobs.push_back({name, label, short_label, shape, t.parameter_count(), [&t, name, label, short_label, &s, &p, make_model] {
                      auto r = train_and_evaluate(t, name, label, s, p, make_model);
                      r.short_label = short_label;
                      return r;
                    }});
  };
  const index_t h = s.model.heads;
  if (diff)
    add(*diff, "diff", "DIFF Transformer", "DIFF", std::to_string(h) + " heads of 2x" + std::to_string(D),
        [&, quantized](int bits) { return make_diff_model(quantized(bits), V, policy); });
  if (v2)
    add(*v2, "v2", "DIFF V2", "DIFF V2",
        std::to_string(2 * h) + " heads of " + std::to_string(D) + " from " + std::to_string(4 * h) + " query heads",
        [&, quantized](int bits) { return make_v2_model(quantized(bits), V, policy); });
  add(base, "baseline", "Transformer", "Transformer", std::to_string(2 * h) + " heads of " + std::to_string(D),
      [&, quantized](int bits) { return make_baseline_model(quantized(bits), V, policy); });
  std::string models;
  for (const auto& j : jobs)
    models += (models.empty() ? "" : ", ") + j.short_label + " " + j.shape + " (" + std::to_string(j.parameters) + " parameters)";
  p.print("difftx retrieval: %td steps x %td sequences of %td tokens; %s; policy %s, %d thread%s\n", s.train.steps,
          s.train.batch, s.task.context, models.c_str(), s.policy.c_str(), s.jobs, s.jobs == 1 ? "" : "s");

  // --jobs 2: two workers take the models in turn (the results do not depend on which runs where).
  std::vector<model_run> results(jobs.size());
  std::atomic<std::size_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto worker = [&] {
    for (std::size_t i; (i = next++) < jobs.size();) {
      try {
        results[i] = jobs[i].work();
      } catch (...) {
        std::lock_guard lock(failure_mutex);
        if (!failure) failure = std::current_exception();
        next = jobs.size();
      }
    }
  };
  if (s.jobs >= 2) {
    std::thread other(worker);
    worker();
    other.join();
  } else {
    worker();
  }
  if (failure) std::rethrow_exception(failure);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  model_list list;
  for (const auto& r : results) list.push_back(&r);
  const auto v = write_report(o.out, s, list, wall);
  std::printf("difftx retrieval: wrote %s/report.md (and report.json, CSVs, figures) in %s\n", o.out.string().c_str(),
              duration(wall).c_str());
  std::printf("%d of %d checks agree with the paper's direction:\n", v.agree, v.total);
  for (const auto& line : v.lines) std::printf("  - %s\n", line.c_str());
  if (!v.notes.empty()) {
    std::printf("%s and %s against each other (no paper direction, no verdict):\n", list[0]->short_label.c_str(),
                list[1]->short_label.c_str());
    for (const auto& line : v.notes) std::printf("  - %s\n", line.c_str());
  }
  std::printf("attention logits quantized to 16, 8, 6 and 4 bits (the paper's Figure 8):\n");
  for (const auto& line : retrieval::detail::logit_bits_reading(list)) std::printf("  - %s\n", line.c_str());
}

// Everything a run needs checked before the first step, as bad input (exit 3).
void check(const options& o) {
  const auto& s = o.setup;
  check_task(s.task);
  const auto& m = s.model;
  require(m.d_model % (2 * m.heads) == 0 && half_head_dim(m) % 2 == 0, "retrieval", "--d-model/--heads",
          "d_model = 2 x heads x D with D even (RoPE's pairs)",
          "d_model " + std::to_string(m.d_model) + " and " + std::to_string(m.heads) + " heads");
  require(s.model.layers >= 1, "retrieval", "--layers", "at least 1", std::to_string(s.model.layers));
  require(s.train.warmup < s.train.steps, "retrieval", "--warmup", "fewer warm-up steps than --steps = " + std::to_string(s.train.steps),
          std::to_string(s.train.warmup));
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  require(!ec && std::filesystem::is_directory(o.out), "retrieval", "--out", "a folder that can be created",
          o.out.string() + (ec ? " (" + ec.message() + ")" : ""));
}

}  // namespace

void add_retrieval_command(CLI::App& app) {
  auto o = std::make_shared<options>();
  auto* cmd = app.add_subcommand(
      "retrieval",
      "Train a Differential Transformer and its matched Transformer (h vs 2h heads, same parameters, steps and data) on "
      "multi-needle retrieval, and with --arch differential attention V2 too; write report.md, report.json, CSV logs "
      "and PNG figures to --out.");
  auto& s = o->setup;
  cmd->add_option("--out", o->out, "output folder (created)")->required();
  auto* quick = cmd->add_flag("--quick", s.quick, "a smoke run under a minute (250 steps, small evaluation)");
  cmd->add_flag("--quiet", o->quiet, "no progress lines");
  // Task.
  cmd->add_option("--context", s.task.context, "tokens per sequence")->capture_default_str()->check(CLI::Range(8, 4096));
  cmd->add_option("--keys", s.task.keys, "distinct key tokens")->capture_default_str()->check(CLI::Range(6, 4096));
  cmd->add_option("--values", s.task.values, "distinct value tokens")->capture_default_str()->check(CLI::Range(2, 4096));
  cmd->add_option("--filler", s.task.filler, "distinct haystack filler tokens")->capture_default_str()->check(CLI::Range(1, 4096));
  cmd->add_option("--value-length", s.task.value_length, "tokens per value")->capture_default_str()->check(CLI::Range(1, 16));
  // Model.
  cmd->add_option("--d-model", s.model.d_model, "model width C (= 2 x heads x D, D even)")->capture_default_str()->check(count_in(1));
  cmd->add_option("--heads", s.model.heads, "differential heads h (the Transformer gets 2h)")->capture_default_str()->check(count_in(1));
  cmd->add_option("--arch", s.architectures,
                  "models to compare, comma-separated: diff (DIFF Transformer, V1), v2 (differential attention V2 with the "
                  "Transformer's 2h output heads of D and key/value heads, so 4h query heads), baseline (the Transformer, "
                  "2h heads of D); baseline and at least one of diff, v2")
      ->delimiter(',')
      ->check(CLI::IsMember(std::vector<std::string>(std::begin(architecture_names), std::end(architecture_names))))
      ->capture_default_str();
  cmd->add_option("--layers", s.model.layers, "decoder layers")->capture_default_str()->check(CLI::Range(1, 64));
  cmd->add_option("--ffn", s.model.ffn_dim, "SwiGLU hidden size")->capture_default_str()->check(count_in(1));
  // Training.
  auto* steps = cmd->add_option("--steps", s.train.steps, "optimiser steps per model")->capture_default_str()->check(CLI::Range(1, 10000000));
  cmd->add_option("--batch", s.train.batch, "sequences per step")->capture_default_str()->check(CLI::Range(1, 4096));
  auto* warmup = cmd->add_option("--warmup", s.train.warmup, "linear warm-up steps, then cosine decay to 10% (default: min(100, steps / 10))")->check(positive_finite(true));
  cmd->add_option("--lr", s.train.lr, "peak learning rate (AdamW)")->capture_default_str()->check(positive_finite());
  cmd->add_option("--weight-decay", s.train.weight_decay, "AdamW decoupled weight decay on matrices")->capture_default_str()->check(positive_finite(true));
  cmd->add_option("--seed", s.train.seed, "seed of the data and the initialisation")->capture_default_str();
  // Evaluation and running.
  auto* per_cell = cmd->add_option("--eval-per-cell", s.eval.per_cell, "evaluation sequences per (N, R, depth)")->capture_default_str()->check(CLI::Range(1, 100000));
  cmd->add_option("--jobs", s.jobs, "1: train the models one after the other; 2: side by side (same results)")->capture_default_str()->check(CLI::Range(1, 2));
  s.policy = policy_names[0];
  cmd->add_option("--policy", s.policy, "how the layers compute: reference (the default the run is sized for) or simd "
                                        "(faster; with --jobs 2 each model gets one thread)")
      ->capture_default_str()
      ->check(CLI::IsMember(std::vector<std::string>(std::begin(policy_names), std::end(policy_names))));

  cmd->callback([o, quick, steps, warmup, per_cell] {
    auto& st = o->setup;
    if (quick->count() > 0) {  // explicit flags still win
      if (steps->count() == 0) st.train.steps = 250;
      if (per_cell->count() == 0) st.eval.per_cell = 4;
      st.eval.stats_batch = 4;
    }
    // --arch: each name once, the baseline and a differential model; the report's order whatever the given one.
    std::vector<std::string> ordered;
    for (const char* name : architecture_names) {
      const auto n = std::count(st.architectures.begin(), st.architectures.end(), name);
      if (n > 1) throw CLI::ValidationError("--arch", std::string("names ") + name + " twice");
      if (n == 1) ordered.emplace_back(name);
    }
    if (ordered.size() < 2 || ordered.back() != "baseline")
      throw CLI::ValidationError("--arch", "needs baseline and at least one of diff, v2 (got " +
                                               std::to_string(ordered.size()) + " model" + (ordered.size() == 1 ? "" : "s") +
                                               (ordered.empty() || ordered.back() != "baseline" ? ", no baseline" : "") + ")");
    st.architectures = ordered;
    // Unless given, the warm-up is a tenth of the steps, at most the default.
    if (warmup->count() == 0) st.train.warmup = std::min(st.train.warmup, st.train.steps / 10);
    check(*o);
    if (st.policy == policy::simd::name)
      run(*o, policy::simd{st.jobs >= 2 ? 1 : 0});  // side by side: a thread each
    else
      run(*o, policy::reference{});
  });
}

}  // namespace difftx::cli
