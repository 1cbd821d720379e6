// KVCache<T>: the keys (after RoPE) and values one attention layer has seen,
// for a batch of sequences, so that decoding a new token attends to them
// without recomputing them:
//   keys   [B, S, G, Maps, d]   S the capacity in tokens, G key/value groups
//   values [B, S, G, dv]        (grouped heads stored once per group)
//   lengths[b]                  the tokens sequence b holds (host memory)
// A differential layer (MultiHead) stores both maps' key halves (Maps = 2) and
// values of 2d; the baseline Attention one map and values of d. Bytes per
// token and layer: G · (Maps · d + dv) · sizeof(T), the same for both at the
// paper's matched sizes. Rows past a sequence's length are never read.
//
// int8 storage (make_cache(batch, capacity, inference_dtype::int8), the
// low-bit CPU policies; ops/int8.hpp): keys as int8 with a step per (token,
// group, map) and values as int8 with a step per (token, group), quantized as
// they are appended; decoding reads them as step · int8. Bytes per token and
// layer: G · (Maps · d + dv) + G · (Maps + 1) · sizeof(accum_t<T>), a quarter
// of float32's plus the steps.
//
// Modules make their cache (make_cache(batch, capacity)); prefill() restarts it
// with a prompt and decode() appends. Every change is checked before anything
// is written: an append past the capacity throws and changes nothing.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "difftx/core/checks.hpp"
#include "difftx/core/tensor.hpp"
#include "difftx/modules/sequences.hpp"
#include "difftx/ops/int8.hpp"
#include "difftx/ops/logit_quantization.hpp"

namespace difftx {

struct KVCacheShape {
  index_t batch = 1;     // B sequences
  index_t capacity = 0;  // S tokens per sequence
  index_t kv_heads = 1;  // G
  index_t maps = 1;      // 1 (standard) or 2 (differential)
  index_t head_dim = 0;  // d, per map
  index_t value_dim = 0; // dv
  inference_dtype storage = inference_dtype::same;  // T, or int8 with steps
};


template <Scalar T>
class KVCache {
 public:
  KVCache() = default;
  KVCache(const KVCacheShape& shape, memory_resource& memory) : shape_(checked(shape)), lengths_(static_cast<std::size_t>(shape.batch), 0) {
    const index_t B = shape.batch, S = shape.capacity, G = shape.kv_heads;
    if (shape.storage == inference_dtype::int8) {
      require(memory.space() == memory_space::host, "KVCache", "memory", "host memory for an int8 cache",
              std::string(to_string(memory.space())) + " memory");
      keys8_ = Tensor<std::int8_t, 5>({B, S, G, shape.maps, shape.head_dim});
      key_steps_ = Tensor<accum_t<T>, 4>({B, S, G, shape.maps});
      values8_ = Tensor<std::int8_t, 4>({B, S, G, shape.value_dim});
      value_steps_ = Tensor<accum_t<T>, 3>({B, S, G});
    } else {
      keys_ = Tensor<T, 5>({B, S, G, shape.maps, shape.head_dim}, memory);
      values_ = Tensor<T, 4>({B, S, G, shape.value_dim}, memory);
    }
  }

  const KVCacheShape& shape() const noexcept { return shape_; }
  index_t batch() const noexcept { return shape_.batch; }
  index_t capacity() const noexcept { return shape_.capacity; }
  index_t length(index_t b) const { return lengths_.at(static_cast<std::size_t>(b)); }
  std::span<const index_t> lengths() const noexcept { return lengths_; }
  inference_dtype storage() const noexcept { return shape_.storage; }
  // Per token of one sequence, keys and values together (int8: with their steps).
  std::size_t bytes_per_token() const noexcept {
    const auto G = static_cast<std::size_t>(shape_.kv_heads), maps = static_cast<std::size_t>(shape_.maps);
    const auto elements = G * static_cast<std::size_t>(shape_.maps * shape_.head_dim + shape_.value_dim);
    if (shape_.storage == inference_dtype::int8) return elements + G * (maps + 1) * sizeof(accum_t<T>);
    return elements * sizeof(T);
  }
  // Everything the cache holds: capacity x batch tokens (lengths aside).
  std::size_t bytes() const noexcept {
    return bytes_per_token() * static_cast<std::size_t>(shape_.batch * shape_.capacity);
  }
  // What a decode step reads of the cache: every sequence's stored tokens of
  // each tensor (int8: the steps too), one region per tensor and sequence, in
  // the cache's memory. Decoding's bound is these bytes and the weights' over
  // the read rate (`difftx bench --model`).
  std::vector<std::span<const std::byte>> stored_regions() const {
    std::vector<std::span<const std::byte>> regions;
    auto add = [&](const auto& tensor) {  // [B, S, ...]
      const auto per_token = static_cast<std::size_t>(tensor.size() / (shape_.batch * shape_.capacity));
      for (index_t b = 0; b < shape_.batch; ++b)
        regions.push_back(std::as_bytes(std::span(tensor.data() + static_cast<std::size_t>(b * shape_.capacity) * per_token,
                                                  static_cast<std::size_t>(length(b)) * per_token)));
    };
    if (shape_.storage == inference_dtype::int8) {
      add(keys8_);
      add(key_steps_);
      add(values8_);
      add(value_steps_);
    } else {
      add(keys_);
      add(values_);
    }
    return regions;
  }
  // The stored tensors: keys() and values() for storage same, int8_view() for int8.
  cview<T, 5> keys() const noexcept { return keys_.view(); }
  cview<T, 4> values() const noexcept { return values_.view(); }
  int8_kv<accum_t<T>> int8_view() const noexcept {
    return {keys8_.view(), key_steps_.view(), values8_.view(), value_steps_.view()};
  }
  memory_space space() const noexcept {
    return shape_.storage == inference_dtype::int8 ? memory_space::host : keys_.space();
  }

  // Every sequence empty again (nothing is cleared: rows past a length are never read).
  void reset() noexcept { std::fill(lengths_.begin(), lengths_.end(), index_t{0}); }
  // Every sequence keeps at most its first `length` tokens (rolling back
  // rejected tokens, or timing one decode step again at the same length).
  void truncate(index_t length) {
    require(length >= 0, "KVCache::truncate", "length", "a length >= 0", std::to_string(length));
    for (auto& l : lengths_) l = std::min(l, length);
  }
  // Only sequences kept[0] < kept[1] < ... stay, as sequences 0, 1, ...: the
  // others leave the batch (a prompt whose generation ended). Their stored
  // rows move into a cache of kept.size() sequences of the same capacity.
  void keep_sequences(std::span<const index_t> kept) {
    constexpr std::string_view where = "KVCache::keep_sequences";
    require(!kept.empty(), where, "kept", "at least one sequence", "none");
    for (std::size_t i = 0; i < kept.size(); ++i)
      require(kept[i] >= 0 && kept[i] < shape_.batch && (i == 0 || kept[i] > kept[i - 1]), where, "kept",
              [&] { return "increasing sequence indices in [0, " + std::to_string(shape_.batch) + ")"; },
              [&] { return std::to_string(kept[i]) + " at " + std::to_string(i); });
    if (static_cast<index_t>(kept.size()) == shape_.batch) return;
    KVCacheShape shape = shape_;
    shape.batch = static_cast<index_t>(kept.size());
    KVCache smaller(shape, keys_.memory());
    const auto move_rows = [&](auto& to, const auto& from) {  // [B, S, ...] tensors
      const auto per_token = static_cast<std::size_t>(from.size() / (shape_.batch * shape_.capacity));
      for (std::size_t i = 0; i < kept.size(); ++i)
        keys_.memory().copy(to.data() + i * static_cast<std::size_t>(shape_.capacity) * per_token,
                            from.data() + static_cast<std::size_t>(kept[i] * shape_.capacity) * per_token,
                            static_cast<std::size_t>(length(kept[i])) * per_token * sizeof(*from.data()));
    };
    if (shape_.storage == inference_dtype::int8) {
      move_rows(smaller.keys8_, keys8_);
      move_rows(smaller.key_steps_, key_steps_);
      move_rows(smaller.values8_, values8_);
      move_rows(smaller.value_steps_, value_steps_);
    } else {
      move_rows(smaller.keys_, keys_);
      move_rows(smaller.values_, values_);
    }
    for (std::size_t i = 0; i < kept.size(); ++i) smaller.lengths_[i] = length(kept[i]);
    *this = std::move(smaller);
  }

  // Appends T tokens to every sequence: k [B, T, G, Maps, d], v [B, T, G, dv].
  void append(cview<T, 5> k, cview<T, 4> v) {
    constexpr std::string_view where = "KVCache::append";
    const index_t tokens = check_rows(where, k, v, shape_.batch);
    for (index_t b = 0; b < shape_.batch; ++b) require_room(where, b, tokens);
    for (index_t b = 0; b < shape_.batch; ++b) write(b, k[b], v[b], tokens);
  }
  // Appends T tokens to sequence b only: k [1, T, G, Maps, d], v [1, T, G, dv].
  void append(index_t b, cview<T, 5> k, cview<T, 4> v) {
    constexpr std::string_view where = "KVCache::append";
    require(b >= 0 && b < shape_.batch, where, "b", "a sequence in [0, " + std::to_string(shape_.batch) + ")",
            std::to_string(b));
    const index_t tokens = check_rows(where, k, v, 1);
    require_room(where, b, tokens);
    write(b, k[0], v[0], tokens);
  }

  // For decode(): every sequence started (by a prefill) and room for T more tokens.
  void require_decodable(std::string_view where, index_t tokens) const {
    for (index_t b = 0; b < shape_.batch; ++b)
      require(lengths_[static_cast<std::size_t>(b)] > 0, where, "cache",
              "a cache a prefill has started (decode continues a prompt)",
              [&] { return "sequence " + std::to_string(b) + " empty"; });
    for (index_t b = 0; b < shape_.batch; ++b) require_room(where, b, tokens);
  }
  // For a module using this cache: the layout it expects and inputs for `batch` sequences.
  void require_layout(std::string_view where, const KVCacheShape& expected, index_t batch, memory_space space) const {
    const auto& s = shape_;
    require(s.kv_heads == expected.kv_heads && s.maps == expected.maps && s.head_dim == expected.head_dim &&
                s.value_dim == expected.value_dim,
            where, "cache",
            [&] {
              return "a cache made by this module (G = " + std::to_string(expected.kv_heads) + ", maps = " +
                     std::to_string(expected.maps) + ", d = " + std::to_string(expected.head_dim) + ", dv = " +
                     std::to_string(expected.value_dim) + ")";
            },
            [&] {
              return "G = " + std::to_string(s.kv_heads) + ", maps = " + std::to_string(s.maps) + ", d = " +
                     std::to_string(s.head_dim) + ", dv = " + std::to_string(s.value_dim);
            });
    require(s.batch == batch, where, "cache", [&] { return "a cache of " + std::to_string(batch) + " sequences (the input's)"; },
            [&] { return std::to_string(s.batch) + " sequences"; });
    require_memory(where, "cache", this->space(), space);
  }
  void require_room(std::string_view where, index_t b, index_t tokens) const {
    const index_t length = lengths_[static_cast<std::size_t>(b)];
    require(length + tokens <= shape_.capacity, where, "cache",
            [&] { return "room for " + std::to_string(tokens) + " more tokens (capacity " + std::to_string(shape_.capacity) + ")"; },
            [&] { return "sequence " + std::to_string(b) + " holding " + std::to_string(length); });
  }

 private:
  static KVCacheShape checked(const KVCacheShape& s) {
    for (const auto& [name, value] : {std::pair{"shape.batch", s.batch}, std::pair{"shape.capacity", s.capacity},
                                      std::pair{"shape.kv_heads", s.kv_heads}, std::pair{"shape.head_dim", s.head_dim},
                                      std::pair{"shape.value_dim", s.value_dim}})
      require(value > 0, "KVCache", name, "a positive size", std::to_string(value));
    require(s.maps == 1 || s.maps == 2, "KVCache", "shape.maps", "1 or 2", std::to_string(s.maps));
    if (s.storage == inference_dtype::int8) detail::require_int8_arithmetic<accum_t<T>>("KVCache", "shape.storage");
    return s;
  }
  index_t check_rows(std::string_view where, const cview<T, 5>& k, const cview<T, 4>& v, index_t batch) const {
    require_nonempty(where, "k", k);
    const index_t tokens = k.extent(1);
    require_shape(where, "k", k, {batch, tokens, shape_.kv_heads, shape_.maps, shape_.head_dim});
    require_shape(where, "v", v, {batch, tokens, shape_.kv_heads, shape_.value_dim});
    require_space(where, "k", k, space());
    require_space(where, "v", v, space());
    return tokens;
  }
  // Sequence b's rows [length, length + T) <- k_rows [T, ...], v_rows [T, ...].
  void write(index_t b, cview<T, 4> k_rows, cview<T, 3> v_rows, index_t tokens) {
    auto& length = lengths_[static_cast<std::size_t>(b)];
    if (shape_.storage == inference_dtype::int8) {
      write_int8(b, length, k_rows, v_rows, tokens);
      length += tokens;
      return;
    }
    auto& memory = keys_.memory();
    memory.copy(keys_.view()[b][length].data(), k_rows.data(), static_cast<std::size_t>(k_rows.size()) * sizeof(T));
    memory.copy(values_.view()[b][length].data(), v_rows.data(), static_cast<std::size_t>(v_rows.size()) * sizeof(T));
    length += tokens;
  }

  // Rows [length, length + tokens) of sequence b, each key (token, group, map)
  // and value (token, group) vector quantized on its own.
  void write_int8(index_t b, index_t length, cview<T, 4> k_rows, cview<T, 3> v_rows, index_t tokens) {
    using A = accum_t<T>;
    if constexpr (std::is_floating_point_v<A>) {
      const index_t G = shape_.kv_heads, maps = shape_.maps, d = shape_.head_dim, dv = shape_.value_dim;
      std::vector<A> vector(static_cast<std::size_t>(std::max(d, dv)));
      auto quantize = [&](const T* from, index_t n, std::int8_t* to, A& step) {
        for (index_t c = 0; c < n; ++c) vector[static_cast<std::size_t>(c)] = load(from[c]);
        step = detail::quantize_int8(vector.data(), n, to);
      };
      for (index_t t = 0; t < tokens; ++t)
        for (index_t g = 0; g < G; ++g) {
          for (index_t m = 0; m < maps; ++m)
            quantize(&k_rows(t, g, m, 0), d, &keys8_(b, length + t, g, m, 0), key_steps_(b, length + t, g, m));
          quantize(&v_rows(t, g, 0), dv, &values8_(b, length + t, g, 0), value_steps_(b, length + t, g));
        }
    }
  }

  KVCacheShape shape_{};
  Tensor<T, 5> keys_;  // storage same
  Tensor<T, 4> values_;
  Tensor<std::int8_t, 5> keys8_;  // storage int8, host memory
  Tensor<accum_t<T>, 4> key_steps_;
  Tensor<std::int8_t, 4> values8_;
  Tensor<accum_t<T>, 3> value_steps_;
  std::vector<index_t> lengths_;
};

namespace detail {
// A module's cache layout with the storage make_cache was asked for; int8 only
// on a policy with the low-bit paths.
template <class Policy>
KVCacheShape with_storage(std::string_view where, KVCacheShape shape, inference_dtype storage) {
  if (storage == inference_dtype::int8)
    require(low_bit_policy<Policy>, where, "storage", "a policy with int8 caches (reference, simd)",
            std::string("policy::") + Policy::name);
  shape.storage = storage;
  return shape;
}

// A prefill's cache: this module's layout (layout.batch and .capacity unused),
// one sequence per prompt of x [B, N, C] (or of a packed batch), room for each.
template <class T, class X>
void check_prefill(std::string_view where, const KVCache<T>& cache, const KVCacheShape& layout, const X& x,
                   std::span<const index_t> sequences, memory_space space) {
  const index_t prompts = sequences.empty() ? x.extent(0) : static_cast<index_t>(sequences.size()) - 1;
  cache.require_layout(where, layout, prompts, space);
  for (index_t b = 0; b < prompts; ++b) {
    const auto s = static_cast<std::size_t>(b);
    const index_t length = sequences.empty() ? x.extent(1) : sequences[s + 1] - sequences[s];
    require(length <= cache.capacity(), where, "cache",
            "a capacity of at least the prompt's " + std::to_string(length) + " tokens",
            "capacity " + std::to_string(cache.capacity()) + " (sequence " + std::to_string(b) + ")");
  }
}

// A prefill's keys k [B, N, G, Maps, d] and values into the cache: sequence b's
// rows, or packed sequence b's rows [cu_seqlens[b], cu_seqlens[b + 1]).
template <class T>
void append_prompts(KVCache<T>& cache, cview<T, 5> k, cview<T, 4> v, std::span<const index_t> sequences) {
  if (sequences.empty()) {
    cache.append(k, v);
    return;
  }
  for (std::size_t b = 0; b + 1 < sequences.size(); ++b) {
    const packed_sequence seq{sequences[b], sequences[b + 1]};
    cache.append(static_cast<index_t>(b), seq.rows(k), seq.rows(v));
  }
}
}  // namespace detail

}  // namespace difftx
