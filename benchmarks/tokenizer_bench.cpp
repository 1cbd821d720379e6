// Google Benchmark: difftx::tokenizer encoding a prompt of about 100k
// characters (the multi-script stress text of tests/data/tokenizer/expected.json,
// repeated) with the fixtures' tokenizer.json files. "cold": a tokenizer fresh
// for each run, so every word goes through BPE; "warm": one tokenizer, its word
// cache filled by the runs before. Counters: characters/s and tokens/s.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include <difftx/tokenizer/hf_tokenizer.hpp>

namespace {

const std::filesystem::path data = DIFFTX_TOKENIZER_DATA;

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// About 100k characters (code points) of text_name, repeated.
const std::string& prompt(const std::string& text_name) {
  static std::map<std::string, std::string> made;
  auto& text = made[text_name];
  if (text.empty()) {
    const auto piece = nlohmann::json::parse(read_text(data / "expected.json")).at("texts").at(text_name).get<std::string>();
    std::size_t characters = 0;
    while (characters < 100000)
      for (const char c : piece) {
        text += c;
        characters += (static_cast<unsigned char>(c) & 0xC0u) != 0x80u;
      }
  }
  return text;
}

void encode(benchmark::State& state, const std::string& name, const std::string& text_name, bool warm) {
  const auto json = read_text(data / name / "tokenizer.json");
  const auto& text = prompt(text_name);
  auto tok = std::make_unique<difftx::tokenizer::hf_tokenizer>(json);
  std::size_t tokens = 0;
  for (auto _ : state) {
    if (!warm) {
      state.PauseTiming();
      tok = std::make_unique<difftx::tokenizer::hf_tokenizer>(json);
      state.ResumeTiming();
    }
    const auto ids = tok->encode(text);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  std::size_t characters = 0;
  for (const char c : text) characters += (static_cast<unsigned char>(c) & 0xC0u) != 0x80u;
  state.counters["characters/s"] = benchmark::Counter(static_cast<double>(characters), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens"] = static_cast<double>(tokens);
}

}  // namespace

// llama3: Split(Llama-3's pattern) + ByteLevel; gpt2: ByteLevel with GPT-2's pattern;
// llama2: Metaspace without split, so each stretch between added tokens is one BPE word.
BENCHMARK_CAPTURE(encode, llama3/stress/cold, "llama3", "stress", false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(encode, llama3/stress/warm, "llama3", "stress", true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(encode, gpt2/stress/cold, "gpt2", "stress", false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(encode, llama2/stress/cold, "llama2", "stress", false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(encode, llama2/corpus/cold, "llama2", "corpus", false)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
