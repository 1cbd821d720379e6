// The machine's read rate as decoding meets it: decoding reads every weight
// once per token, so the bytes it reads over the rate at which this machine
// reads them is its bound (docs/benchmarks.md). `difftx bench --model` reads a
// model's own weights with this between decode steps; the benchmarks'
// read_bandwidth reads a 1 GiB tensor.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "difftx/policy/simd/common.hpp"
#include "difftx/policy/simd/stream_prefetch.hpp"

namespace difftx::simd_detail {

// Every byte of the regions read once, in one parallel region of `threads`
// threads: each thread reads its share of each region (cut at 64-byte
// lines) as one sequential stream, summing 32-bit words in the widest
// integer vectors, each line asked for as far ahead as the products ask for
// theirs (stream_prefetch.hpp), so that the bound is the
// best rate their way of reading reaches. On Zen 4 with huge pages one stream
// per core read 2-9% faster than eight rows side by side. The sum is returned
// so that no read is optimised away.
inline std::uint32_t read_through(int threads, std::span<const std::span<const std::byte>> regions) {
  using word = std::uint32_t;
  using V = xsimd::batch<word>;
  constexpr std::size_t W = V::size, lanes = 8, line = 64;
  std::uint32_t total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
#if defined(_OPENMP)
    const auto t = static_cast<std::size_t>(omp_get_thread_num()), parts = static_cast<std::size_t>(omp_get_num_threads());
#else
    const std::size_t t = 0, parts = 1;
#endif
    const stream_distance ahead = stream_ahead(line);
    std::array<V, lanes> sums;
    sums.fill(V(word{0}));
    for (const auto& region : regions) {
      const std::size_t lines = region.size() / line;
      const std::size_t begin = lines * t / parts * line, end = t + 1 == parts ? region.size() : lines * (t + 1) / parts * line;
      const std::byte* bytes = region.data();
      std::size_t i = begin;
      for (; i + lanes * W * sizeof(word) <= end; i += lanes * W * sizeof(word))
        DIFFTX_UNROLL(8)
        for (std::size_t l = 0; l < lanes; ++l) {
          if (l * W * sizeof(word) % line == 0) prefetch_ahead(bytes + i + l * W * sizeof(word), ahead);
          sums[l] += V::load_unaligned(reinterpret_cast<const word*>(bytes + i) + l * W);
        }
      for (; i < end; ++i) total += static_cast<word>(bytes[i]);
    }
    for (const auto& s : sums) total += xsimd::hadd(s);
  }
  return total;
}

}  // namespace difftx::simd_detail
