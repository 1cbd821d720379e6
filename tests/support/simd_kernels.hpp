// What policy::simd says of its own kernels on this CPU (and under this
// process's ONEDNN_MAX_CPU_ISA, which the tool the CLI tests start inherits),
// asked of the library itself: the facts `difftx bench --json` must report as
// product_kernel, decode_product_kernel, score_tile_kernel and amx_tiles. The
// CLI tests compare the tool's fields with these rather than match words in
// its policy column, so one expectation holds on every CPU.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include <difftx/policy/simd.hpp>

namespace test_support {

struct simd_kernels {
  std::string products, decoding_products, score_tiles;
  bool amx_tiles = false;
};

// Products: the products of many rows' type (T, or std::int8_t for int8 weights).
template <class T, class Products = T>
simd_kernels simd_kernels_of(const difftx::policy::simd& p, int logit_bits = difftx::logits_unquantized,
                             difftx::inference_dtype qk = difftx::inference_dtype::same) {
  simd_kernels k{.products = p.matmul_kernel<Products>(),
                 .decoding_products = "",
                 .score_tiles = p.score_tile_kernel<T>(logit_bits, qk),
                 .amx_tiles = p.amx_tiles_used()};
  // difftx's own products: bfloat16 names its paths, of many rows and of decoding's few
  const auto path_name = [](difftx::policy::bf16_product path) {
    return path == difftx::policy::bf16_product::dot_instructions ? "vdpbf16ps" : "converting";
  };
  constexpr bool bf16 = std::is_same_v<Products, Eigen::bfloat16>;
  if (k.products.empty()) k.products = bf16 ? path_name(p.bf16_product_used()) : "difftx";
  if constexpr (bf16) k.decoding_products = path_name(p.bf16_decoding_product_used());
  return k;
}

}  // namespace test_support
