// Google Benchmark: difftx::tokenizer encoding a prompt of 100k characters with
// the fixtures' tokenizer.json files (tests/data/tokenizer), and with any
// other named by DIFFTX_BENCH_TOKENIZER (e.g. a real Llama-3 tokenizer.json).
// Texts: "stress", the fixtures' multi-script stress text repeated (after the
// first run its words are in the word cache); "random", 100k characters drawn
// from a dozen scripts, emoji and punctuation with a space every ~7, new for
// every run (nearly every word goes through BPE). Counters: characters/s, tokens/s.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include <difftx/tokenizer/hf_tokenizer.hpp>

namespace {

const std::filesystem::path data = DIFFTX_TOKENIZER_DATA;
constexpr std::size_t characters = 100000;

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string stress_text() {
  const auto piece = nlohmann::json::parse(read_text(data / "expected.json")).at("texts").at("stress").get<std::string>();
  std::string text;
  for (std::size_t n = 0; n < characters;)
    for (const char c : piece) {
      const bool starts = (static_cast<unsigned char>(c) & 0xC0u) != 0x80u;
      if (starts && n == characters) break;
      text += c;
      n += starts;
    }
  return text;
}

std::string random_text(std::uint64_t seed) {
  static constexpr char32_t blocks[][2] = {{0x61, 0x7A}, {0x41, 0x5A}, {0x30, 0x39}, {0x21, 0x2F}, {0xE0, 0xFF},
                                           {0x3B1, 0x3C9}, {0x430, 0x44F}, {0x5D0, 0x5EA}, {0x627, 0x64A}, {0x915, 0x939},
                                           {0xE01, 0xE2E}, {0x3041, 0x3096}, {0x4E00, 0x9FA5}, {0xAC00, 0xD7A3}, {0x1F600, 0x1F64F}};
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ULL + 1;
  const auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return state >> 33;
  };
  std::string text;
  for (std::size_t n = 0; n < characters; ++n) {
    if (next() % 7 == 0) {
      text += ' ';
      continue;
    }
    const auto& b = blocks[next() % std::size(blocks)];
    difftx::tokenizer::utf8::append(text, b[0] + static_cast<char32_t>(next() % (b[1] - b[0] + 1)));
  }
  return text;
}

void encode(benchmark::State& state, const std::filesystem::path& file, bool random) {
  const difftx::tokenizer::hf_tokenizer tok = difftx::tokenizer::hf_tokenizer::from_file(file);
  std::string text = random ? random_text(0) : stress_text();
  std::size_t tokens = 0, runs = 0;
  for (auto _ : state) {
    if (random && runs > 0) {
      state.PauseTiming();
      text = random_text(runs);
      state.ResumeTiming();
    }
    const auto ids = tok.encode(text);
    tokens += ids.size();
    ++runs;
    benchmark::DoNotOptimize(ids.data());
  }
  state.counters["characters/s"] = benchmark::Counter(static_cast<double>(characters), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::pair<std::string, std::filesystem::path>> files;
  for (const auto* name : {"llama3", "gpt2", "llama2"}) files.emplace_back(name, data / name / "tokenizer.json");
  if (const char* extra = std::getenv("DIFFTX_BENCH_TOKENIZER")) files.emplace_back("file", extra);
  for (const auto& [name, file] : files)
    for (const bool random : {false, true})
      benchmark::RegisterBenchmark(("encode/" + name + (random ? "/random" : "/stress")).c_str(),
                                   [file = file, random](benchmark::State& s) { encode(s, file, random); })
          ->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
