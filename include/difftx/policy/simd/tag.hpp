// The simd policy's tag; see difftx/policy/simd.hpp.
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>

#include "difftx/core/x86_intrinsics.hpp"  // before Eigen
#include <Eigen/Core>
#include <xsimd/xsimd.hpp>

#include "difftx/core/memory.hpp"
#include "difftx/core/scalar_traits.hpp"
#include "difftx/ops/int8.hpp"
#include "difftx/policy/simd/amx_tiles.hpp"
#include "difftx/policy/simd/bf16_product.hpp"
#include "difftx/policy/simd/stream_prefetch.hpp"

namespace difftx::policy {

struct simd {
  static constexpr const char* name = "simd";
  // float and double compute in themselves; float16 and bfloat16 are storage
  // types whose kernels convert to float.
  template <class T>
  static constexpr bool supports = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                   std::is_same_v<T, Eigen::half> || std::is_same_v<T, Eigen::bfloat16>;
  int threads = 0;  // OpenMP threads for every kernel; 0 means omp_get_max_threads()
  // How bfloat16 matrix products multiply (docs/design.md, "bfloat16
  // products"): automatic, or one path forced for comparisons.
  using bf16_product = policy::bf16_product;
  bf16_product bf16_products = bf16_product::automatic;
  // The path they take on this CPU under that setting: converting or
  // dot_instructions; products of many rows, then decoding's of a few.
  bf16_product bf16_product_used() const noexcept { return simd_detail::resolved_bf16_product(bf16_products); }
  bf16_product bf16_decoding_product_used() const noexcept {
    return simd_detail::resolved_bf16_decoding_product(bf16_products);
  }
  // The bytes of a decoding product's input (k values of T) that it holds
  // beside each row of the weight (Linear::add_decoding_panels): k values of
  // the accumulation type (float16 and bfloat16 are widened first), except
  // bfloat16 on the dot-product instruction, which reads x as it lies.
  template <class T>
  std::size_t decoding_input_bytes(std::size_t k) const noexcept {
    if (std::is_same_v<T, Eigen::bfloat16> && bf16_decoding_product_used() == bf16_product::dot_instructions)
      return k * sizeof(T);
    return k * sizeof(accum_t<T>);
  }
  // How decoding's products read a weight's rows from memory: one at a time
  // or a few side by side (policy::stream_order), automatic by the CPU. The
  // results are the same bits either way.
  using stream_order = policy::stream_order;
  stream_order streaming = stream_order::automatic;
  // The order they read in under that setting on this CPU.
  stream_order streaming_used() const noexcept { return simd_detail::resolved_stream_order(streaming); }
  // The vector instruction set the kernels were compiled for (xsimd's best
  // under the compiler's -m flags: "avx512bw", "fma3+avx2", "sse2", ...). It
  // is fixed at compile time: without -march=native (or the target
  // difftx::native) x86-64 builds get "sse2" and run about 3x slower.
  static constexpr const char* instruction_set() noexcept { return xsimd::default_arch::name(); }
  // Low-bit inference (docs/semantics.md): attention-logit quantization, int8
  // key/value caches and int8 weights.
  static constexpr bool low_bit = true;
  memory_resource& memory() const noexcept { return host_memory(); }
  // Who multiplies the matrices of a product of many rows (prefill, training):
  // automatic takes oneDNN's matmul where the build has it (DIFFTX_ONEDNN) and
  // it was measured faster on this CPU for the type (docs/design.md, "oneDNN"),
  // difftx and onednn force a side for comparisons (onednn falls back to
  // difftx's where oneDNN has no kernel, e.g. float16 without AVX512_FP16).
  enum class matmul_library { automatic, difftx, onednn };
  matmul_library matmuls = matmul_library::automatic;
  // "onednn <its kernel>" where a product of many rows in T (std::int8_t: int8
  // weights) runs on oneDNN under this policy, "" where on difftx's own
  // (defined in linear_onednn.hpp).
  template <class T>
  std::string matmul_kernel() const;
  // A weight also in the layout oneDNN's matmul reads, for products of more
  // rows than decoding's (Linear::add_packed_weights; defined in
  // linear_onednn.hpp where the build has oneDNN).
  struct packed_weights;
  // AMX tiles (Sapphire Rapids and later) in difftx's own kernels: the
  // attention's int8 and bfloat16 score tiles, and bfloat16 products of 5 to
  // 16 rows (several prompts decoded together; docs/design.md, "AMX"). They
  // run where the CPU and the OS grant tile data, and the AVX-512 kernels run
  // elsewhere; false forces the AVX-512 kernels (for comparisons).
  bool amx_tiles = true;
  // Whether they run under this policy on this CPU: asked for, and granted.
  bool amx_tiles_used() const noexcept {
    return amx_tiles && (simd_detail::amx_runs(simd_detail::amx_product::u8s8) ||
                         simd_detail::amx_runs(simd_detail::amx_product::bf16));
  }
  // What the attention multiplies Q·Kᵀ on in T under this policy on this CPU,
  // for a module with these low-bit options: "amx bf16" or "amx int8" (AMX
  // tiles), "vdpbf16ps", "avx512vnni", or "float" (the float product; defined
  // in attention.hpp).
  template <class T>
  const char* score_tile_kernel(int logit_bits = logits_unquantized,
                                inference_dtype qk = inference_dtype::same) const noexcept;
};

}  // namespace difftx::policy
