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
#include "retrieval/low_bit_report.hpp"
#include "retrieval/numbers.hpp"

namespace difftx::retrieval {

// What one model's run produced.
struct model_run {
  std::string name;   // "diff", "v2" or "baseline": its key in report.json and its CSV columns
  std::string label;  // for humans: "DIFF Transformer"
  std::string short_label;  // in sentences: "DIFF", "DIFF V2", "Transformer"
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
  // The models compared, in report order (diff, v2, baseline): the Transformer and one or both differential ones.
  std::vector<std::string> architectures{"diff", "baseline"};
};

// The models of a report, in its order; the last is the Transformer baseline.
using model_list = std::vector<const model_run*>;

namespace detail {

// Plot colours of a model: strong (means, bars) and light (per-step lines).
inline std::pair<std::string, std::string> colours(const std::string& name) {
  if (name == "diff") return {"#1f4e9c", "#a0c4ff"};
  if (name == "v2") return {"#2a8a3e", "#a8e0b5"};
  return {"#b8321a", "#ffb3a0"};
}

// "2 x 32 (two maps of 16)": a model's heads as the model table shows them.
inline std::string heads_text(const run_setup& s, const std::string& name) {
  const index_t h = s.model.heads, D = s.head_dim;
  if (name == "diff") return std::to_string(h) + " x " + std::to_string(2 * D) + " (two maps of " + std::to_string(D) + ")";
  if (name == "v2")
    return std::to_string(2 * h) + " x " + std::to_string(D) + " (" + std::to_string(4 * h) + " query heads of " +
           std::to_string(D) + " subtracted in pairs, λ per token; " + std::to_string(2 * h) + " key/value heads)";
  return std::to_string(2 * h) + " x " + std::to_string(D);
}

inline std::string depth_name(index_t d) { return std::to_string(static_cast<int>(depths[d] * 100)) + "%"; }
inline std::string cell_name(index_t n, index_t r) { return "N=" + std::to_string(n) + ",R=" + std::to_string(r); }
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
  if (!m.eval.by_logit_bits.empty()) j["accuracy_by_logit_bits"] = logit_bits_json(m.eval);
  return j;
}

// Through a temporary renamed into place, as every file difftx writes.
inline void write_file(const std::filesystem::path& path, const std::string& text) {
  io::write_atomically(path, "retrieval", [&](std::ostream& out) { out << text; });
}

}  // namespace detail

// The CSV logs the figures are drawn from: per model (in the list's order)
// the same columns, named after the model (diff_loss, v2_loss, baseline_loss, ...).
inline void write_csv(const std::filesystem::path& dir, const model_list& models) {
  using namespace detail;
  // Per step, and the mean over the last (up to) 50 steps for the figure.
  std::ostringstream training;
  training << "step,lr";
  for (const auto* m : models) training << ',' << m->name << "_loss," << m->name << "_accuracy," << m->name << "_grad_norm";
  for (const auto* m : models) training << ',' << m->name << "_loss_mean50," << m->name << "_accuracy_mean50";
  training << '\n';
  std::size_t steps = models.front()->history.size();
  for (const auto* m : models) steps = std::min(steps, m->history.size());
  auto trailing_mean = [](const std::vector<step_record>& h, std::size_t i, double step_record::*field) {
    const std::size_t begin = i >= 49 ? i - 49 : 0;
    double sum = 0;
    for (std::size_t j = begin; j <= i; ++j) sum += h[j].*field;
    return sum / static_cast<double>(i + 1 - begin);
  };
  for (std::size_t i = 0; i < steps; ++i) {
    const auto& first = models.front()->history[i];
    training << first.step << ',' << first.lr;
    for (const auto* m : models) {
      const auto& r = m->history[i];
      training << ',' << r.loss << ',' << r.accuracy << ',' << r.grad_norm;
    }
    for (const auto* m : models)
      training << ',' << trailing_mean(m->history, i, &step_record::loss) << ','
               << trailing_mean(m->history, i, &step_record::accuracy);
    training << '\n';
  }
  write_file(dir / "training.csv", training.str());

  std::ostringstream cells;
  cells << "cell,needles,queries";
  for (const auto* m : models) cells << ',' << m->name << "_accuracy";
  cells << ",queries_evaluated\n";
  for (std::size_t i = 0; i < models.front()->eval.cells.size(); ++i) {
    const auto& a = models.front()->eval.cells[i];
    cells << '"' << cell_name(a.needles, a.queries) << "\"," << a.needles << ',' << a.queries;
    for (const auto* m : models) cells << ',' << ratio(m->eval.cells[i].correct, m->eval.cells[i].total);
    cells << ',' << a.total << '\n';
  }
  write_file(dir / "accuracy_by_cell.csv", cells.str());

  std::ostringstream by_depth;
  by_depth << "depth_percent";
  for (const char* column : {"_accuracy", "_attention_to_answer", "_attention_noise"})
    for (const auto* m : models) by_depth << ',' << m->name << column;
  by_depth << '\n';
  std::vector<totals> sums;
  for (const auto* m : models) sums.push_back(sum_cells(m->eval));
  for (index_t d = 0; d < depth_count; ++d) {
    by_depth << static_cast<int>(depths[d] * 100);
    for (const auto& ti : sums) by_depth << ',' << ratio(ti.correct_by_depth[d], ti.total_by_depth[d]);
    for (const auto* m : models) by_depth << ',' << m->eval.attention_by_depth[d].mean_answer();
    for (const auto* m : models) by_depth << ',' << m->eval.attention_by_depth[d].mean_noise();
    by_depth << '\n';
  }
  write_file(dir / "by_depth.csv", by_depth.str());

  // The same sequence for every model (same evaluation seed).
  std::ostringstream profile;
  const auto& pa = models.front()->eval.profile;
  profile << "position,token,in_answer_span";
  for (const auto* m : models) profile << ',' << m->name << "_weight";
  for (std::size_t l = 0; l < pa.by_layer.size(); ++l)
    for (const auto* m : models) profile << ',' << m->name << "_layer" << l;
  profile << '\n';
  for (std::size_t t = 0; t < pa.mean.size(); ++t) {
    const auto p = static_cast<index_t>(t);
    profile << p << ',' << pa.tokens[t] << ',' << (p >= pa.span_begin && p < pa.span_end ? 1 : 0);
    for (const auto* m : models) profile << ',' << (t < m->eval.profile.mean.size() ? m->eval.profile.mean[t] : 0.0);
    for (std::size_t l = 0; l < pa.by_layer.size(); ++l)
      for (const auto* m : models) {
        const auto& pm = m->eval.profile;
        profile << ',' << (l < pm.by_layer.size() && t < pm.mean.size() ? pm.by_layer[l][t] : 0.0);
      }
    profile << '\n';
  }
  write_file(dir / "attention_profile.csv", profile.str());
  if (!models.front()->eval.by_logit_bits.empty()) write_file(dir / "logit_bits.csv", logit_bits_csv(models));
}

// gnuplot scripts for the three figures; each reads the CSVs next to it
// (columns as write_csv lays them out for these models).
inline std::vector<std::pair<std::string, std::string>> figure_scripts(const model_list& models) {
  const auto M = models.size();
  const auto& p = models.front()->eval.profile;
  auto column = [](std::size_t c) { return std::to_string(c); };
  const std::string head = "set datafile separator ','\nset key autotitle columnhead\nset grid\n";
  std::vector<std::pair<std::string, std::string>> scripts;
  // training.csv: 1 step, 2 lr, 3 + 3i loss of model i, 4 + 3i its accuracy; then 3 + 3M + 2i its mean loss, 4 + 3M + 2i its mean accuracy.
  std::string per_step, means, accuracies;
  for (std::size_t i = 0; i < M; ++i) {
    const auto& m = *models[i];
    const auto [strong, light] = detail::colours(m.name);
    per_step += std::string(i ? ", '' using 1:" : "plot 'training.csv' using 1:") + column(3 + 3 * i) +
                " with lines lw 0.5 lc rgb '" + light + "' title '" + m.short_label + " (per step)'";
    means += ", '' using 1:" + column(3 + 3 * M + 2 * i) + " with lines lw 2 lc rgb '" + strong + "' title '" +
             m.short_label + " (mean of 50 steps)'";
    accuracies += std::string(i ? ", '' using 1:" : "plot 'training.csv' using 1:") + column(4 + 3 * M + 2 * i) +
                  " with lines lw 2 lc rgb '" + strong + "' title '" + m.short_label + "'";
  }
  scripts.emplace_back("loss", head +
                                   "set terminal pngcairo size 1200,450 font 'sans,10'\nset output 'loss.png'\n"
                                   "set multiplot layout 1,2\n"
                                   "set title 'training loss on the answer tokens'\nset xlabel 'step'\n" +
                                   per_step + means + "\n" +
                                   "set title 'training accuracy on the answer tokens (teacher forced, mean of 50 steps)'\n"
                                   "set yrange [0:1.05]\nset key bottom right\n" +
                                   accuracies + "\nunset multiplot\n");
  // accuracy_by_cell.csv: 4 + i; by_depth.csv: 2 + i.
  std::string bars, lines;
  for (std::size_t i = 0; i < M; ++i) {
    const auto& m = *models[i];
    const std::string strong = detail::colours(m.name).first;
    bars += (i ? ", '' using " + column(4 + i) : "plot 'accuracy_by_cell.csv' using 4:xtic(1)") + " lc rgb '" + strong +
            "' title '" + m.short_label + "'";
    lines += std::string(i ? ", '' using 1:" : "plot 'by_depth.csv' using 1:") + column(2 + i) + " lw 2 pt " +
             column(i == 0 ? 7 : i == 1 ? 5 : 9) + " lc rgb '" + strong + "' title '" + m.short_label + "'";
  }
  scripts.emplace_back("accuracy", head +
                                       "set terminal pngcairo size 1200,450 font 'sans,10'\nset output 'accuracy.png'\n"
                                       "set multiplot layout 1,2\nset yrange [0:1.05]\nset ylabel 'retrieval accuracy'\n"
                                       "set key outside top center horizontal\n"
                                       "set title 'accuracy by needles N and queries R'\n"
                                       "set style data histograms\nset style histogram clustered gap 1\nset style fill solid 0.8 border -1\n"
                                       "set boxwidth 0.9\nset xtics rotate by -30\n" +
                                       bars +
                                       "\nset style data linespoints\nset xtics norotate 25\nset xrange [-5:105]\n"
                                       "set title 'accuracy by depth of the queried needle (all N, R)'\nset xlabel 'depth (%)'\n" +
                                       lines + "\nunset multiplot\n");
  // Every model on one scale per row: the mean over layers (as Table 3 averages), then the last layer.
  // attention_profile.csv: 4 + i the mean of model i; 4 + M + l·M + i its layer l.
  const std::size_t last = p.by_layer.empty() ? 0 : p.by_layer.size() - 1;
  auto range = [&](auto&& value) {
    double lo = 0, hi = 0;
    for (const auto* m : models)
      for (std::size_t t = 0; t < p.mean.size() && t < m->eval.profile.mean.size(); ++t) {
        const double v = value(m->eval.profile, t);
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
    return "set yrange [" + std::to_string(lo - 0.05 * (hi - lo)) + ":" + std::to_string(hi + 0.05 * (hi - lo)) + "]\n";
  };
  const std::string mean_range = range([](const attention_profile& a, std::size_t t) { return a.mean[t]; });
  const std::string last_range = range([&](const attention_profile& a, std::size_t t) { return a.by_layer[last][t]; });
  const std::string span = "set object 1 rect from " + std::to_string(p.span_begin) + "-0.5, graph 0 to " +
                           std::to_string(p.span_end) + "-0.5, graph 1 behind fc rgb '#fff2a8' fs solid 1.0 noborder\n";
  auto panel = [&](const std::string& model, const std::string& what, const std::string& col, const std::string& colour) {
    return "set title \"" + model + ": " + what + "\"\nplot 'attention_profile.csv' using 1:" + col +
           " with boxes lc rgb '" + colour + "' notitle\n";
  };
  const std::string last_name = "layer " + std::to_string(last) + " (last), mean over heads";
  std::string panels = mean_range;
  for (std::size_t i = 0; i < M; ++i)
    panels += panel(models[i]->label, "mean over layers and heads", column(4 + i), detail::colours(models[i]->name).first);
  panels += last_range;
  for (std::size_t i = 0; i < M; ++i)
    panels += panel(models[i]->label, last_name, column(4 + M + last * M + i), detail::colours(models[i]->name).first);
  scripts.emplace_back("attention", head + "set terminal pngcairo size " + std::to_string(700 * M) +
                                        ",800 font 'sans,10'\nset output 'attention.png'\n"
                                        "set multiplot layout 2," + std::to_string(M) +
                                        "\nset xlabel 'context position (yellow: the queried needle)'\n"
                                        "set ylabel 'w / sum |w|'\nset style fill solid 1.0 noborder\nset boxwidth 0.8\n"
                                        "set xrange [-1:" + std::to_string(p.answer_position + 1) + "]\n" + span + panels +
                                        "unset multiplot\n");
  if (!models.front()->eval.by_logit_bits.empty())
    scripts.emplace_back("logit_bits", detail::logit_bits_script(models, [](const std::string& name) { return detail::colours(name).first; }));
  return scripts;
}

// Writes each script as <name>.gp and runs gnuplot on it in dir. Returns the
// names of the figures drawn; an empty list when gnuplot is missing or fails.
inline std::vector<std::string> draw_figures(const std::filesystem::path& dir, const model_list& models,
                                             std::string& problem) {
  std::vector<std::string> drawn;
  const auto scripts = figure_scripts(models);
  for (const auto& [name, script] : scripts) detail::write_file(dir / (name + ".gp"), script);
  if (std::system("gnuplot --version > /dev/null 2>&1") != 0) {
    problem = "gnuplot was not found, so no PNG was drawn; the .gp scripts and CSVs are here: run `gnuplot loss.gp "
              "accuracy.gp attention.gp logit_bits.gp` in this folder (Debian: apt-get install gnuplot-nox).";
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

// The paper's directions, checked on this run's numbers: each differential
// model against the Transformer. notes: with both differential models, how
// they compare with each other (no paper direction, so no verdict).
struct verdict {
  std::vector<std::string> lines;
  int agree = 0, total = 0;
  std::vector<std::string> notes;
};

namespace detail {

// Accuracy of a against b: the difference and whether it exceeds two standard errors.
inline std::string accuracy_comparison(const model_run& a, const model_run& b) {
  const auto ta = sum_cells(a.eval), tb = sum_cells(b.eval);
  const double acc_a = ratio(ta.correct, ta.total), acc_b = ratio(tb.correct, tb.total);
  const double se = std::hypot(standard_error(ta.correct, ta.total), standard_error(tb.correct, tb.total));
  const double gap = acc_a - acc_b;
  return a.short_label + " " + fixed(acc_a) + " vs " + b.short_label + " " + fixed(acc_b) + " over " +
         std::to_string(ta.total) + " queries each (difference " + fixed(gap) + ", two standard errors " + fixed(2 * se) +
         ": " + (gap > 2 * se ? a.short_label + " higher" : gap < -2 * se ? b.short_label + " higher" : "within noise") + ")";
}

// The six checks of one differential model against the Transformer.
inline void judge_pair(const model_run& diff, const model_run& base, verdict& v) {
  const auto ta = sum_cells(diff.eval), tb = sum_cells(base.eval);
  const double acc_a = ratio(ta.correct, ta.total), acc_b = ratio(tb.correct, tb.total);
  const double se = std::hypot(standard_error(ta.correct, ta.total), standard_error(tb.correct, tb.total));
  const std::string& D = diff.short_label;
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
       "retrieval accuracy (Table 2): " + D + " " + fixed(acc_a) + " vs Transformer " + fixed(acc_b) + " over " +
           std::to_string(ta.total) + " queries each (difference " + fixed(acc_a - acc_b) + ", two standard errors " +
           fixed(2 * se) + "); " + D + " is higher in " + std::to_string(cells_better) + " of " +
           std::to_string(diff.eval.cells.size()) + " (N, R) cells");
  const auto& last = diff.eval.cells.back();
  const auto& last_b = base.eval.cells.back();
  const double gap_many = ratio(last.correct, last.total) - ratio(last_b.correct, last_b.total);
  const double gap_one = ratio(diff.eval.cells.front().correct, diff.eval.cells.front().total) -
                         ratio(base.eval.cells.front().correct, base.eval.cells.front().total);
  line(gap_many > 0, "with the most distractors (" + cell_name(last.needles, last.queries) + ") " + D + " leads by " +
                         fixed(gap_many) + " (at " + cell_name(diff.eval.cells.front().needles, diff.eval.cells.front().queries) +
                         ": " + fixed(gap_one) + ")");
  line(diff.eval.attention_all.mean_answer() > base.eval.attention_all.mean_answer(),
       "attention to answer (Table 3, higher is better): " + D + " " + fixed(diff.eval.attention_all.mean_answer()) +
           " vs Transformer " + fixed(base.eval.attention_all.mean_answer()));
  line(diff.eval.attention_all.mean_noise() < base.eval.attention_all.mean_noise(),
       "attention noise (Table 3, lower is better): " + D + " " + fixed(diff.eval.attention_all.mean_noise()) +
           " vs Transformer " + fixed(base.eval.attention_all.mean_noise()));
  line(diff.eval.logits.top1 < base.eval.logits.top1,
       "largest attention logit (Table 5, lower means fewer outliers): " + D + " " + fixed(diff.eval.logits.top1, 2) +
           " vs Transformer " + fixed(base.eval.logits.top1, 2) + " (medians " + fixed(diff.eval.logits.median, 2) +
           " vs " + fixed(base.eval.logits.median, 2) + ")");
  line(diff.eval.hidden.top1 < base.eval.hidden.top1,
       "largest hidden-state magnitude (Table 5): " + D + " " + fixed(diff.eval.hidden.top1, 2) + " vs Transformer " +
           fixed(base.eval.hidden.top1, 2) + " (medians " + fixed(diff.eval.hidden.median, 2) + " vs " +
           fixed(base.eval.hidden.median, 2) + ")");
}

}  // namespace detail

// models: the differential ones, then the Transformer (last).
inline verdict judge(const model_list& models) {
  using namespace detail;
  verdict v;
  const auto& base = *models.back();
  for (std::size_t i = 0; i + 1 < models.size(); ++i) judge_pair(*models[i], base, v);
  if (models.size() == 3) {
    const auto &a = *models[0], &b = *models[1];
    v.notes.push_back("retrieval accuracy: " + accuracy_comparison(a, b));
    v.notes.push_back("attention to answer " + fixed(a.eval.attention_all.mean_answer()) + " vs " +
                      fixed(b.eval.attention_all.mean_answer()) + ", attention noise " +
                      fixed(a.eval.attention_all.mean_noise()) + " vs " + fixed(b.eval.attention_all.mean_noise()) +
                      ", largest attention logit " + fixed(a.eval.logits.top1, 2) + " vs " + fixed(b.eval.logits.top1, 2) +
                      ", largest hidden state " + fixed(a.eval.hidden.top1, 2) + " vs " + fixed(b.eval.hidden.top1, 2) +
                      " (" + a.short_label + " vs " + b.short_label + ")");
  }
  return v;
}

inline nlohmann::json setup_json(const run_setup& s) {
  nlohmann::json model{{"d_model", s.model.d_model}, {"layers", s.model.layers}, {"ffn_dim", s.model.ffn_dim},
                       {"diff_heads", s.model.heads}, {"diff_head_size", 2 * s.head_dim},
                       {"baseline_heads", 2 * s.model.heads}, {"baseline_head_size", s.head_dim}};
  if (std::find(s.architectures.begin(), s.architectures.end(), "v2") != s.architectures.end())
    model.update({{"v2_heads", 2 * s.model.heads}, {"v2_query_heads", 4 * s.model.heads},
                  {"v2_kv_heads", 2 * s.model.heads}, {"v2_head_size", s.head_dim}});
  return {{"task",
           {{"context", s.task.context}, {"keys", s.task.keys}, {"values", s.task.values}, {"filler", s.task.filler},
            {"value_length", s.task.value_length}, {"vocabulary", vocabulary(s.task).size}}},
          {"model", model},
          {"architectures", s.architectures},
          {"train",
           {{"steps", s.train.steps}, {"batch", s.train.batch}, {"warmup", s.train.warmup}, {"lr", s.train.lr},
            {"final_lr_ratio", s.train.final_lr_ratio}, {"weight_decay", s.train.weight_decay},
            {"betas", {s.train.beta1, s.train.beta2}}, {"clip", s.train.clip}, {"seed", s.train.seed}}},
          {"eval", {{"per_cell_and_depth", s.eval.per_cell}, {"stats_batch", s.eval.stats_batch}}},
          {"policy", s.policy},
          {"quick", s.quick}};
}

inline std::string markdown(const run_setup& s, const model_list& models, const verdict& v,
                            const std::vector<std::string>& figures, const std::string& figure_problem, double wall_seconds) {
  using namespace detail;
  std::ostringstream md;
  auto has = [&](const std::string& name) {
    return std::any_of(models.begin(), models.end(), [&](const model_run* m) { return m->name == name; });
  };
  const bool v1 = has("diff"), v2 = has("v2");
  md << "# Multi-needle retrieval: "
     << (v1 && v2 ? "Differential Transformer (V1 and V2)" : v2 ? "Differential Transformer V2" : "Differential Transformer")
     << " vs Transformer\n\n";
  if (s.quick) md << "**Quick run** (`--quick`): a smoke test of the pipeline, too short to learn the task; read nothing into its numbers.\n\n";
  md << "Trained from scratch in C++ with difftx (policy `" << s.policy << "`, float32, hand-derived backward), "
     << s.train.steps << " steps of " << s.train.batch << " sequences of " << s.task.context << " tokens, same data in the same order for "
     << (models.size() == 2 ? "both models" : "every model") << " (seed " << s.train.seed << "). Wall time " << fixed(wall_seconds, 0) << " s (";
  for (std::size_t i = 0; i < models.size(); ++i)
    md << (i == 0 ? "" : ", ") << models[i]->short_label << (i == 0 ? " trained in " : " in ")
       << fixed(models[i]->train_seconds, 0) << " s";
  md << ", " << s.jobs << (s.jobs == 1 ? " thread" : " threads") << ").\n\n";
  md << "| model | layers | d_model | heads x head size | FFN | parameters | final train loss |\n|---|---:|---:|---|---:|---:|---:|\n";
  for (const auto* m : models)
    md << "| " << m->label << " | " << s.model.layers << " | " << s.model.d_model << " | " << heads_text(s, m->name) << " | "
       << s.model.ffn_dim << " | " << m->parameters << " | " << fixed(final_loss(m->history)) << " |\n";
  md << '\n';
  if (v2)
    md << "DIFF V2 has the Transformer's output heads, head size and key/value heads, and twice its query heads "
          "(pairs a_2i − λ·a_2i+1, λ = sigmoid(x·W_λ) per token and head), so its q_proj is twice the Transformer's "
          "and it has lambda_proj: the parameter column shows the difference.\n\n";
  md << "Task: a haystack of filler tokens (" << s.task.filler << " kinds) with N needles `NEEDLE key value` (" << s.task.keys
     << " keys, " << s.task.values << " values, " << s.task.value_length
     << (s.task.value_length == 1 ? " value token" : " value tokens")
     << "), then R queries `QUERY key` whose values the model must emit (chance: 1/" << s.task.values
     << (s.task.value_length > 1 ? " per token" : "") << "). Training mixes every (N, R) below with needles anywhere; "
     << "evaluation places the queried needles at the paper's depths and decodes greedily, " << s.eval.per_cell
     << " sequences per (N, R, depth).\n\n";

  const auto& cells = models.front()->eval.cells;
  md << "## Retrieval accuracy (cf. the paper's Table 2)\n\n| model |";
  for (const auto& c : cells) md << ' ' << cell_name(c.needles, c.queries) << " |";
  md << " all |\n|---|";
  for (std::size_t i = 0; i <= cells.size(); ++i) md << "---:|";
  md << '\n';
  for (const auto* m : models) {
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
  for (const auto* m : models) {
    const auto t = sum_cells(m->eval);
    md << "| " << m->label << " |";
    for (index_t d = 0; d < depth_count; ++d) md << ' ' << fixed(ratio(t.correct_by_depth[d], t.total_by_depth[d]), 2) << " |";
    md << '\n';
  }

  md << "\n## Attention to the answer and attention noise (cf. Table 3)\n\n"
        "From each answer-producing position (the query's key token, whose output gives the value), over its context: "
        "with w the attention weights of a head (A for the Transformer, A1 − λ·A2 for DIFF"
     << (v2 ? ", A_2i − λ·A_2i+1 for output head i of DIFF V2 with that position's own λ" : "")
     << ") and S = Σ|w|, "
        "attention to answer = Σ over the queried needle's tokens of w / S, attention noise = Σ over every other token of |w| / S. "
        "Mean over every query, layer and head of the evaluation. "
     << (v2 ? "A differential model's" : "DIFF's")
     << " weights can be negative: a layer that "
        "retrieves by subtraction (a negative weight where the two maps differ) solves the task with little weight on "
        "the answer, so read these numbers with the figure's last-layer row.\n\n| model | metric |";
  for (index_t d = 0; d < depth_count; ++d) md << ' ' << depth_name(d) << " |";
  md << " all |\n|---|---|";
  for (index_t d = 0; d <= depth_count; ++d) md << "---:|";
  md << '\n';
  for (const auto* m : models)
    for (bool answer : {true, false}) {
      md << "| " << m->label << " | " << (answer ? "to answer ↑" : "noise ↓") << " |";
      for (index_t d = 0; d < depth_count; ++d) {
        const auto& s2 = m->eval.attention_by_depth[d];
        md << ' ' << fixed(answer ? s2.mean_answer() : s2.mean_noise(), 3) << " |";
      }
      md << ' ' << fixed(answer ? m->eval.attention_all.mean_answer() : m->eval.attention_all.mean_noise(), 3) << " |\n";
    }
  const auto layers = models.front()->eval.attention_by_layer.size();
  md << "\nBy layer (all depths):\n\n| model | metric |";
  for (std::size_t l = 0; l < layers; ++l) md << " layer " << l << " |";
  md << "\n|---|---|";
  for (std::size_t l = 0; l < layers; ++l) md << "---:|";
  md << '\n';
  for (const auto* m : models)
    for (bool answer : {true, false}) {
      md << "| " << m->label << " | " << (answer ? "to answer ↑" : "noise ↓") << " |";
      for (const auto& s2 : m->eval.attention_by_layer) md << ' ' << fixed(answer ? s2.mean_answer() : s2.mean_noise(), 3) << " |";
      md << '\n';
    }
  for (const auto* m : models) {
    if (m->eval.lambda.empty()) continue;
    md << '\n'
       << (m->name == "v2" ? "DIFF V2's mean λ per layer (λ = sigmoid(x·W_λ) per token and head; the mean over the "
                             "answer-producing positions and heads):"
                           : m->short_label + "'s learned λ per layer:");
    for (double l : m->eval.lambda) md << ' ' << fixed(l, 3);
    md << '\n';
  }

  md << "\n## Activation outliers (cf. Table 5)\n\nMagnitudes over " << s.eval.stats_batch
     << " training-mix sequences: every attention logit (Q·K/√d of each map, head, causal pair and layer"
     << (v2 ? "; DIFF V2: of each of its query heads" : "")
     << ") and every "
        "hidden state (each layer's output).\n\n| model | logits top-1 | logits top-10 | logits median | hidden top-1 | hidden top-10 | hidden median |\n"
        "|---|---:|---:|---:|---:|---:|---:|\n";
  for (const auto* m : models)
    md << "| " << m->label << " | " << fixed(m->eval.logits.top1, 2) << " | " << fixed(m->eval.logits.top10, 2) << " | "
       << fixed(m->eval.logits.median, 2) << " | " << fixed(m->eval.hidden.top1, 2) << " | " << fixed(m->eval.hidden.top10, 2)
       << " | " << fixed(m->eval.hidden.median, 2) << " |\n";

  if (!models.front()->eval.by_logit_bits.empty()) {
    md << "\n## Attention logits in low bits (cf. the paper's §3.7 and Figure 8)\n\n"
          "The trained weights evaluated again (the same sequences, greedy decoding with the KV cache) with every "
          "attention logit quantized before its softmax: dynamic absmax per query row of each map, "
          "s' = round(s · q_max / max|s|) · max|s| / q_max with q_max = 2^(b-1) - 1 (docs/semantics.md). "
          "16 bits is the unquantized model.\n\n| model |";
    for (int bits : logit_bit_levels) md << ' ' << bits << " bits |";
    md << "\n|---|";
    for (std::size_t i = 0; i < std::size(logit_bit_levels); ++i) md << "---:|";
    md << '\n';
    for (const auto* m : models) {
      md << "| " << m->label << " |";
      for (const auto& a : m->eval.by_logit_bits) md << ' ' << fixed(bits_ratio(a)) << " ± " << fixed(bits_error(a)) << " |";
      md << '\n';
    }
    md << '\n';
    for (const auto& l : logit_bits_reading(models)) md << "- " << l << '\n';
  }

  md << "\n## Figures\n\n";
  if (!figure_problem.empty()) md << "**Figures:** " << figure_problem << "\n\n";
  auto drawn = [&](const std::string& name) { return std::find(figures.begin(), figures.end(), name) != figures.end(); };
  if (drawn("attention"))
    md << "Attention of the answer-producing position over the context, the same sequence for "
       << (models.size() == 2 ? "both models" : "every model") << " (" << profile_cell.needles
       << " needles, the queried one at " << depth_name(profile_depth)
       << " depth, shaded), like the paper's Figure 1; top: mean over layers and heads, bottom: the last layer:\n\n"
          "![attention](attention.png)\n\n";
  if (drawn("accuracy")) md << "![accuracy](accuracy.png)\n\n";
  if (drawn("loss")) md << "![loss](loss.png)\n\n";
  if (drawn("logit_bits")) md << "![accuracy with quantized attention logits](logit_bits.png)\n\n";

  md << "## Does the toy result agree with the paper's direction?\n\n" << v.agree << " of " << v.total << " checks agree";
  if (models.size() == 3)
    md << " (six for each differential model against the Transformer; the directions are those of the DIFF paper, "
          "checked for V2 the same way)";
  md << ":\n\n";
  for (const auto& l : v.lines) md << "- " << l << '\n';
  if (!v.notes.empty()) {
    md << "\n" << models[0]->short_label << " and " << models[1]->short_label
       << " against each other (no paper direction to check, so no verdict):\n\n";
    for (const auto& l : v.notes) md << "- " << l << '\n';
  }
  md << "\nOne seed, one small model, a synthetic task: these are directions at toy scale, not the paper's numbers. "
        "Accuracy differences smaller than about two standard errors are noise. Data: report.json, training.csv, "
        "accuracy_by_cell.csv, by_depth.csv, attention_profile.csv, logit_bits.csv.\n";
  return md.str();
}

// Writes every file into dir (which must exist) and returns the verdict it
// reports. models: the differential ones (diff, v2), then the Transformer.
inline verdict write_report(const std::filesystem::path& dir, const run_setup& setup, const model_list& models,
                            double wall_seconds) {
  using namespace detail;
  write_csv(dir, models);
  std::string figure_problem;
  const auto figures = draw_figures(dir, models, figure_problem);
  const auto v = judge(models);
  nlohmann::json j;
  j["setup"] = setup_json(setup);
  for (const auto* m : models) j[m->name] = model_json(*m);
  j["verdict"] = {{"agree", v.agree}, {"checks", v.total}, {"lines", v.lines}};
  if (!v.notes.empty()) j["verdict"]["notes"] = v.notes;
  if (!models.front()->eval.by_logit_bits.empty()) j["logit_bits"] = {{"bits", logit_bit_levels}, {"reading", logit_bits_reading(models)}};
  // Timings vary between runs; everything above is a function of the seed.
  j["timing"] = {{"wall_seconds", wall_seconds}, {"jobs", setup.jobs}};
  for (const auto* m : models)
    j["timing"][m->name] = {{"train_seconds", m->train_seconds}, {"eval_seconds", m->eval_seconds},
                            {"tokens_per_second", m->tokens_per_second}};
  j["figures"] = figures;
  write_file(dir / "report.json", j.dump(2) + "\n");
  write_file(dir / "report.md", markdown(setup, models, v, figures, figure_problem, wall_seconds));
  return v;
}

}  // namespace difftx::retrieval
