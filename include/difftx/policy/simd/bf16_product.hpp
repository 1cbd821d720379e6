// Which product a bfloat16 matrix product runs on: converted to float while
// packed (gemm.hpp), or the CPU's bfloat16 dot-product instruction vdpbf16ps
// (gemm_bf16_pairs.hpp). Chosen at run time, so one binary serves every CPU.
#pragma once

// 1 where the dot-product path is compiled in: x86-64 with GCC or clang, not
// the MSVC ABI (clang-cl lacks __builtin_cpu_supports's runtime).
// -DDIFFTX_BF16_PAIRS=0 leaves it out.
#if !defined(DIFFTX_BF16_PAIRS)
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(_MSC_VER)
#define DIFFTX_BF16_PAIRS 1
#else
#define DIFFTX_BF16_PAIRS 0
#endif
#endif

namespace difftx::policy {

// policy::simd::bf16_products: automatic takes the dot-product instruction
// only on the CPUs where it has been measured faster than the converting
// product (AMD Zen 4 and later; docs/benchmarks.md), converting and
// dot_instructions force a path for comparisons. Forcing dot_instructions on
// a CPU without AVX512_BF16 runs the converting product.
enum class bf16_product { automatic, converting, dot_instructions };

}  // namespace difftx::policy

namespace difftx::simd_detail {

// Whether this CPU (and its OS, which must save the AVX-512 registers) runs
// vdpbf16ps; asked once.
inline bool bf16_pair_instructions() noexcept {
#if DIFFTX_BF16_PAIRS
  static const bool available = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  return available;
#else
  return false;
#endif
}

// The path a setting runs on this CPU for products of many rows (prefill,
// training): converting or dot_instructions. Every AMD CPU with AVX512_BF16
// is a Zen 4 or later (family 25 model 16 on); on Intel's (Cooper Lake,
// Sapphire Rapids) the instruction's zmm form issues on one port where float
// FMAs issue on two, and the one measured there ran slower than converting,
// so automatic stays with converting until measured.
inline policy::bf16_product resolved_bf16_product(policy::bf16_product wanted) noexcept {
  using path = policy::bf16_product;
  if (wanted == path::converting || !bf16_pair_instructions()) return path::converting;
  if (wanted == path::dot_instructions) return path::dot_instructions;
#if DIFFTX_BF16_PAIRS
  static const bool measured_faster = __builtin_cpu_is("amd");
  return measured_faster ? path::dot_instructions : path::converting;
#else
  return path::converting;
#endif
}

// The path for decoding's products of a few rows, which read each weight
// once and are bound by memory, not by the instruction's port: automatic
// takes the instruction wherever the CPU has it, as on Intel's it streams the
// weights faster than converting them to float (docs/benchmarks.md,
// "Decoding a checkpoint", the bfloat16 rows).
inline policy::bf16_product resolved_bf16_decoding_product(policy::bf16_product wanted) noexcept {
  using path = policy::bf16_product;
  return wanted == path::converting || !bf16_pair_instructions() ? path::converting : path::dot_instructions;
}
}  // namespace difftx::simd_detail
