// The retrieval demo's output folder: report.json, report.md, CSV logs, gnuplot
// scripts and the PNG figures gnuplot draws from them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <difftx/io/atomic_file.hpp>

#include <nlohmann/json.hpp>

#include "retrieval/experiment.hpp"

namespace difftx::retrieval {

// What one model's run produced.
struct model_run {
  std::string name;   // "diff" or "baseline"
  std::string label;  // for humans: "DIFF Transformer (2 heads of 2x16)"
  index_t parameters = 0;
  std::vector<step_record> history;
  evaluation eval;
  double train_seconds = 0, eval_seconds = 0;
  double tokens_per_second = 0;
};

struct run_setup {
  task_config task;
  model_config model;
  train_config train;
  eval_config eval;
  std::string policy;
  index_t head_dim = 0;  // D
  int jobs = 2;
  bool quick = false;
};

namespace detail {

inline std::string depth_name(index_t d) { return std::to_string(static_cast<int>(depths[d] * 100)) + "%"; }
inline std::string cell_name(index_t n, index_t r) { return "N=" + std::to_string(n) + ",R=" + std::to_string(r); }
inline double ratio(index_t a, index_t b) { return b ? static_cast<double>(a) / static_cast<double>(b) : 0.0; }

struct totals {
  index_t correct = 0, total = 0;
  index_t correct_by_depth[depth_count] = {}, total_by_depth[depth_count] = {};
};
inline totals sum_cells(const evaluation& e) {
  totals t;
  for (const auto& c : e.cells) {
    t.correct += c.correct;
    t.total += c.total;
    for (index_t d = 0; d < depth_count; ++d) {
      t.correct_by_depth[d] += c.correct_by_depth[d];
      t.total_by_depth[d] += c.total_by_depth[d];
    }
  }
  return t;
}

// Mean training loss over the last tenth of the steps.
inline double final_loss(const std::vector<step_record>& h) {
  if (h.empty()) return 0;
  const std::size_t k = std::max<std::size_t>(1, h.size() / 10);
  double s = 0;
  for (std::size_t i = h.size() - k; i < h.size(); ++i) s += h[i].loss;
  return s / static_cast<double>(k);
}

inline nlohmann::json magnitudes_json(const magnitudes& m) {
  return {{"top1", m.top1}, {"top10", m.top10}, {"median", m.median}, {"count", m.count}};
}

inline nlohmann::json attention_json(const evaluation& e, bool answer) {
  auto value = [&](const attention_sums& s) { return answer ? s.mean_answer() : s.mean_noise(); };
  nlohmann::json j;
  j["overall"] = value(e.attention_all);
  for (index_t d = 0; d < depth_count; ++d) j["by_depth"][depth_name(d)] = value(e.attention_by_depth[d]);
  for (const auto& s : e.attention_by_layer) j["by_layer"].push_back(value(s));
  j["count"] = e.attention_all.count;
  return j;
}

inline nlohmann::json model_json(const model_run& m) {
  const auto t = sum_cells(m.eval);
  nlohmann::json j;
  j["label"] = m.label;
  j["parameters"] = m.parameters;
  j["final_train_loss"] = final_loss(m.history);
  auto& acc = j["accuracy"];
  acc["overall"] = ratio(t.correct, t.total);
  acc["queries"] = t.total;
  for (const auto& c : m.eval.cells) {
    auto& cell = acc["by_cell"][cell_name(c.needles, c.queries)];
    cell["accuracy"] = ratio(c.correct, c.total);
    cell["queries"] = c.total;
    for (index_t d = 0; d < depth_count; ++d) cell["by_depth"][depth_name(d)] = ratio(c.correct_by_depth[d], c.total_by_depth[d]);
  }
  for (index_t d = 0; d < depth_count; ++d) acc["by_depth"][depth_name(d)] = ratio(t.correct_by_depth[d], t.total_by_depth[d]);
  j["attention_to_answer"] = attention_json(m.eval, true);
  j["attention_noise"] = attention_json(m.eval, false);
  j["attention_logits"] = magnitudes_json(m.eval.logits);
  j["hidden_states"] = magnitudes_json(m.eval.hidden);
  if (!m.eval.lambda.empty()) j["lambda"] = m.eval.lambda;
  return j;
}

inline std::string fixed(double v, int digits = 3) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

// One standard error of a proportion, for the honesty of small evaluations.
inline double standard_error(index_t correct, index_t total) {
  if (total == 0) return 0;
  const double p = ratio(correct, total);
  return std::sqrt(p * (1 - p) / static_cast<double>(total));
}

// Through a temporary renamed into place, as every file difftx writes.
inline void write_file(const std::filesystem::path& path, const std::string& text) {
  io::write_atomically(path, "retrieval", [&](std::ostream& out) { out << text; });
}

}  // namespace detail

// The CSV logs the figures are drawn from.
inline void write_csv(const std::filesystem::path& dir, const model_run& diff, const model_run& base) {
  using namespace detail;
  // Per step, and the mean over the last (up to) 50 steps for the figure.
  std::ostringstream training;
  training << "step,lr,diff_loss,diff_accuracy,diff_grad_norm,baseline_loss,baseline_accuracy,baseline_grad_norm,"
              "diff_loss_mean50,diff_accuracy_mean50,baseline_loss_mean50,baseline_accuracy_mean50\n";
  const std::size_t steps = std::min(diff.history.size(), base.history.size());
  auto trailing_mean = [](const std::vector<step_record>& h, std::size_t i, double step_record::*field) {
    const std::size_t begin = i >= 49 ? i - 49 : 0;
    double sum = 0;
    for (std::size_t j = begin; j <= i; ++j) sum += h[j].*field;
    return sum / static_cast<double>(i + 1 - begin);
  };
  for (std::size_t i = 0; i < steps; ++i) {
    const auto &a = diff.history[i], &b = base.history[i];
    training << a.step << ',' << a.lr << ',' << a.loss << ',' << a.accuracy << ',' << a.grad_norm << ',' << b.loss << ','
             << b.accuracy << ',' << b.grad_norm << ',' << trailing_mean(diff.history, i, &step_record::loss) << ','
             << trailing_mean(diff.history, i, &step_record::accuracy) << ','
             << trailing_mean(base.history, i, &step_record::loss) << ','
             << trailing_mean(base.history, i, &step_record::accuracy) << '\n';
  }
  write_file(dir / "training.csv", training.str());

  std::ostringstream cells;
  cells << "cell,needles,queries,diff_accuracy,baseline_accuracy,queries_evaluated\n";
  for (std::size_t i = 0; i < diff.eval.cells.size(); ++i) {
    const auto &a = diff.eval.cells[i], &b = base.eval.cells[i];
    cells << '"' << cell_name(a.needles, a.queries) << "\"," << a.needles << ',' << a.queries << ','
          << ratio(a.correct, a.total) << ',' << ratio(b.correct, b.total) << ',' << a.total << '\n';
  }
  write_file(dir / "accuracy_by_cell.csv", cells.str());

  std::ostringstream by_depth;
  by_depth << "depth_percent,diff_accuracy,baseline_accuracy,diff_attention_to_answer,baseline_attention_to_answer,"
              "diff_attention_noise,baseline_attention_noise\n";
  const auto ta = sum_cells(diff.eval), tb = sum_cells(base.eval);
  for (index_t d = 0; d < depth_count; ++d)
    by_depth << static_cast<int>(depths[d] * 100) << ',' << ratio(ta.correct_by_depth[d], ta.total_by_depth[d]) << ','
             << ratio(tb.correct_by_depth[d], tb.total_by_depth[d]) << ',' << diff.eval.attention_by_depth[d].mean_answer()
             << ',' << base.eval.attention_by_depth[d].mean_answer() << ',' << diff.eval.attention_by_depth[d].mean_noise()
             << ',' << base.eval.attention_by_depth[d].mean_noise() << '\n';
  write_file(dir / "by_depth.csv", by_depth.str());

  // The same sequence for both models (same evaluation seed).
  std::ostringstream profile;
  const auto &pa = diff.eval.profile, &pb = base.eval.profile;
  profile << "position,token,in_answer_span,diff_weight,baseline_weight";
  for (std::size_t l = 0; l < pa.by_layer.size(); ++l) profile << ",diff_layer" << l << ",baseline_layer" << l;
  profile << '\n';
  for (std::size_t t = 0; t < pa.mean.size(); ++t) {
    const auto p = static_cast<index_t>(t);
    profile << p << ',' << pa.tokens[t] << ',' << (p >= pa.span_begin && p < pa.span_end ? 1 : 0) << ',' << pa.mean[t] << ','
            << (t < pb.mean.size() ? pb.mean[t] : 0.0);
    for (std::size_t l = 0; l < pa.by_layer.size(); ++l)
      profile << ',' << pa.by_layer[l][t] << ',' << (l < pb.by_layer.size() && t < pb.mean.size() ? pb.by_layer[l][t] : 0.0);
    profile << '\n';
  }
  write_file(dir / "attention_profile.csv", profile.str());
}

// gnuplot scripts for the three figures; each reads the CSVs next to it.
inline std::vector<std::pair<std::string, std::string>> figure_scripts(const model_run& diff, const model_run& base) {
  const auto& p = diff.eval.profile;
  const std::string head = "set datafile separator ','\nset key autotitle columnhead\nset grid\n";
  std::vector<std::pair<std::string, std::string>> scripts;
  scripts.emplace_back("loss", head +
                                   "set terminal pngcairo size 1200,450 font 'sans,10'\nset output 'loss.png'\n"
                                   "set multiplot layout 1,2\n"
                                   "set title 'training loss on the answer tokens'\nset xlabel 'step'\n"
                                   "plot 'training.csv' using 1:3 with lines lw 0.5 lc rgb '#a0c4ff' title 'DIFF (per step)', "
                                   "'' using 1:6 with lines lw 0.5 lc rgb '#ffb3a0' title 'Transformer (per step)', "
                                   "'' using 1:9 with lines lw 2 lc rgb '#1f4e9c' title 'DIFF (mean of 50 steps)', "
                                   "'' using 1:11 with lines lw 2 lc rgb '#b8321a' title 'Transformer (mean of 50 steps)'\n"
                                   "set title 'training accuracy on the answer tokens (teacher forced, mean of 50 steps)'\n"
                                   "set yrange [0:1.05]\nset key bottom right\n"
                                   "plot 'training.csv' using 1:10 with lines lw 2 lc rgb '#1f4e9c' title 'DIFF', "
                                   "'' using 1:12 with lines lw 2 lc rgb '#b8321a' title 'Transformer'\n"
                                   "unset multiplot\n");
  scripts.emplace_back("accuracy", head +
                                       "set terminal pngcairo size 1200,450 font 'sans,10'\nset output 'accuracy.png'\n"
                                       "set multiplot layout 1,2\nset yrange [0:1.05]\nset ylabel 'retrieval accuracy'\n"
                                       "set key outside top center horizontal\n"
                                       "set title 'accuracy by needles N and queries R'\n"
                                       "set style data histograms\nset style histogram clustered gap 1\nset style fill solid 0.8 border -1\n"
                                       "set boxwidth 0.9\nset xtics rotate by -30\n"
                                       "plot 'accuracy_by_cell.csv' using 4:xtic(1) lc rgb '#1f4e9c' title 'DIFF', "
                                       "'' using 5 lc rgb '#b8321a' title 'Transformer'\n"
                                       "set style data linespoints\nset xtics norotate 25\nset xrange [-5:105]\n"
                                       "set title 'accuracy by depth of the queried needle (all N, R)'\nset xlabel 'depth (%)'\n"
                                       "plot 'by_depth.csv' using 1:2 lw 2 pt 7 lc rgb '#1f4e9c' title 'DIFF', "
                                       "'' using 1:3 lw 2 pt 5 lc rgb '#b8321a' title 'Transformer'\n"
                                       "unset multiplot\n");
  // Both models on one scale per row: the mean over layers (as Table 3 averages), then the last layer.
  const auto& q = base.eval.profile;
  const std::size_t last = p.by_layer.empty() ? 0 : p.by_layer.size() - 1;
  auto range = [&](auto&& value) {
    double lo = 0, hi = 0;
    for (std::size_t t = 0; t < p.mean.size() && t < q.mean.size(); ++t)
      for (double v : {value(p, t), value(q, t)}) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
    return "set yrange [" + std::to_string(lo - 0.05 * (hi - lo)) + ":" + std::to_string(hi + 0.05 * (hi - lo)) + "]\n";
  };
  const std::string mean_range = range([](const attention_profile& a, std::size_t t) { return a.mean[t]; });
  const std::string last_range = range([&](const attention_profile& a, std::size_t t) { return a.by_layer[last][t]; });
  const std::string last_column_diff = std::to_string(6 + 2 * last), last_column_base = std::to_string(7 + 2 * last);
  const std::string span = "set object 1 rect from " + std::to_string(p.span_begin) + "-0.5, graph 0 to " +
                           std::to_string(p.span_end) + "-0.5, graph 1 behind fc rgb '#fff2a8' fs solid 1.0 noborder\n";
  auto panel = [&](const std::string& model, const std::string& what, const std::string& column, const std::string& color) {
    return "set title \"" + model + ": " + what + "\"\nplot 'attention_profile.csv' using 1:" + column +
           " with boxes lc rgb '" + color + "' notitle\n";
  };
  const std::string last_name = "layer " + std::to_string(last) + " (last), mean over heads";
  scripts.emplace_back("attention", head +
                                        "set terminal pngcairo size 1400,800 font 'sans,10'\nset output 'attention.png'\n"
                                        "set multiplot layout 2,2\nset xlabel 'context position (yellow: the queried needle)'\n"
                                        "set ylabel 'w / sum |w|'\nset style fill solid 1.0 noborder\nset boxwidth 0.8\n"
                                        "set xrange [-1:" + std::to_string(p.answer_position + 1) + "]\n" + span + mean_range +
                                        panel(diff.label, "mean over layers and heads", "4", "#1f4e9c") +
                                        panel(base.label, "mean over layers and heads", "5", "#b8321a") + last_range +
                                        panel(diff.label, last_name, last_column_diff, "#1f4e9c") +
                                        panel(base.label, last_name, last_column_base, "#b8321a") + "unset multiplot\n");
  return scripts;
}

// Writes each script as <name>.gp and runs gnuplot on it in dir. Returns the
// names of the figures drawn; an empty list when gnuplot is missing or fails.
inline std::vector<std::string> draw_figures(const std::filesystem::path& dir, const model_run& diff, const model_run& base,
                                             std::string& problem) {
  std::vector<std::string> drawn;
  const auto scripts = figure_scripts(diff, base);
  for (const auto& [name, script] : scripts) detail::write_file(dir / (name + ".gp"), script);
  if (std::system("gnuplot --version > /dev/null 2>&1") != 0) {
    problem = "gnuplot was not found, so no PNG was drawn; the .gp scripts and CSVs are here: run `gnuplot loss.gp "
              "accuracy.gp attention.gp` in this folder (Debian: apt-get install gnuplot-nox).";
    return drawn;
  }
  for (const auto& [name, script] : scripts) {
    const std::string command = "cd '" + dir.string() + "' && gnuplot " + name + ".gp 2> " + name + ".gp.log";
    if (std::system(command.c_str()) == 0 && std::filesystem::exists(dir / (name + ".png"))) {
      drawn.push_back(name);
      std::filesystem::remove(dir / (name + ".gp.log"));
    } else {
      problem += "gnuplot failed on " + name + ".gp (see " + name + ".gp.log). ";
    }
  }
  return drawn;
}

// The paper's directions, checked on this run's numbers.
struct verdict {
  std::vector<std::string> lines;
  int agree = 0, total = 0;
};

inline verdict judge(const model_run& diff, const model_run& base) {
  using namespace detail;
  verdict v;
  const auto ta = sum_cells(diff.eval), tb = sum_cells(base.eval);
  const double acc_a = ratio(ta.correct, ta.total), acc_b = ratio(tb.correct, tb.total);
  const double se = std::hypot(standard_error(ta.correct, ta.total), standard_error(tb.correct, tb.total));
  auto line = [&](bool agrees, const std::string& text) {
    ++v.total;
    v.agree += agrees;
    v.lines.push_back(std::string(agrees ? "agrees" : "does not agree") + ": " + text);
  };
  int cells_better = 0;
  for (std::size_t i = 0; i < diff.eval.cells.size(); ++i)
    cells_better += ratio(diff.eval.cells[i].correct, diff.eval.cells[i].total) >
                    ratio(base.eval.cells[i].correct, base.eval.cells[i].total);
  line(acc_a - acc_b > 2 * se,
       "retrieval accuracy (Table 2): DIFF " + fixed(acc_a) + " vs Transformer " + fixed(acc_b) + " over " +
           std::to_string(ta.total) + " queries each (difference " + fixed(acc_a - acc_b) + ", two standard errors " +
           fixed(2 * se) + "); DIFF is higher in " + std::to_string(cells_better) + " of " +
           std::to_string(diff.eval.cells.size()) + " (N, R) cells");
  const auto& last = diff.eval.cells.back();
  const auto& last_b = base.eval.cells.back();
  const double gap_many = ratio(last.correct, last.total) - ratio(last_b.correct, last_b.total);
  const double gap_one = ratio(diff.eval.cells.front().correct, diff.eval.cells.front().total) -
                         ratio(base.eval.cells.front().correct, base.eval.cells.front().total);
  line(gap_many > 0, "with the most distractors (" + cell_name(last.needles, last.queries) + ") DIFF leads by " + fixed(gap_many) +
                         " (at " + cell_name(diff.eval.cells.front().needles, diff.eval.cells.front().queries) + ": " +
                         fixed(gap_one) + ")");
  line(diff.eval.attention_all.mean_answer() > base.eval.attention_all.mean_answer(),
       "attention to answer (Table 3, higher is better): DIFF " + fixed(diff.eval.attention_all.mean_answer()) +
           " vs Transformer " + fixed(base.eval.attention_all.mean_answer()));
  line(diff.eval.attention_all.mean_noise() < base.eval.attention_all.mean_noise(),
       "attention noise (Table 3, lower is better): DIFF " + fixed(diff.eval.attention_all.mean_noise()) +
           " vs Transformer " + fixed(base.eval.attention_all.mean_noise()));
  line(diff.eval.logits.top1 < base.eval.logits.top1,
       "largest attention logit (Table 5, lower means fewer outliers): DIFF " + fixed(diff.eval.logits.top1, 2) +
           " vs Transformer " + fixed(base.eval.logits.top1, 2) + " (medians " + fixed(diff.eval.logits.median, 2) +
           " vs " + fixed(base.eval.logits.median, 2) + ")");
  line(diff.eval.hidden.top1 < base.eval.hidden.top1,
       "largest hidden-state magnitude (Table 5): DIFF " + fixed(diff.eval.hidden.top1, 2) + " vs Transformer " +
           fixed(base.eval.hidden.top1, 2) + " (medians " + fixed(diff.eval.hidden.median, 2) + " vs " +
           fixed(base.eval.hidden.median, 2) + ")");
  return v;
}

inline nlohmann::json setup_json(const run_setup& s) {
  return {{"task",
           {{"context", s.task.context}, {"keys", s.task.keys}, {"values", s.task.values}, {"filler", s.task.filler},
            {"value_length", s.task.value_length}, {"vocabulary", vocabulary(s.task).size}}},
          {"model",
           {{"d_model", s.model.d_model}, {"layers", s.model.layers}, {"ffn_dim", s.model.ffn_dim},
            {"diff_heads", s.model.heads}, {"diff_head_size", 2 * s.head_dim}, {"baseline_heads", 2 * s.model.heads},
            {"baseline_head_size", s.head_dim}}},
          {"train",
           {{"steps", s.train.steps}, {"batch", s.train.batch}, {"warmup", s.train.warmup}, {"lr", s.train.lr},
            {"final_lr_ratio", s.train.final_lr_ratio}, {"weight_decay", s.train.weight_decay},
            {"betas", {s.train.beta1, s.train.beta2}}, {"clip", s.train.clip}, {"seed", s.train.seed}}},
          {"eval", {{"per_cell_and_depth", s.eval.per_cell}, {"stats_batch", s.eval.stats_batch}}},
          {"policy", s.policy},
          {"quick", s.quick}};
}

inline std::string markdown(const run_setup& s, const model_run& diff, const model_run& base, const verdict& v,
                            const std::vector<std::string>& figures, const std::string& figure_problem, double wall_seconds) {
  using namespace detail;
  std::ostringstream md;
  const auto ta = sum_cells(diff.eval), tb = sum_cells(base.eval);
  md << "# Multi-needle retrieval: Differential Transformer vs Transformer\n\n";
  if (s.quick) md << "**Quick run** (`--quick`): a smoke test of the pipeline, too short to learn the task; read nothing into its numbers.\n\n";
  md << "Trained from scratch in C++ with difftx (policy `" << s.policy << "`, float32, hand-derived backward), "
     << s.train.steps << " steps of " << s.train.batch << " sequences of " << s.task.context
     << " tokens, same data in the same order for both models (seed " << s.train.seed << "). Wall time " << fixed(wall_seconds, 0)
     << " s (DIFF trained in " << fixed(diff.train_seconds, 0) << " s, Transformer in " << fixed(base.train_seconds, 0) << " s, "
     << s.jobs << (s.jobs == 1 ? " thread" : " threads") << ").\n\n";
  md << "| model | layers | d_model | heads x head size | FFN | parameters | final train loss |\n|---|---:|---:|---|---:|---:|---:|\n";
  md << "| " << diff.label << " | " << s.model.layers << " | " << s.model.d_model << " | " << s.model.heads << " x " << 2 * s.head_dim
     << " (two maps of " << s.head_dim << ") | " << s.model.ffn_dim << " | " << diff.parameters << " | " << fixed(final_loss(diff.history)) << " |\n";
  md << "| " << base.label << " | " << s.model.layers << " | " << s.model.d_model << " | " << 2 * s.model.heads << " x " << s.head_dim
     << " | " << s.model.ffn_dim << " | " << base.parameters << " | " << fixed(final_loss(base.history)) << " |\n\n";
  md << "Task: a haystack of filler tokens (" << s.task.filler << " kinds) with N needles `NEEDLE key value` (" << s.task.keys
     << " keys, " << s.task.values << " values, " << s.task.value_length
     << (s.task.value_length == 1 ? " value token" : " value tokens")
     << "), then R queries `QUERY key` whose values the model must emit (chance: 1/" << s.task.values
     << (s.task.value_length > 1 ? " per token" : "") << "). Training mixes every (N, R) below with needles anywhere; "
     << "evaluation places the queried needles at the paper's depths and decodes greedily, " << s.eval.per_cell
     << " sequences per (N, R, depth).\n\n";

  md << "## Retrieval accuracy (cf. the paper's Table 2)\n\n| model |";
  for (const auto& c : diff.eval.cells) md << ' ' << cell_name(c.needles, c.queries) << " |";
  md << " all |\n|---|";
  for (std::size_t i = 0; i <= diff.eval.cells.size(); ++i) md << "---:|";
  md << '\n';
  for (const auto* m : {&diff, &base}) {
    md << "| " << m->label << " |";
    const auto t = sum_cells(m->eval);
    for (const auto& c : m->eval.cells) md << ' ' << fixed(ratio(c.correct, c.total), 2) << " |";
    md << " **" << fixed(ratio(t.correct, t.total), 3) << "** ± " << fixed(standard_error(t.correct, t.total), 3) << " |\n";
  }
  md << "\nBy depth of the queried needle (all cells):\n\n| model |";
  for (index_t d = 0; d < depth_count; ++d) md << ' ' << depth_name(d) << " |";
  md << "\n|---|";
  for (index_t d = 0; d < depth_count; ++d) md << "---:|";
  md << '\n';
  for (const auto& [m, t] : {std::pair{&diff, ta}, std::pair{&base, tb}}) {
    md << "| " << m->label << " |";
    for (index_t d = 0; d < depth_count; ++d) md << ' ' << fixed(ratio(t.correct_by_depth[d], t.total_by_depth[d]), 2) << " |";
    md << '\n';
  }

  md << "\n## Attention to the answer and attention noise (cf. Table 3)\n\n"
        "From each answer-producing position (the query's key token, whose output gives the value), over its context: "
        "with w the attention weights of a head (A for the Transformer, A1 − λ·A2 for DIFF) and S = Σ|w|, "
        "attention to answer = Σ over the queried needle's tokens of w / S, attention noise = Σ over every other token of |w| / S. "
        "Mean over every query, layer and head of the evaluation. DIFF's weights can be negative: a layer that "
        "retrieves by subtraction (a negative weight where the two maps differ) solves the task with little weight on "
        "the answer, so read these numbers with the figure's last-layer row.\n\n| model | metric |";
  for (index_t d = 0; d < depth_count; ++d) md << ' ' << depth_name(d) << " |";
  md << " all |\n|---|---|";
  for (index_t d = 0; d <= depth_count; ++d) md << "---:|";
  md << '\n';
  for (const auto* m : {&diff, &base})
    for (bool answer : {true, false}) {
      md << "| " << m->label << " | " << (answer ? "to answer ↑" : "noise ↓") << " |";
      for (index_t d = 0; d < depth_count; ++d) {
        const auto& s2 = m->eval.attention_by_depth[d];
        md << ' ' << fixed(answer ? s2.mean_answer() : s2.mean_noise(), 3) << " |";
      }
      md << ' ' << fixed(answer ? m->eval.attention_all.mean_answer() : m->eval.attention_all.mean_noise(), 3) << " |\n";
    }
  md << "\nBy layer (all depths):\n\n| model | metric |";
  for (std::size_t l = 0; l < diff.eval.attention_by_layer.size(); ++l) md << " layer " << l << " |";
  md << "\n|---|---|";
  for (std::size_t l = 0; l < diff.eval.attention_by_layer.size(); ++l) md << "---:|";
  md << '\n';
  for (const auto* m : {&diff, &base})
    for (bool answer : {true, false}) {
      md << "| " << m->label << " | " << (answer ? "to answer ↑" : "noise ↓") << " |";
      for (const auto& s2 : m->eval.attention_by_layer) md << ' ' << fixed(answer ? s2.mean_answer() : s2.mean_noise(), 3) << " |";
      md << '\n';
    }
  if (!diff.eval.lambda.empty()) {
    md << "\nDIFF's learned λ per layer:";
    for (double l : diff.eval.lambda) md << ' ' << fixed(l, 3);
    md << '\n';
  }

  md << "\n## Activation outliers (cf. Table 5)\n\nMagnitudes over " << s.eval.stats_batch
     << " training-mix sequences: every attention logit (Q·K/√d of each map, head, causal pair and layer) and every "
        "hidden state (each layer's output).\n\n| model | logits top-1 | logits top-10 | logits median | hidden top-1 | hidden top-10 | hidden median |\n"
        "|---|---:|---:|---:|---:|---:|---:|\n";
  for (const auto* m : {&diff, &base})
    md << "| " << m->label << " | " << fixed(m->eval.logits.top1, 2) << " | " << fixed(m->eval.logits.top10, 2) << " | "
       << fixed(m->eval.logits.median, 2) << " | " << fixed(m->eval.hidden.top1, 2) << " | " << fixed(m->eval.hidden.top10, 2)
       << " | " << fixed(m->eval.hidden.median, 2) << " |\n";

  md << "\n## Figures\n\n";
  if (!figure_problem.empty()) md << "**Figures:** " << figure_problem << "\n\n";
  auto has = [&](const std::string& name) { return std::find(figures.begin(), figures.end(), name) != figures.end(); };
  if (has("attention"))
    md << "Attention of the answer-producing position over the context, the same sequence for both models (" << profile_cell.needles
       << " needles, the queried one at " << depth_name(profile_depth)
       << " depth, shaded), like the paper's Figure 1; top: mean over layers and heads, bottom: the last layer:\n\n"
          "![attention](attention.png)\n\n";
  if (has("accuracy")) md << "![accuracy](accuracy.png)\n\n";
  if (has("loss")) md << "![loss](loss.png)\n\n";

  md << "## Does the toy result agree with the paper's direction?\n\n" << v.agree << " of " << v.total << " checks agree:\n\n";
  for (const auto& l : v.lines) md << "- " << l << '\n';
  md << "\nOne seed, one small model, a synthetic task: these are directions at toy scale, not the paper's numbers. "
        "Accuracy differences smaller than about two standard errors are noise. Data: report.json, training.csv, "
        "accuracy_by_cell.csv, by_depth.csv, attention_profile.csv.\n";
  return md.str();
}

// Writes every file into dir (which must exist) and returns the verdict it reports.
inline verdict write_report(const std::filesystem::path& dir, const run_setup& setup, const model_run& diff,
                            const model_run& base, double wall_seconds) {
  using namespace detail;
  write_csv(dir, diff, base);
  std::string figure_problem;
  const auto figures = draw_figures(dir, diff, base, figure_problem);
  const auto v = judge(diff, base);
  nlohmann::json j;
  j["setup"] = setup_json(setup);
  j["diff"] = model_json(diff);
  j["baseline"] = model_json(base);
  j["verdict"] = {{"agree", v.agree}, {"checks", v.total}, {"lines", v.lines}};
  // Timings vary between runs; everything above is a function of the seed.
  j["timing"] = {{"wall_seconds", wall_seconds},
                 {"diff", {{"train_seconds", diff.train_seconds}, {"eval_seconds", diff.eval_seconds}, {"tokens_per_second", diff.tokens_per_second}}},
                 {"baseline", {{"train_seconds", base.train_seconds}, {"eval_seconds", base.eval_seconds}, {"tokens_per_second", base.tokens_per_second}}},
                 {"jobs", setup.jobs}};
  j["figures"] = figures;
  write_file(dir / "report.json", j.dump(2) + "\n");
  write_file(dir / "report.md", markdown(setup, diff, base, v, figures, figure_problem, wall_seconds));
  return v;
}

}  // namespace difftx::retrieval
