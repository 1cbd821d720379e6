// Intel AMX (Sapphire Rapids and later): eight tile registers of up to 16 rows
// x 64 bytes and an instruction that multiplies two of them into a third,
// 16 x 16 x 64 bytes at a time (tdpbusd: u8·s8 -> int32, four products a
// lane; tdpbf16ps: bfloat16 pairs -> float). The kernels built on it
// (amx_product.hpp) are written once over a tile unit: amx_tile_unit here runs
// the instructions, amx_tile_model (amx_tile_model.hpp) computes them in
// scalar C++, so the tests run the same kernels on every CPU.
//
// Tile data is off for a process until it asks Linux for it
// (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), Linux 5.16 on); a
// CPU, OS or build that refuses gets the AVX-512 kernels, as does a policy
// that turns them off (policy::simd::amx_tiles).
#pragma once

#include <cstdint>

#include "difftx/core/tensor.hpp"

// 1 where the AMX kernels are compiled in: x86-64 Linux with GCC or clang
// (the instructions are written as inline assembly, which needs GNU syntax;
// the permission request is Linux's). -DDIFFTX_AMX=0 leaves them out.
#if !defined(DIFFTX_AMX)
#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define DIFFTX_AMX 1
#else
#define DIFFTX_AMX 0
#endif
#endif

#if DIFFTX_AMX
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace difftx::simd_detail {

// The 64-byte operand of ldtilecfg (palette 1): each tile's rows and bytes a row.
struct alignas(64) amx_config {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {};
  std::uint8_t rows[16] = {};
  void shape(int tile, index_t tile_rows, index_t tile_bytes_per_row) {
    rows[tile] = static_cast<std::uint8_t>(tile_rows);
    bytes_per_row[tile] = static_cast<std::uint16_t>(tile_bytes_per_row);
  }
};
static_assert(sizeof(amx_config) == 64);

// The instructions. Tiles are named by template arguments, since the
// instructions encode them (%c prints the constant bare). AT&T order: the
// products take (B, A, C) for C += A·B.
struct amx_tile_unit {
#if DIFFTX_AMX
  void configure(const amx_config& config) { asm volatile("ldtilecfg %0" ::"m"(config)); }
  void release() { asm volatile("tilerelease" ::); }
  template <int t>
  void zero() {
    asm volatile("tilezero %%tmm%c0" ::"i"(t));
  }
  template <int t>
  void load(const void* first, index_t stride_bytes) {
    asm volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(first), "r"(stride_bytes), "i"(t) : "memory");
  }
  template <int t>
  void store(void* first, index_t stride_bytes) {
    asm volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(first), "r"(stride_bytes), "i"(t) : "memory");
  }
  template <int c, int a, int b>
  void dot_u8s8() {
    asm volatile("tdpbusd %%tmm%c0, %%tmm%c1, %%tmm%c2" ::"i"(b), "i"(a), "i"(c));
  }
  template <int c, int a, int b>
  void dot_bf16() {
    asm volatile("tdpbf16ps %%tmm%c0, %%tmm%c1, %%tmm%c2" ::"i"(b), "i"(a), "i"(c));
  }
#endif
};

// Which of AMX's products this CPU runs and this process may use.
enum class amx_product { u8s8, bf16 };

#if DIFFTX_AMX
// Asks Linux once for tile data; false where the CPU lacks AMX or the kernel
// refuses (older than 5.16, or tile state disabled).
inline bool amx_tile_data_granted() noexcept {
  static const bool granted = [] {
    if (!__builtin_cpu_supports("amx-tile")) return false;
    constexpr long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;  // <asm/prctl.h>, <asm/fpu/xstate.h>
    return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
  }();
  return granted;
}
#endif

inline bool amx_runs(amx_product product) noexcept {
#if DIFFTX_AMX
  const bool instruction = product == amx_product::u8s8 ? __builtin_cpu_supports("amx-int8") != 0
                                                        : __builtin_cpu_supports("amx-bf16") != 0;
  return instruction && amx_tile_data_granted();
#else
  (void)product;
  return false;
#endif
}

}  // namespace difftx::simd_detail
