// Google Benchmark: decoding's products against a plain read of the same
// bytes, the bound `difftx bench --model` measures a whole decode step against.
//
// decode_product/<weights>/MB:S: y[1, N] = x[1, 1024] · w[N, 1024]ᵀ (linear_forward
// on policy::simd, one row of x: the streamed products of a decode step) over
// as many matrices of S MB as make 1 GB, each its own product and parallel
// region as a step's are (1 GB: more than a server's last-level cache, 320 MB
// on an Emerald Rapids socket, so that the products read from memory as a
// step's do), against simd_detail::read_through over the same bytes on the
// same threads just before, rows read in the order policy::stream_order
// picks on this CPU. Weights: float32, bfloat16 on vdpbf16ps (where the CPU
// has AVX512_BF16) and converted to float in registers (--bf16-product converting), int8 rows (vpdpbusd or
// the CPU's int8 kernel; x quantized per call, as decoding does), and
// bfloat16 for 8 rows of x on AMX tiles (8 prompts decoded together;
// gemv_amx_bf16.hpp), where the CPU and OS grant them.
// Counters: share_of_read, the read's time over the products' (1 = the
// products stream at a plain read's rate), and both rates in GB/s. Threads:
// OMP_NUM_THREADS. docs/benchmarks.md, "Decoding a checkpoint", has the
// figures beside the decode step's share of its bound.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <difftx/core/random.hpp>
#include <difftx/core/scalar_traits.hpp>
#include <difftx/ops/int8.hpp>
#include <difftx/policy/simd.hpp>
#include <difftx/policy/simd/memory_read.hpp>

namespace {

using difftx::index_t;
using clock_type = std::chrono::steady_clock;

constexpr index_t depth = 1024, total_mb = 1024;

// Normal draws (seeded, times scale) for rows of `depth` values: row r is a window of
// a table twice as long, starting at a place of its own. Drawing every value
// took most of the suite's time; the rates need only normal, varied numbers.
std::vector<float> row_table(std::uint64_t seed, double scale) {
  difftx::random_stream rng(seed);
  std::vector<float> table(static_cast<std::size_t>(2 * depth));
  for (auto& v : table) v = static_cast<float>(scale * rng.normal());
  return table;
}
template <class V>
const V* row_window(const std::vector<V>& table, index_t r) {
  return table.data() + (r * 7919) % depth;
}

// One kind of weights: its matrices, the bytes a product reads, and the products.
struct decoding_weights {
  virtual ~decoding_weights() = default;
  virtual std::vector<std::span<const std::byte>> regions() const = 0;
  virtual void products() = 0;
};

template <class T>
struct stored_rows final : decoding_weights {
  difftx::policy::simd policy;
  std::vector<difftx::Tensor<T, 2>> w;
  difftx::Tensor<T, 2> x, y;
  stored_rows(const difftx::policy::simd& p, index_t rows, index_t count, index_t x_rows = 1)
      : policy(p), x({x_rows, depth}), y({x_rows, rows}) {
    const auto x_values = row_table(7, 1.0), w_values = row_table(8, 0.03);
    std::vector<T> w_table(w_values.size());
    for (std::size_t i = 0; i < w_values.size(); ++i) w_table[i] = difftx::scalar_traits<T>::from_double(w_values[i]);
    for (index_t i = 0; i < x.size(); ++i)
      x.data()[i] = difftx::scalar_traits<T>::from_double(x_values[static_cast<std::size_t>((i + i / depth * 13) % depth)]);
    for (index_t m = 0; m < count; ++m) {
      auto& wm = w.emplace_back(std::array<index_t, 2>{rows, depth});
      for (index_t r = 0; r < rows; ++r) std::copy_n(row_window(w_table, r), depth, wm.data() + r * depth);
    }
  }
  std::vector<std::span<const std::byte>> regions() const override {
    std::vector<std::span<const std::byte>> r;
    for (const auto& m : w) r.push_back(std::as_bytes(std::span(m.data(), static_cast<std::size_t>(m.size()))));
    return r;
  }
  void products() override {
    for (const auto& m : w) difftx::linear_forward(policy, x.const_view(), m.const_view(), y.view());
  }
};

struct int8_weights final : decoding_weights {
  difftx::policy::simd policy;
  std::vector<difftx::int8_rows<float>> w;
  difftx::Tensor<float, 2> x, y;
  int8_weights(const difftx::policy::simd& p, index_t rows, index_t count) : policy(p), x({1, depth}), y({1, rows}) {
    const auto x_values = row_table(7, 1.0), w_values = row_table(8, 0.03);
    std::copy_n(x_values.data(), depth, x.data());
    for (index_t m = 0; m < count; ++m) {
      auto& wm = w.emplace_back(rows, depth);
      for (index_t r = 0; r < rows; ++r) wm.set_row(r, row_window(w_values, r));
    }
  }
  std::vector<std::span<const std::byte>> regions() const override {
    std::vector<std::span<const std::byte>> r;
    for (const auto& m : w)
      for (const auto& part : m.regions()) r.push_back(part);
    return r;
  }
  void products() override {
    for (const auto& m : w) difftx::linear_forward(policy, x.const_view(), m, y.view());
  }
};

enum class weights_kind { float32, bfloat16_vdpbf16ps, bfloat16_converting, int8, bfloat16_amx_8_rows };

std::unique_ptr<decoding_weights> make_weights(weights_kind kind, index_t mb) {
  using difftx::policy::bf16_product;
  // Decoding's products of one row are difftx's own whatever the setting; difftx names it.
  difftx::policy::simd p{.matmuls = difftx::policy::simd::matmul_library::difftx};
  const index_t count = std::max<index_t>(1, total_mb / mb);
  const auto rows_of = [&](index_t bytes_per_value) { return mb * 1000000 / (depth * bytes_per_value); };
  switch (kind) {
    case weights_kind::float32: return std::make_unique<stored_rows<float>>(p, rows_of(4), count);
    case weights_kind::bfloat16_vdpbf16ps:
      p.bf16_products = bf16_product::dot_instructions;
      return std::make_unique<stored_rows<Eigen::bfloat16>>(p, rows_of(2), count);
    case weights_kind::bfloat16_converting:
      p.bf16_products = bf16_product::converting;
      return std::make_unique<stored_rows<Eigen::bfloat16>>(p, rows_of(2), count);
    case weights_kind::int8: return std::make_unique<int8_weights>(p, rows_of(1), count);
    case weights_kind::bfloat16_amx_8_rows: return std::make_unique<stored_rows<Eigen::bfloat16>>(p, rows_of(2), count, 8);
  }
  return nullptr;
}

// The weights of the last benchmark run, kept for its next repetition.
struct kept_weights {
  weights_kind kind{};
  index_t mb = 0;
  std::unique_ptr<decoding_weights> weights;
};

void decode_product(benchmark::State& state, weights_kind kind, index_t mb) {
  static kept_weights kept;
  if (!kept.weights || kept.kind != kind || kept.mb != mb) {
    kept.weights.reset();  // (the last one's memory first)
    kept = {kind, mb, make_weights(kind, mb)};
  }
  decoding_weights* const weights = kept.weights.get();
  const auto regions = weights->regions();
  double bytes = 0;
  for (const auto& r : regions) bytes += static_cast<double>(r.size());
  const int threads = difftx::simd_detail::thread_count(difftx::policy::simd{});
  weights->products();  // warm: x's quantization buffers, the threads
  double read_s = 0, product_s = 0;
  for (auto _ : state) {
    const auto t0 = clock_type::now();
    benchmark::DoNotOptimize(difftx::simd_detail::read_through(threads, regions));
    const auto t1 = clock_type::now();
    weights->products();
    const auto t2 = clock_type::now();
    const double product = std::chrono::duration<double>(t2 - t1).count();
    read_s += std::chrono::duration<double>(t1 - t0).count();
    product_s += product;
    state.SetIterationTime(product);
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["share_of_read"] = read_s / product_s;
  state.counters["product_GBps"] = bytes * n / product_s / 1e9;
  state.counters["read_GBps"] = bytes * n / read_s / 1e9;
}

[[maybe_unused]] const bool registered = [] {
  const std::pair<weights_kind, const char*> kinds[] = {{weights_kind::float32, "float32"},
                                                        {weights_kind::bfloat16_vdpbf16ps, "bfloat16_vdpbf16ps"},
                                                        {weights_kind::bfloat16_converting, "bfloat16_converting"},
                                                        {weights_kind::int8, "int8"},
                                                        {weights_kind::bfloat16_amx_8_rows, "bfloat16_amx_8_rows"}};
  const bool has_dot_instruction =
      difftx::policy::simd{.bf16_products = difftx::policy::bf16_product::dot_instructions}
          .bf16_decoding_product_used() == difftx::policy::bf16_product::dot_instructions;
  for (const auto& [kind, name] : kinds) {
    if (kind == weights_kind::bfloat16_vdpbf16ps && !has_dot_instruction) continue;
    if (kind == weights_kind::bfloat16_amx_8_rows && !difftx::policy::simd{}.amx_tiles_used()) continue;
    for (const index_t mb : {2, 8, 32, 256}) {
      const std::string label = std::string("decode_product/") + name + "/MB:" + std::to_string(mb);
      benchmark::RegisterBenchmark(label.c_str(), [kind, mb](benchmark::State& s) { decode_product(s, kind, mb); })
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  return true;
}();

}  // namespace
