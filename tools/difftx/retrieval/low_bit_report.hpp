// The retrieval report's low-bit part: accuracy with the attention logits
// quantized to 16 (not at all), 8, 6 and 4 bits (the paper's §3.7 and Figure
// 8), as a table, report.json entries, logit_bits.csv, a gnuplot figure and a
// reading of whether the differential models degrade less than the Transformer.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "retrieval/experiment.hpp"
#include "retrieval/numbers.hpp"

namespace difftx::retrieval {

namespace detail {

inline double bits_ratio(const bits_accuracy& a) { return ratio(a.correct, a.total); }
inline double bits_error(const bits_accuracy& a) { return standard_error(a.correct, a.total); }

inline nlohmann::json logit_bits_json(const evaluation& e) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& a : e.by_logit_bits)
    j[std::to_string(a.bits)] = {{"accuracy", bits_ratio(a)}, {"queries", a.total}};
  return j;
}

// Columns: bits, then per model its accuracy and one standard error.
template <class Models>
std::string logit_bits_csv(const Models& models) {
  std::string csv = "bits";
  for (const auto* m : models) csv += "," + m->name + "_accuracy," + m->name + "_standard_error";
  csv += "\n";
  for (std::size_t i = 0; i < std::size(logit_bit_levels); ++i) {
    csv += std::to_string(logit_bit_levels[i]);
    for (const auto* m : models) {
      const auto& a = m->eval.by_logit_bits.at(i);
      for (const double value : {bits_ratio(a), bits_error(a)}) (csv += ',') += std::to_string(value);
    }
    csv += "\n";
  }
  return csv;
}

// Accuracy against bits, 16 on the left as in Figure 8, with ± one standard error.
template <class Models, class Colour>
std::string logit_bits_script(const Models& models, Colour&& colour) {
  std::string plot = "plot ";
  for (std::size_t i = 0; i < models.size(); ++i) {
    const auto c = std::to_string(2 + 2 * i), e = std::to_string(3 + 2 * i);
    plot += std::string(i ? ", " : "") + "'logit_bits.csv' using 0:" + c + ":" + e + ":xtic(1) with yerrorlines lw 2 pt 7 lc rgb '" +
            colour(models[i]->name) + "' title '" + models[i]->short_label + "'";
  }
  return "set datafile separator ','\nset key autotitle columnhead\nset grid\n"
         "set terminal pngcairo size 700,450 font 'sans,10'\nset output 'logit_bits.png'\n"
         "set title 'retrieval accuracy with attention logits quantized (absmax per row; cf. the paper''s Figure 8)'\n"
         "set xlabel 'bits of the attention logits (16: not quantized)'\nset ylabel 'retrieval accuracy'\n"
         "set yrange [0:1.05]\nset xrange [-0.3:3.3]\nset key bottom left\n" +
         plot + "\n";
}

// The lowest bit count whose accuracy is within two standard errors of the
// 16-bit accuracy, going down from 8 (16 if 8 already drops).
inline int holds_down_to(const evaluation& e) {
  const auto& full = e.by_logit_bits.front();
  int lowest = logits_unquantized;
  for (std::size_t i = 1; i < e.by_logit_bits.size(); ++i) {
    const auto& a = e.by_logit_bits[i];
    if (bits_ratio(full) - bits_ratio(a) > 2 * std::hypot(bits_error(full), bits_error(a))) break;
    lowest = a.bits;
  }
  return lowest;
}

// The reading: per model where its accuracy holds; per differential model
// against the Transformer (the last) the paper's two claims.
template <class Models>
std::vector<std::string> logit_bits_reading(const Models& models) {
  std::vector<std::string> lines;
  auto at = [](const evaluation& e, int bits) {
    for (const auto& a : e.by_logit_bits)
      if (a.bits == bits) return a;
    return bits_accuracy{};
  };
  for (const auto* m : models) {
    const int lowest = holds_down_to(m->eval);
    lines.push_back(m->short_label + ": " + fixed(bits_ratio(at(m->eval, 16))) + " at 16 bits, " +
                    fixed(bits_ratio(at(m->eval, 8))) + " at 8, " + fixed(bits_ratio(at(m->eval, 6))) +
                    " at 6, " + fixed(bits_ratio(at(m->eval, 4))) + " at 4; " +
                    (lowest == logits_unquantized ? std::string("it drops by more than two standard errors already at 8 bits")
                                                  : "within two standard errors of 16 bits down to " + std::to_string(lowest) + " bits"));
  }
  const auto& base = models.back()->eval;
  const double base_full = bits_ratio(at(base, 16));
  for (std::size_t i = 0; i + 1 < models.size(); ++i) {
    const auto& e = models[i]->eval;
    const std::string& D = models[i]->short_label;
    const double full = bits_ratio(at(e, 16));
    const double kept = full > 0 ? bits_ratio(at(e, 4)) / full : 0, base_kept = base_full > 0 ? bits_ratio(at(base, 4)) / base_full : 0;
    const std::string kept_text =
        "at 4 bits " + D + " keeps " + fixed(kept) + " of its 16-bit accuracy, the Transformer " + fixed(base_kept);
    if (holds_down_to(e) == 4 && holds_down_to(base) == 4)  // nothing moved: the task cannot tell them apart
      lines.push_back("no verdict on Figure 8's direction (the differential model degrades less): neither model's "
                      "accuracy moves by two standard errors down to 4 bits on this task (" + kept_text + ")");
    else
      lines.push_back(std::string(kept > base_kept ? "agrees" : "does not agree") +
                      " with Figure 8's direction (the differential model degrades less): " + kept_text);
    lines.push_back("4-bit " + D + " " + fixed(bits_ratio(at(e, 4))) + " vs 6-bit Transformer " +
                    fixed(bits_ratio(at(base, 6))) + " (the paper: 4-bit DIFF matches 6-bit Transformer)");
  }
  return lines;
}

}  // namespace detail

}  // namespace difftx::retrieval
