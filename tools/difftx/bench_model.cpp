// difftx bench --model: a real language model's prefill and decode speed, on
// each policy given: a prompt of --seq random token ids in one prefill, then
// --new-tokens greedy decode steps with the KV cache, as `difftx generate`
// runs them. Medians over --repeats runs after a warm-up run.
//
// The bound beside it: after each decode step the same threads (on the GPU,
// the same device) read every byte that step had to read, the weights and the
// cache's stored keys and values (simd_detail::read_through, or
// cuda_detail::region_reader), so each step's time is paired with the
// machine's read time for its bytes in the same moment; the median of those
// ratios is decoding's share of the bandwidth bound, steady where the shared
// machine's bandwidth drifts between runs. The share of the weights' bound
// alone (the weights' part of that read time over the step's) is given too.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <nlohmann/json.hpp>

#include <difftx/core/random.hpp>
#include <difftx/policy/simd/memory_read.hpp>

#include "commands.hpp"
#include "flops.hpp"
#include "language_model_runner.hpp"
#include "model_source.hpp"
#include "runner.hpp"  // policy_description
#if defined(DIFFTX_CLI_CUDA)
#include "cuda_policy.hpp"
#endif

namespace difftx::cli {

namespace {

struct model_timing {
  std::string policy, description;
  kernel_report kernels;
  int threads = 1;
  double prefill_ms = 0, decode_ms_per_token = 0;
  // The bound (none with int8 weights): the weights' bytes read per step and
  // the median over steps of the cache's, the median read time of both, and
  // the medians of read time over step time (of all bytes, of the weights').
  double weight_bytes = 0, cache_bytes = 0, read_ms = 0, bound_share = 0, weights_bound_share = 0;
};

// A figure of the bound, null where none was measured.
nlohmann::json bound_value(const model_timing& row, double value) {
  return row.read_ms > 0 ? nlohmann::json(value) : nlohmann::json();
}

// Milliseconds that policy's threads (or device) take to read the regions once.
double read_ms([[maybe_unused]] const std::string& policy, int threads, std::span<const std::span<const std::byte>> regions) {
#if defined(DIFFTX_CLI_CUDA)
  if (policy == cuda_policy::name) return cuda_policy::read_ms(regions);
#endif
  const auto start = std::chrono::steady_clock::now();
  static_cast<void>(simd_detail::read_through(threads, regions));
  return ms_since(start);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return (v[(v.size() - 1) / 2] + v[v.size() / 2]) / 2;
}

}  // namespace

void bench_model(const model_bench_options& o) {
  for (const auto& policy : o.policies) checked_dtype(o.dtype, policy);
  const auto type = *io::parse_dtype_name(o.dtype);
  const model_source source(o.model, o.flags);
  auto spec = source.spec();
  spec.weights = storage_of(o.weights_dtype);
  spec.kv_cache = storage_of(o.kv_dtype);
  spec.decodes = true;
  random_stream rng(1);
  std::vector<token_t> prompt(static_cast<std::size_t>(o.prompt_tokens));
  for (auto& t : prompt)
    t = static_cast<token_t>(std::min<double>(rng.uniform() * double(spec.model.vocab_size), double(spec.model.vocab_size - 1)));

  // Every layer over the prompt, and the head at its last token only (the prefill generate runs).
  double prefill_flops = difftx_bench::linear_forward(1, double(spec.model.vocab_size), double(spec.model.d_model));
  for (const auto& layer : spec.layers) {  // each a decoder_layer of the kinds' table
    const module_spec as_kind{.kind = &module_kind_named("decoder_layer"), .attention = attention_heads(layer.attention),
                              .ffn_dim = layer.ffn_dim};
    prefill_flops += count_flops(as_kind, 1, o.prompt_tokens).forward;
  }

  std::vector<model_timing> rows;
  for (const auto& policy : o.policies) {
    const auto model = make_language_model_runner(spec, policy, type, o.computing);
    source.load_into(*model);
    const auto kernels = model->kernels();
    model_timing row{policy, policy_description(policy, kernels.detail()), kernels, model->threads()};
    const auto weights = model->weights_read_per_token();
    for (const auto& w : weights) row.weight_bytes += static_cast<double>(w.size());
    std::vector<double> prefill, decode, cache_bytes, reads, shares, weight_shares;
    for (int r = 0; r <= o.repeats; ++r) {  // run 0: the warm-up
      auto start = std::chrono::steady_clock::now();
      token_t next = model->prefill(prompt, o.prompt_tokens + o.new_tokens);
      const double prefill_ms = ms_since(start);
      double decode_ms = 0;
      for (index_t step = 0; step < o.new_tokens; ++step) {
        start = std::chrono::steady_clock::now();
        next = model->decode(next);
        const double step_ms = ms_since(start);
        decode_ms += step_ms;
        if (weights.empty() || r == 0) continue;
        auto step_read = weights;
        double step_cache_bytes = 0;
        for (const auto& region : model->cache_read_per_token()) {
          step_read.push_back(region);
          step_cache_bytes += static_cast<double>(region.size());
        }
        reads.push_back(read_ms(policy, model->threads(), step_read));
        cache_bytes.push_back(step_cache_bytes);
        shares.push_back(reads.back() / step_ms);
        weight_shares.push_back(shares.back() * row.weight_bytes / (row.weight_bytes + step_cache_bytes));
      }
      if (r == 0) continue;
      prefill.push_back(prefill_ms);
      decode.push_back(decode_ms / static_cast<double>(o.new_tokens));
    }
    row.prefill_ms = median(prefill);
    row.decode_ms_per_token = median(decode);
    if (!reads.empty()) {
      row.cache_bytes = median(cache_bytes);
      row.read_ms = median(reads);
      row.bound_share = median(shares);
      row.weights_bound_share = median(weight_shares);
    }
    rows.push_back(row);
  }

  const auto& a = spec.first().attention;
  if (o.json) {
    for (const auto& row : rows) {
      nlohmann::json j{{"model", o.model}, {"model_kind", source.kind()},
                       {"layers", spec.layers.size()}, {"vocab_size", spec.model.vocab_size},
                       {"d_model", a.d_model}, {"heads", a.heads}, {"kv_heads", a.kv_heads},
                       {"head_dim", a.head_dim}, {"ffn_dim", spec.first().ffn_dim},
                       {"policy", row.policy}, {"policy_detail", row.description},
                       {"dtype", o.dtype}, {"weights_dtype", o.weights_dtype},
                       {"kv_dtype", o.kv_dtype}, {"packed_weights", o.computing.packed_weights},
                       {"threads", row.threads}, {"repeats", o.repeats},
                       {"prompt_tokens", o.prompt_tokens}, {"new_tokens", o.new_tokens},
                       {"prefill_ms", row.prefill_ms}, {"prefill_flops", prefill_flops},
                       {"prefill_GFLOPs", prefill_flops / row.prefill_ms / 1e6},
                       {"prefill_tokens_per_s", double(o.prompt_tokens) / row.prefill_ms * 1e3},
                       {"decode_ms_per_token", row.decode_ms_per_token},
                       {"decode_tokens_per_s", 1e3 / row.decode_ms_per_token},
                       {"weights_read_per_token_bytes", bound_value(row, row.weight_bytes)},
                       {"cache_read_per_token_bytes", bound_value(row, row.cache_bytes)},
                       {"bound_read_ms", bound_value(row, row.read_ms)},
                       {"read_GBps", bound_value(row, (row.weight_bytes + row.cache_bytes) / row.read_ms / 1e6)},
                       {"decode_share_of_bound", bound_value(row, row.bound_share)},
                       {"decode_share_of_weights_bound", bound_value(row, row.weights_bound_share)}};
      add_kernel_fields(j, row.kernels);
      std::printf("%s\n", j.dump().c_str());
    }
    return;
  }
  std::printf("difftx bench --model: %s (%s), %zu layers, V = %td, C = %td, h = %td, g = %td, D = %td, F = %td, %s "
              "(weights %s%s, KV cache %s); prompt of %td tokens, then %td decode steps; median of %d runs after a warm-up\n",
              o.model.c_str(), source.kind().c_str(), spec.layers.size(), spec.model.vocab_size, a.d_model, a.heads,
              a.kv_heads, a.head_dim, spec.first().ffn_dim, o.dtype.c_str(), o.weights_dtype.c_str(),
              o.computing.packed_weights ? ", the layers' packed for oneDNN" : "", o.kv_dtype.c_str(),
              o.prompt_tokens, o.new_tokens, o.repeats);
  std::printf("%-34s %7s %12s %16s %15s %15s %16s %10s %9s %10s\n", "policy", "threads", "prefill ms",
              "prefill tokens/s", "prefill GFLOP/s", "decode ms/token", "decode tokens/s", "read GB/s", "of bound",
              "of weights");
  for (const auto& row : rows) {
    std::printf("%-34s %7d %12.3f %16.1f %15.1f %15.3f %16.2f", row.description.c_str(), row.threads, row.prefill_ms,
                double(o.prompt_tokens) / row.prefill_ms * 1e3, prefill_flops / row.prefill_ms / 1e6,
                row.decode_ms_per_token, 1e3 / row.decode_ms_per_token);
    if (row.read_ms > 0)
      std::printf(" %10.1f %8.1f%% %9.1f%%\n", (row.weight_bytes + row.cache_bytes) / row.read_ms / 1e6,
                  100 * row.bound_share, 100 * row.weights_bound_share);
    else
      std::printf(" %10s %9s %10s\n", "-", "-", "-");
  }
  std::printf("prefill GFLOP/s: %.2f GFLOP, every layer over the prompt and the head at its last token only\n",
              prefill_flops / 1e9);
  std::printf("read GB/s: the bytes a decode step reads (the weights, %.0f MB, and the cache's keys and values, a "
              "median %.1f MB), read again by its threads (on cuda, by a kernel) after each step; of bound: the median of that read's time "
              "over the step's; of weights: of the weights' part of it\n",
              rows.empty() ? 0.0 : rows.front().weight_bytes / 1e6, rows.empty() ? 0.0 : rows.front().cache_bytes / 1e6);
}

}  // namespace difftx::cli
