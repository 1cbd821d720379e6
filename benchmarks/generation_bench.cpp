// Google Benchmark: the sampler chain on a row of a Llama-3-sized vocabulary,
// and generation for several prompts at once against one at a time.
//
// sampler/<chain>/<logits>/V:128256: token_sampler::next on one row of
// bfloat16 logits, the history a prompt of 512 tokens and the tokens chosen
// since. Chains: greedy; greedy with a repetition penalty; temperature alone
// (a draw over the whole vocabulary); Llama-3's folders' defaults
// (temperature 0.6, top-k 50, top-p 0.9); top-p 0.9 alone; min-p 0.05 alone;
// everything (the three penalties, temperature, top-k, top-p, min-p).
// Logits: "peaked", N(0, 2.5²) with a head of 1000 tokens raised by 14/√rank
// (a trained model's shape: a few likely tokens, a long flat tail); "flat",
// N(0, 3²) (a random model's: top-p keeps thousands).
//
// generate/<dtype>/prompts:P/prompt:N/new:K[/no-amx], where DIFFTX_BENCH_MODEL names a
// DiffLlama folder: P prompts of N random tokens, K greedy new tokens each (no
// stop token), with decoding panels as `difftx generate` loads them; each run
// batched, then one at a time. batched: generate(model, prompts, options), one
// packed prefill and decode steps of P tokens; one_at_a_time: generate(model,
// prompt, options) for each. Counters, for each: <way>_prefill_ms (until the
// last prompt's first token), <way>_decode_tokens_per_s (the tokens after each
// prompt's first over the time after the prefill), <way>_tokens_per_s (every
// new token over the whole time); decode_ratio, batched over one at a time. DIFFTX_BENCH_PROMPTS, DIFFTX_BENCH_PROMPT_TOKENS, DIFFTX_BENCH_NEW_TOKENS
// change P, N, K (default 8, 512, 64); DIFFTX_BENCH_DTYPE float32 or bfloat16
// (default bfloat16); DIFFTX_BENCH_AMX=0 turns AMX tiles off
// (policy::simd::amx_tiles, on by default: batched bfloat16 products on
// tdpbf16ps where the CPU has them). Threads: OMP_NUM_THREADS.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <difftx/generation/generate.hpp>
#include <difftx/io/diffllama.hpp>
#include <difftx/policy/simd.hpp>

namespace {

using difftx::index_t;
using difftx::token_t;
using bf16 = Eigen::bfloat16;

constexpr index_t vocabulary = 128256;

std::vector<bf16> logits_row(bool peaked) {
  difftx::random_stream rng(peaked ? 1 : 2);
  std::vector<double> x(static_cast<std::size_t>(vocabulary));
  for (auto& v : x) v = (peaked ? 2.5 : 3.0) * rng.normal();
  if (peaked)
    for (index_t rank = 1; rank <= 1000; ++rank) x[static_cast<std::size_t>((rank * 7919) % vocabulary)] += 14 / std::sqrt(double(rank));
  std::vector<bf16> row;
  for (const double v : x) row.push_back(difftx::scalar_traits<bf16>::from_double(v));
  return row;
}

void sample(benchmark::State& state, const difftx::sampling_options& o, bool peaked) {
  const auto row = logits_row(peaked);
  difftx::random_stream rng(3);
  std::vector<token_t> prompt(512);
  for (auto& t : prompt) t = static_cast<token_t>(rng.uniform() * vocabulary);
  difftx::token_sampler sampler(o);
  sampler.start(prompt);
  for (auto _ : state) benchmark::DoNotOptimize(sampler.next(std::span<const bf16>(row)));
}

index_t from_environment(const char* name, index_t otherwise) {
  const char* v = std::getenv(name);
  return v ? std::stol(v) : otherwise;
}

// Seconds of one generation: until every prompt has its first token (the prefill), and in all.
struct phases {
  double prefill = 0, total = 0;
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

template <class Model>
phases batched(const Model& model, const std::vector<std::vector<token_t>>& prompts, const difftx::generation_options& o) {
  phases p;
  const auto start = std::chrono::steady_clock::now();
  std::size_t first_tokens = 0;
  const auto out = difftx::generate(model, std::span(prompts), o, [&](std::size_t, token_t) {
    if (++first_tokens == prompts.size()) p.prefill = seconds_since(start);
  });
  benchmark::DoNotOptimize(out.data());
  p.total = seconds_since(start);
  return p;
}

template <class Model>
phases one_at_a_time(const Model& model, const std::vector<std::vector<token_t>>& prompts,
                     const difftx::generation_options& o) {
  phases p;
  const auto start = std::chrono::steady_clock::now();
  for (const auto& prompt : prompts) {
    const auto one = std::chrono::steady_clock::now();
    bool first = true;
    const auto out = difftx::generate(model, prompt, o, [&](token_t) {
      if (first) p.prefill += seconds_since(one);
      first = false;
    });
    benchmark::DoNotOptimize(out.data());
  }
  p.total = seconds_since(start);
  return p;
}

// Each run generates the prompts batched, then one at a time, so that the
// two are measured side by side (a busy machine slows both alike).
template <class T>
void generate(benchmark::State& state, const std::string& folder) {
  const index_t P = from_environment("DIFFTX_BENCH_PROMPTS", 8), N = from_environment("DIFFTX_BENCH_PROMPT_TOKENS", 512),
                K = from_environment("DIFFTX_BENCH_NEW_TOKENS", 64);
  // Loaded once for every repetition.
  static auto model = [&] {
    difftx::policy::simd policy;
    policy.amx_tiles = from_environment("DIFFTX_BENCH_AMX", 1) != 0;
    auto m = difftx::io::load_diffllama<T>(folder, policy);
    m.add_decoding_panels();
    return m;
  }();
  difftx::random_stream rng(4);
  std::vector<std::vector<token_t>> prompts(static_cast<std::size_t>(P));
  for (auto& p : prompts)
    for (index_t i = 0; i < N; ++i) p.push_back(3 + static_cast<token_t>(rng.uniform() * double(model.config().vocab_size - 3)));
  const difftx::generation_options o{.max_new_tokens = K};
  phases together, alone;
  for (auto _ : state) {
    const auto b = batched(model, prompts, o), a = one_at_a_time(model, prompts, o);
    state.SetIterationTime(b.total + a.total);
    together = {together.prefill + b.prefill, together.total + b.total};
    alone = {alone.prefill + a.prefill, alone.total + a.total};
  }
  const auto runs = static_cast<double>(state.iterations());
  const auto decode_tokens_per_s = [&](const phases& p) { return double(P * (K - 1)) / ((p.total - p.prefill) / runs); };
  for (const auto& [name, p] : {std::pair{"batched", together}, std::pair{"one_at_a_time", alone}}) {
    state.counters[std::string(name) + "_prefill_ms"] = p.prefill / runs * 1e3;
    state.counters[std::string(name) + "_decode_tokens_per_s"] = decode_tokens_per_s(p);
    state.counters[std::string(name) + "_tokens_per_s"] = double(P * K) / (p.total / runs);
  }
  state.counters["decode_ratio"] = decode_tokens_per_s(together) / decode_tokens_per_s(alone);
  state.counters["prompts"] = double(P);
}

}  // namespace

int main(int argc, char** argv) {
  struct chain {
    const char* name;
    difftx::sampling_options options;
  };
  const chain chains[] = {
      {"greedy", {}},
      {"greedy_repetition", {.repetition_penalty = 1.1}},
      {"temperature", {.temperature = 0.7}},
      {"llama3_defaults", {.temperature = 0.6, .top_k = 50, .top_p = 0.9}},
      {"top_p", {.temperature = 1.0, .top_p = 0.9}},
      {"min_p", {.temperature = 1.0, .min_p = 0.05}},
      {"everything",
       {.temperature = 0.8, .top_k = 40, .top_p = 0.95, .min_p = 0.05, .repetition_penalty = 1.1,
        .presence_penalty = 0.5, .frequency_penalty = 0.5}}};
  for (const auto& c : chains)
    for (const bool peaked : {true, false})
      benchmark::RegisterBenchmark(
          ("sampler/" + std::string(c.name) + (peaked ? "/peaked" : "/flat") + "/V:" + std::to_string(vocabulary)).c_str(),
          [o = c.options, peaked](benchmark::State& s) { sample(s, o, peaked); })
          ->Unit(benchmark::kMicrosecond);
  if (const char* folder = std::getenv("DIFFTX_BENCH_MODEL")) {
    const std::string dtype = std::getenv("DIFFTX_BENCH_DTYPE") ? std::getenv("DIFFTX_BENCH_DTYPE") : "bfloat16";
    const std::string shape = "/prompts:" + std::to_string(from_environment("DIFFTX_BENCH_PROMPTS", 8)) +
                              "/prompt:" + std::to_string(from_environment("DIFFTX_BENCH_PROMPT_TOKENS", 512)) +
                              "/new:" + std::to_string(from_environment("DIFFTX_BENCH_NEW_TOKENS", 64)) +
                              (from_environment("DIFFTX_BENCH_AMX", 1) != 0 ? "" : "/no-amx");
    using run_fn = void (*)(benchmark::State&, const std::string&);
    const run_fn run = dtype == "float32" ? &generate<float> : dtype == "bfloat16" ? &generate<bf16> : nullptr;
    if (!run) {
      std::fprintf(stderr, "generation_bench: DIFFTX_BENCH_DTYPE must be float32 or bfloat16, not '%s'\n", dtype.c_str());
      return 2;
    }
    benchmark::RegisterBenchmark(("generate/" + dtype + shape).c_str(),
                                 [run, f = std::string(folder)](benchmark::State& s) { run(s, f); })
        ->UseManualTime()
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
