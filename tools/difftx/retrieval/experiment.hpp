// One model of the retrieval demo: build, train, evaluate, measure.
//
// The model is a LanguageModel over DecoderLayer (differential, h heads of 2·D)
// or BaselineLayer (softmax, 2h heads of D): the paper's matched pair, with the
// same parameter count up to the λ vectors and the subln weight; or over
// DecoderLayerV2 (differential attention V2) with the baseline's 2h output heads
// of D and its 2h key/value heads, so 4h query heads: a q_proj twice the
// baseline's, plus lambda_proj. The policy is a template parameter, so a faster
// CPU policy is a one-line change in the caller.
//
// Training: AdamW, linear warm-up then cosine decay, gradient clipping, softmax
// cross-entropy on the answer tokens only. The data stream is a random_stream
// seeded from train_config::seed alone, so two models trained with the same
// seed see the same batches in the same order.
//
// Evaluation (evaluate()): per (N, R) of task_mix and per depth of the queried
// needles, greedy decoding of every answer with the KV cache; on the same
// sequences (teacher-forced, a forward that saves its state), the attention of
// each answer-producing position; and on a batch of training-mix sequences the
// magnitudes of attention logits and hidden states. evaluate_logit_bits()
// decodes the same sequences again with the trained weights in models whose
// attention logits are quantized (the paper's §3.7, Figure 8).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <difftx/difftx.hpp>

#include "retrieval/task.hpp"

namespace difftx::retrieval {

struct model_config {
  index_t d_model = 32;  // C
  index_t heads = 2;     // h differential heads of 2·D (D = C / 2h); the baseline has 2h of D
  index_t layers = 2;
  index_t ffn_dim = 64;  // SwiGLU hidden size F
  int logit_bits = logits_unquantized;  // attention logits quantized to this many bits (evaluation only)
};

// The bit counts of the paper's Figure 8: 16 (not quantized), 8, 6, 4.
inline constexpr int logit_bit_levels[] = {logits_unquantized, 8, 6, 4};

struct train_config {
  index_t steps = 2000;
  index_t batch = 16;
  index_t warmup = 100;
  double lr = 5e-3;
  double final_lr_ratio = 0.1;
  double weight_decay = 0.01;
  double beta1 = 0.9, beta2 = 0.98;  // the paper's betas
  double clip = 1.0;                 // global gradient-norm clip; 0: none
  std::uint64_t seed = 1;
  // Data parallelism: this process trains on sequences [rank·batch/ranks,
  // (rank + 1)·batch/ranks) of every batch (each draws the whole batch, so the
  // stream is the same everywhere); train()'s after_backward averages gradients.
  index_t rank = 0, ranks = 1;
};

struct eval_config {
  index_t per_cell = 32;     // sequences per (N, R, depth)
  index_t stats_batch = 16;  // sequences for the logit and hidden-state magnitudes
};

// The seeds of the data streams, fixed functions of the run's seed.
inline std::uint64_t training_data_seed(std::uint64_t seed) { return seed * 0x9e3779b97f4a7c15ULL + 1; }
inline std::uint64_t eval_data_seed(std::uint64_t seed) { return seed * 0x9e3779b97f4a7c15ULL + 2; }
inline std::uint64_t init_seed(std::uint64_t seed) { return seed * 0x9e3779b97f4a7c15ULL + 3; }

// The three models on the difftx::dynamic head size, D = C / 2h from the
// config (a compiled D runs the same kernels): one instantiation each for
// every D the command takes. The module checks D (positive and even).
inline index_t half_head_dim(const model_config& m) { return m.d_model / (2 * m.heads); }

template <class Policy = policy::reference>
LanguageModel<DecoderLayer<float, dynamic, Policy>> make_diff_model(const model_config& m, index_t vocab,
                                                                    const Policy& policy = {}) {
  std::vector<DecoderLayer<float, dynamic, Policy>> layers;
  for (index_t l = 0; l < m.layers; ++l)
    layers.emplace_back(DecoderLayerConfig{{.d_model = m.d_model, .heads = m.heads, .layer_index = l,
                                            .head_dim = half_head_dim(m), .logit_bits = m.logit_bits},
                                           m.ffn_dim},
                        policy);
  return LanguageModel<DecoderLayer<float, dynamic, Policy>>({vocab, m.d_model}, std::move(layers));
}

template <class Policy = policy::reference>
LanguageModel<BaselineLayer<float, dynamic, Policy>> make_baseline_model(const model_config& m, index_t vocab,
                                                                         const Policy& policy = {}) {
  std::vector<BaselineLayer<float, dynamic, Policy>> layers;
  for (index_t l = 0; l < m.layers; ++l)
    layers.emplace_back(BaselineLayerConfig{{.d_model = m.d_model, .heads = 2 * m.heads, .head_dim = half_head_dim(m),
                                             .logit_bits = m.logit_bits},
                                            m.ffn_dim},
                        policy);
  return LanguageModel<BaselineLayer<float, dynamic, Policy>>({vocab, m.d_model}, std::move(layers));
}

template <class Policy = policy::reference>
LanguageModel<DecoderLayerV2<float, dynamic, Policy>> make_v2_model(const model_config& m, index_t vocab,
                                                                    const Policy& policy = {}) {
  require(m.d_model % (2 * m.heads) == 0, "retrieval", "d_model", "a multiple of 2 x heads = " + std::to_string(2 * m.heads),
          std::to_string(m.d_model));
  std::vector<DecoderLayerV2<float, dynamic, Policy>> layers;
  for (index_t l = 0; l < m.layers; ++l)
    layers.emplace_back(DecoderLayerV2Config{{.d_model = m.d_model, .heads = 2 * m.heads, .kv_heads = 2 * m.heads,
                                              .head_dim = m.d_model / (2 * m.heads), .logit_bits = m.logit_bits},
                                             m.ffn_dim},
                        policy);
  return LanguageModel<DecoderLayerV2<float, dynamic, Policy>>({vocab, m.d_model}, std::move(layers));
}

// ---------------------------------------------------------------- results

struct step_record {
  index_t step = 0;
  double loss = 0, accuracy = 0, lr = 0, grad_norm = 0, seconds = 0;
};

struct cell_result {
  index_t needles = 0, queries = 0;
  index_t correct = 0, total = 0;  // over queries
  index_t correct_by_depth[depth_count] = {}, total_by_depth[depth_count] = {};
};

// Sums of per-(query, head) attention fractions; mean = sum / count.
struct attention_sums {
  double answer = 0, noise = 0;
  index_t count = 0;
  double mean_answer() const { return count ? answer / static_cast<double>(count) : 0.0; }
  double mean_noise() const { return count ? noise / static_cast<double>(count) : 0.0; }
};

// Magnitude statistics: the largest, the 10th largest and the median |value|.
struct magnitudes {
  double top1 = 0, top10 = 0, median = 0;
  index_t count = 0;
};

// The context weights of one answer-producing position, for the figure.
struct attention_profile {
  std::vector<token_t> tokens;
  index_t answer_position = 0, span_begin = 0, span_end = 0;  // the queried needle [begin, end)
  std::vector<double> mean;                                  // [answer_position + 1] normalised weights, mean over layers and heads
  std::vector<std::vector<double>> by_layer;                 // [layers][answer_position + 1], mean over heads
};

// The figure shows the first sequence of this cell: 6 needles, 1 query, at 50% depth.
inline constexpr needles_queries profile_cell{6, 1};
inline constexpr index_t profile_depth = 2;

// Retrieval accuracy with attention logits quantized to `bits`, over the
// evaluation's queries (the same sequences as evaluation::cells).
struct bits_accuracy {
  int bits = logits_unquantized;
  index_t correct = 0, total = 0;
};

struct evaluation {
  std::vector<cell_result> cells;  // in task_mix order
  std::vector<bits_accuracy> by_logit_bits;  // logit_bit_levels' order; empty until evaluate_logit_bits()
  attention_sums attention_by_depth[depth_count];
  std::vector<attention_sums> attention_by_layer;
  attention_sums attention_all;
  magnitudes logits, hidden;
  std::vector<double> lambda;  // per layer (differential models only; V2: the mean of its per-token λ over the
                               // answer-producing positions and heads)
  attention_profile profile;
};

namespace detail {

inline magnitudes summarise(std::vector<double> values) {
  magnitudes m;
  m.count = static_cast<index_t>(values.size());
  if (values.empty()) return m;
  const std::size_t k = std::min<std::size_t>(10, values.size());
  std::partial_sort(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(k), values.end(), std::greater<>());
  m.top1 = values[0];
  m.top10 = values[k - 1];
  const std::size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid), values.end());
  m.median = values[mid];
  if (values.size() % 2 == 0) {
    const double below = *std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid));
    m.median = 0.5 * (m.median + below);
  }
  return m;
}

// Position of the largest logit of row (b, p).
inline token_t argmax(const Tensor<float, 3>& logits, index_t b, index_t p) {
  const index_t V = logits.extent(2);
  const float* row = logits.data() + (b * logits.extent(1) + p) * V;
  return static_cast<token_t>(std::max_element(row, row + V) - row);
}

}  // namespace detail

// The answer and noise fractions of one row of attention weights w over keys
// 0..row, the answer span [begin, end): with S = Σ_t |w_t|,
//   answer = Σ_{t in span} w_t / S,   noise = Σ_{t not in span} |w_t| / S.
// For softmax attention S = 1 and these are the attention mass on the answer
// and on everything else; a differential map's negative weights count as noise
// off the span (they inject −λ·v of those tokens) and against the answer on it.
inline std::pair<double, double> answer_and_noise(const float* w, index_t row, index_t begin, index_t end) {
  double total = 0, answer = 0, noise = 0;
  for (index_t t = 0; t <= row; ++t) {
    total += std::abs(w[t]);
    if (t >= begin && t < end)
      answer += w[t];
    else
      noise += std::abs(w[t]);
  }
  return total > 0 ? std::pair{answer / total, noise / total} : std::pair{0.0, 0.0};
}

// ---------------------------------------------------------------- one model

template <class Layer>
class trainer {
 public:
  using model_type = LanguageModel<Layer>;
  using policy_type = typename Layer::policy_type;
  // Called after every step with the record of that step.
  using step_callback = std::function<void(const step_record&)>;

  trainer(model_type model, const task_config& task, const train_config& train)
      : model_(std::move(model)), task_(task), train_(train) {
    random_stream init(init_seed(train.seed));
    model_.reset_parameters(init);
  }

  model_type& model() noexcept { return model_; }
  const std::vector<step_record>& history() const noexcept { return history_; }
  index_t parameter_count() {
    index_t n = 0;
    for (const auto& p : model_.parameters()) n += p.size();
    return n;
  }

  // after_backward: called between the backward and the clipping (a
  // data-parallel job's gradient average, parallel/data_parallel.hpp).
  void train(const step_callback& on_step = {}, const std::function<void()>& after_backward = {}) {
    require(train_.ranks >= 1 && train_.rank >= 0 && train_.rank < train_.ranks && train_.batch % train_.ranks == 0,
            "retrieval::trainer", "train.batch", "a batch split evenly over " + std::to_string(train_.ranks) + " ranks",
            std::to_string(train_.batch) + " sequences, rank " + std::to_string(train_.rank));
    const index_t share = train_.batch / train_.ranks;
    const AdamWConfig config{{.peak = train_.lr, .warmup_steps = train_.warmup, .total_steps = train_.steps,
                              .decay = lr_decay::cosine, .final_ratio = train_.final_lr_ratio},
                             train_.beta1, train_.beta2, 1e-8, train_.weight_decay};
    const auto parameters = model_.parameters();
    AdamW<float> optimiser(parameters, config);
    random_stream data(training_data_seed(train_.seed));
    CrossEntropyLoss<float, policy_type> loss(model_.policy());
    typename CrossEntropyLoss<float, policy_type>::saved_type loss_saved;
    typename model_type::saved_type saved;
    const auto start = std::chrono::steady_clock::now();
    for (index_t step = 0; step < train_.steps; ++step) {
      std::vector<example> examples;
      for (index_t i = 0; i < train_.batch; ++i) {
        auto e = generate_training(task_, data);
        if (i / share == train_.rank) examples.push_back(std::move(e));
      }
      const batch b = make_batch(std::move(examples));
      logits_.resize(model_.output_shape(b.tokens.shape()));
      dlogits_.resize(logits_.shape());

      step_record record{step + 1};
      record.lr = optimiser.learning_rate();
      model_.forward(b.tokens.view(), logits_.view(), saved);
      record.loss = loss.forward(logits_.view(), b.targets.view(), loss_saved);
      record.accuracy = token_accuracy(b);
      zero_grad(model_);
      loss.backward(logits_.view(), b.targets.view(), loss_saved, dlogits_.view());
      model_.backward(b.tokens.view(), dlogits_.view(), saved);
      if (after_backward) after_backward();
      record.grad_norm = clip_grad_norm(parameters, train_.clip);
      optimiser.step();
      record.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      history_.push_back(record);
      if (on_step) on_step(record);
    }
  }

  evaluation evaluate(const eval_config& config) {
    evaluation result;
    const auto L = static_cast<std::size_t>(model_.layers().size());
    lambda_sum_.clear();
    lambda_count_.clear();
    result.attention_by_layer.resize(L);
    random_stream data(eval_data_seed(train_.seed));
    typename model_type::saved_type saved;
    for_each_eval_batch(config, data, [&](const needles_queries& mix, index_t d, const batch& b, cell_result& cell) {
      // Teacher-forced forward: the attention of every answer-producing position.
      logits_.resize(model_.output_shape(b.tokens.shape()));
      model_.forward(b.tokens.view(), logits_.view(), saved);
      measure_attention(b, saved, result,
                        mix.needles == profile_cell.needles && mix.queries == profile_cell.queries && d == profile_depth);
      decode(model_, b, cell);
    }, result.cells);
    if (!lambda_count_.empty())
      for (std::size_t l = 0; l < L; ++l) result.lambda.push_back(lambda_sum_[l] / static_cast<double>(lambda_count_[l]));
    measure_magnitudes(config, data, result);
    return result;
  }

  // result.by_logit_bits: the trained weights copied into make_model(bits), a
  // model whose attention logits are quantized, decoding evaluate()'s
  // sequences, for each of logit_bit_levels (16 from result.cells: the
  // unquantized model is this one).
  template <class MakeModel>
  void evaluate_logit_bits(const eval_config& config, MakeModel&& make_model, evaluation& result) {
    result.by_logit_bits.clear();
    for (int bits : logit_bit_levels) {
      std::vector<cell_result> cells;
      if (bits == logits_unquantized) {
        cells = result.cells;
      } else {
        model_type quantized = make_model(bits);
        copy_parameters(model_, quantized);
        random_stream data(eval_data_seed(train_.seed));
        for_each_eval_batch(config, data, [&](const needles_queries&, index_t, const batch& b, cell_result& cell) {
          decode(quantized, b, cell);
        }, cells);
      }
      bits_accuracy a{bits};
      for (const auto& c : cells) {
        a.correct += c.correct;
        a.total += c.total;
      }
      result.by_logit_bits.push_back(a);
    }
  }

 private:
  // Teacher-forced accuracy over the scored tokens of a batch.
  double token_accuracy(const batch& b) const {
    index_t correct = 0, total = 0;
    const index_t B = b.tokens.extent(0), N = b.tokens.extent(1);
    for (index_t i = 0; i < B; ++i)
      for (index_t p = 0; p < N; ++p) {
        const token_t target = b.targets(i, p);
        if (target < 0) continue;
        ++total;
        correct += detail::argmax(logits_, i, p) == target ? 1 : 0;
      }
    return total ? static_cast<double>(correct) / static_cast<double>(total) : 0.0;
  }

  // The evaluation's batches, drawn from data: per (N, R) of task_mix and per
  // depth, visit(mix, depth, batch, cell) adds to that (N, R)'s cell.
  template <class Visit>
  void for_each_eval_batch(const eval_config& config, random_stream& data, Visit&& visit, std::vector<cell_result>& cells) {
    for (const auto& mix : task_mix) {
      cell_result cell{mix.needles, mix.queries};
      for (index_t d = 0; d < depth_count; ++d) {
        // The first queried needle at depth d, a second one two depths on.
        const index_t placed[2] = {d, (d + 2) % depth_count};
        std::vector<example> examples;
        for (index_t i = 0; i < config.per_cell; ++i)
          examples.push_back(generate(task_, data, mix.needles, mix.queries, std::span(placed, static_cast<std::size_t>(mix.queries))));
        visit(mix, d, make_batch(std::move(examples)), cell);
      }
      cells.push_back(cell);
    }
  }

  // Greedy decoding of every answer token with the KV cache, each read from a
  // context holding the model's own earlier answers: a prefill up to the first
  // answer-producing position, then one decode step per position, feeding the
  // predicted token at an answer position and the sequence's own token
  // elsewhere (the next QUERY and key). The batch steps through positions in
  // lockstep (its sequences have one length); a position produces an answer in
  // the sequences that have one there.
  void decode(const model_type& model, const batch& b, cell_result& cell) {
    const index_t B = b.tokens.extent(0), N = b.tokens.extent(1), Lv = task_.value_length;
    const index_t V = model.config().vocab_size;
    // answers[i][p]: the logits at position p of sequence i give an answer token (the token at p + 1).
    std::vector<std::vector<bool>> answers(static_cast<std::size_t>(B), std::vector<bool>(static_cast<std::size_t>(N)));
    index_t first = N, last = 0;
    for (index_t i = 0; i < B; ++i)
      for (const auto& q : b.examples[static_cast<std::size_t>(i)].queries)
        for (index_t p = q.answer_position; p < q.answer_position + Lv; ++p) {
          answers[static_cast<std::size_t>(i)][static_cast<std::size_t>(p)] = true;
          first = std::min(first, p);
          last = std::max(last, p);
        }

    auto cache = model.make_cache(B, last + 1);
    Tensor<token_t, 2> prompt({B, first + 1}), step({B, 1});
    for (index_t i = 0; i < B; ++i) std::copy_n(b.tokens.data() + i * N, first + 1, prompt.data() + i * (first + 1));
    Tensor<float, 3> logits({B, first + 1, V});
    model.prefill(prompt.const_view(), cache, logits.view());
    std::vector<std::vector<token_t>> predicted(static_cast<std::size_t>(B));
    for (index_t p = first;; ++p) {
      const index_t row = logits.extent(1) - 1;  // position p's logits: the prefill's last, or the step's
      for (index_t i = 0; i < B; ++i) {  // the token at p + 1, fed to the next step
        token_t next = b.tokens(i, p + 1);
        if (answers[static_cast<std::size_t>(i)][static_cast<std::size_t>(p)]) {
          next = detail::argmax(logits, i, row);
          predicted[static_cast<std::size_t>(i)].push_back(next);
        }
        step(i, 0) = next;
      }
      if (p == last) break;
      logits.resize({B, 1, V});
      model.decode(step.const_view(), cache, logits.view());
    }

    for (index_t i = 0; i < B; ++i) {
      const auto& ex = b.examples[static_cast<std::size_t>(i)];
      for (std::size_t r = 0; r < ex.queries.size(); ++r) {
        const auto& q = ex.queries[r];
        const auto& value = ex.needles[static_cast<std::size_t>(q.needle)].value;
        const bool ok = std::equal(value.begin(), value.end(), predicted[static_cast<std::size_t>(i)].begin() + static_cast<std::ptrdiff_t>(r) * Lv);
        cell.correct += ok;
        ++cell.total;
        cell.correct_by_depth[q.depth] += ok;
        ++cell.total_by_depth[q.depth];
      }
    }
  }

  void measure_attention(const batch& b, const typename model_type::saved_type& saved, evaluation& result,
                         bool keep_profile) {
    const index_t B = b.tokens.extent(0), N = b.tokens.extent(1);
    const std::size_t L = model_.layers().size();
    for (index_t i = 0; i < B; ++i) {
      const auto& ex = b.examples[static_cast<std::size_t>(i)];
      std::vector<index_t> rows;
      for (const auto& q : ex.queries) rows.push_back(q.answer_position);
      const bool profile = keep_profile && i == 0;
      if (profile) {
        const auto& q = ex.queries.front();
        const auto& n = ex.needles[static_cast<std::size_t>(q.needle)];
        auto& pr = result.profile;
        pr.tokens = ex.tokens;
        pr.answer_position = q.answer_position;
        pr.span_begin = n.start;
        pr.span_end = n.start + n.length();
        pr.mean.assign(static_cast<std::size_t>(q.answer_position + 1), 0.0);
        pr.by_layer.assign(L, pr.mean);
      }
      for (std::size_t l = 0; l < L; ++l) {
        const auto maps = attention_maps(model_.layers()[l].attention(), saved.stack.layers[l].attn, i, rows);
        if constexpr (per_token_lambda) {  // V2: every row's and head's own λ, averaged at the end
          if (maps.maps == 2) {
            lambda_sum_.resize(L);
            lambda_count_.resize(L);
            for (index_t e = 0; e < maps.lambdas.size(); ++e) lambda_sum_[l] += static_cast<double>(maps.lambdas.data()[e]);
            lambda_count_[l] += maps.lambdas.size();
          }
        } else if (result.lambda.size() < L && maps.maps == 2) {
          result.lambda.push_back(maps.lambda);  // one λ per layer
        }
        const index_t H = maps.weights.extent(1);
        for (std::size_t r = 0; r < rows.size(); ++r) {
          const auto& q = ex.queries[r];
          const auto& n = ex.needles[static_cast<std::size_t>(q.needle)];
          for (index_t h = 0; h < H; ++h) {
            const float* w = maps.weights.data() + (static_cast<index_t>(r) * H + h) * N;
            const auto [answer, noise] = answer_and_noise(w, q.answer_position, n.start, n.start + n.length());
            for (auto* sums : {&result.attention_by_depth[q.depth], &result.attention_by_layer[l], &result.attention_all}) {
              sums->answer += answer;
              sums->noise += noise;
              ++sums->count;
            }
            if (profile && r == 0) {
              double total = 0;
              for (index_t t = 0; t <= q.answer_position; ++t) total += std::abs(w[t]);
              for (index_t t = 0; t <= q.answer_position && total > 0; ++t) {
                const double v = w[t] / total / static_cast<double>(H);
                result.profile.by_layer[l][static_cast<std::size_t>(t)] += v;
                result.profile.mean[static_cast<std::size_t>(t)] += v / static_cast<double>(L);
              }
            }
          }
        }
      }
    }
  }

  // Every attention logit (both maps of every head, every causal query-key
  // pair, every layer) and every layer output, over a batch of training-mix sequences.
  void measure_magnitudes(const eval_config& config, random_stream& data, evaluation& result) {
    std::vector<example> examples;
    for (index_t i = 0; i < config.stats_batch; ++i) examples.push_back(generate_training(task_, data));
    const batch b = make_batch(std::move(examples));
    typename model_type::saved_type saved;
    logits_.resize(model_.output_shape(b.tokens.shape()));
    model_.forward(b.tokens.view(), logits_.view(), saved);
    const index_t B = b.tokens.extent(0), N = b.tokens.extent(1);
    std::vector<index_t> all_rows(static_cast<std::size_t>(N));
    for (index_t p = 0; p < N; ++p) all_rows[static_cast<std::size_t>(p)] = p;
    std::vector<double> logit_values, hidden_values;
    for (std::size_t l = 0; l < model_.layers().size(); ++l) {
      for (index_t i = 0; i < B; ++i) {
        const auto maps = attention_maps(model_.layers()[l].attention(), saved.stack.layers[l].attn, i, all_rows);
        for (index_t r = 0; r < N; ++r)
          for (index_t h = 0; h < maps.scores.extent(1); ++h)
            for (index_t m = 0; m < maps.maps; ++m)
              for (index_t t = 0; t < maps.key_end(r); ++t) logit_values.push_back(std::abs(maps.scores(r, h, m, t)));
      }
      const auto& out = model_.layer_output(saved, l);
      for (index_t e = 0; e < out.size(); ++e) hidden_values.push_back(std::abs(out.data()[e]));
    }
    result.logits = detail::summarise(std::move(logit_values));
    result.hidden = detail::summarise(std::move(hidden_values));
  }

  // V2's λ is per token and head (its config has the `differential` switch).
  static constexpr bool per_token_lambda = requires(const Layer& layer) { layer.attention().config().differential; };

  model_type model_;
  task_config task_;
  train_config train_;
  std::vector<step_record> history_;
  Tensor<float, 3> logits_, dlogits_;
  std::vector<double> lambda_sum_;     // V2: per layer, over the measured rows and heads
  std::vector<index_t> lambda_count_;
};

}  // namespace difftx::retrieval
