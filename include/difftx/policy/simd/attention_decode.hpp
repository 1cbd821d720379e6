// Attention of a few new tokens over a key/value cache on the CPU (formulas in
// difftx/ops/attention_decode.hpp), split over keys as flash-decoding does.
// This file is policy::simd's entry; the kernel is in pieces:
//   attention_decode_blocks.hpp   the work schedule: blocks of keys over the
//                                 threads, each block's softmax, the blocks
//                                 combined by log-sum-exp
//   attention_decode_caches.hpp   a block's scores and P·V from a cache in T
//                                 and from an int8 cache
//   attention_decode_kernels.hpp  the loops for a few query rows, reading the
//                                 cache in place
#pragma once

#include <span>

#include "difftx/ops/attention_decode.hpp"
#include "difftx/ops/int8.hpp"
#include "difftx/ops/logit_quantization.hpp"
#include "difftx/policy/simd/attention_decode_blocks.hpp"
#include "difftx/policy/simd/attention_decode_caches.hpp"
#include "difftx/policy/simd/common.hpp"

namespace difftx {

// q [B,T,H,Maps,d], k [B,S,G,Maps,d], v [B,S,G,dv], lengths [B] (host), lambda [1] (Maps = 2) -> o [B,T,H,dv]
// logit_bits: 16, or the logits quantized to 4..8 bits (ops/logit_quantization.hpp).
template <int Maps, class T>
  requires supported_by<policy::simd, T>
void attention_decode(const policy::simd& p, cview<T, 5> q, cview<T, 5> k, cview<T, 4> v,
                      std::span<const index_t> lengths, cview<accum_t<T>, 1> lambda, TensorView<T, 4> o,
                      int logit_bits = logits_unquantized) {
  using namespace simd_detail;
  using A = accum_t<T>;
  detail::check_attention_decode<Maps>("attention_decode", memory_space::host, q, k, v, lengths, lambda, o);
  detail::check_logit_bits<A>("attention_decode", logit_bits);
  const float_cache_blocks<Maps, T> cache{decode_queries<Maps, T>(q, k.extent(2), v.extent(3)), k, v};
  decode_in_blocks<Maps>(p, cache, lengths, Maps == 2 ? lambda(0) : A(0), logit_bits, o);
}

// The same over an int8 cache (modules/kv_cache.hpp): keys and values read in
// place, int8 converted in registers; a block's scores are Q · k8 then times
// each key's step, and each value's step folds into its probability. With
// more than gemv_rows query rows, each group's block is dequantized once into
// scratch for Eigen's products, as the float16/bfloat16 caches are converted.
template <int Maps, class T>
  requires supported_by<policy::simd, T>
void attention_decode(const policy::simd& p, cview<T, 5> q, const int8_kv<accum_t<T>>& kv,
                      std::span<const index_t> lengths, cview<accum_t<T>, 1> lambda, TensorView<T, 4> o,
                      int logit_bits = logits_unquantized) {
  using namespace simd_detail;
  using A = accum_t<T>;
  detail::check_attention_decode_int8<Maps>("attention_decode", q, kv, lengths, lambda, o);
  detail::check_logit_bits<A>("attention_decode", logit_bits);
  const int8_cache_blocks<Maps, T> cache{decode_queries<Maps, T>(q, kv.keys8.extent(2), kv.values8.extent(3)), kv};
  decode_in_blocks<Maps>(p, cache, lengths, Maps == 2 ? lambda(0) : A(0), logit_bits, o);
}

}  // namespace difftx
