// The GPU's read rate as decoding meets it, the device twin of
// simd/memory_read.hpp: decoding reads every weight once per token, so the
// time the device takes only to read those bytes is its bound. `difftx bench
// --model --policy cuda` reads a model's own weights and cache with it
// between decode steps (docs/benchmarks.md).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "difftx/policy/cuda/tag.cuh"

namespace difftx::cuda_detail {

// A block's share of a region: 16-byte words [begin, begin + words).
template <class Word>
struct read_chunk_of {
  const Word* begin;
  unsigned long long words;
};
using read_chunk = read_chunk_of<uint4>;

inline constexpr unsigned read_threads = 256;
// 1 MiB a block: a 1B model's weights make a few thousand blocks, many waves
// on 132 multiprocessors, and a small tensor is one block.
inline constexpr unsigned long long read_chunk_words = (1ull << 20) / sizeof(uint4);

// Each thread keeps four 16-byte loads in flight, then folds them into one
// word; the word is stored only if it equals a constant no sum of real data
// is meant to hit, so no load is optimised away. A template (of the word
// type) so that the header defines no non-inline kernel.
template <class Word>
__global__ void read_chunks(const read_chunk_of<Word>* chunks, unsigned* sink) {
  const read_chunk_of<Word> c = chunks[blockIdx.x];
  const Word* p = c.begin;
  unsigned folded = 0;
  const auto fold = [&](Word w) { folded ^= w.x ^ w.y ^ w.z ^ w.w; };
  unsigned long long i = threadIdx.x;
  for (; i + 3 * read_threads < c.words; i += 4 * read_threads) {
    const Word a = p[i], b = p[i + read_threads], d = p[i + 2 * read_threads], e = p[i + 3 * read_threads];
    fold(a);
    fold(b);
    fold(d);
    fold(e);
  }
  for (; i < c.words; i += read_threads) fold(p[i]);
  if (folded == 0x9e3779b9u) *sink = folded;
}

// Every aligned 16-byte word of a set of device regions, cut into chunks once
// (the table is uploaded here), read by read() in one launch on p's stream.
// A region's few bytes outside whole aligned words (under 32) are not read.
class region_reader {
 public:
  region_reader(const policy::cuda& p, std::span<const std::span<const std::byte>> regions) : policy_(p) {
    std::vector<read_chunk> chunks;
    for (const auto& region : regions) {
      const auto first = (reinterpret_cast<std::uintptr_t>(region.data()) + 15) / 16 * 16;
      const auto last = (reinterpret_cast<std::uintptr_t>(region.data()) + region.size()) / 16 * 16;
      for (auto begin = first; begin < last; begin += read_chunk_words * 16)
        chunks.push_back({reinterpret_cast<const uint4*>(begin),
                          std::min<unsigned long long>(read_chunk_words, (last - begin) / 16)});
    }
    blocks_ = static_cast<unsigned>(chunks.size());
    chunks_ = static_cast<read_chunk*>(memory().allocate(chunks.size() * sizeof(read_chunk) + sizeof(unsigned)));
    memory().upload(chunks_, chunks.data(), chunks.size() * sizeof(read_chunk));
  }
  ~region_reader() { memory().deallocate(chunks_, 0); }
  region_reader(const region_reader&) = delete;
  region_reader& operator=(const region_reader&) = delete;

  void read() const {
    if (blocks_ == 0) return;
    read_chunks<<<blocks_, read_threads, 0, policy_.stream()>>>(chunks_, reinterpret_cast<unsigned*>(chunks_ + blocks_));
    DIFFTX_CUDA_CHECK(cudaGetLastError());
  }

 private:
  memory_resource& memory() const { return policy_.memory(); }

  policy::cuda policy_;
  read_chunk* chunks_ = nullptr;
  unsigned blocks_ = 0;
};

}  // namespace difftx::cuda_detail
