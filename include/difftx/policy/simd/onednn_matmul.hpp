// oneDNN's matmul (the library PyTorch's CPU matrix products run on; AMX,
// AVX512_BF16, AVX512_VNNI and AVX-512 kernels chosen at run time) for
// policy::simd's products of many rows: C[M, N] (=|+=) A[M, K] · B[K, N] in
// float, bfloat16 or float16, sums in float and one rounding into C; or int8
// rows, C = A · B exactly in int32 (u8 · s8 -> s32). Compiled where the build
// defines DIFFTX_ONEDNN (CMake target difftx::onednn); docs/design.md, "oneDNN".
//
// Primitives are created once per shape, layout, type and thread count and
// kept (at most primitive_cache_capacity; past that the cache starts over), as
// cuBLASLt plans are on the GPU. A type oneDNN has no kernel for on this CPU
// (float16 without AVX512_FP16) is remembered as such and the caller computes
// the product itself.
#pragma once

#if defined(DIFFTX_ONEDNN)

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>

#include <oneapi/dnnl/dnnl.hpp>

#include "difftx/policy/simd/common.hpp"

namespace difftx::simd_detail {

// One operand: its first element and the strides of its two axes, in elements.
struct matmul_operand {
  const void* data;
  index_t row_stride, column_stride;
};

template <class T>
constexpr dnnl::memory::data_type onednn_type() {
  if constexpr (std::is_same_v<T, float>) return dnnl::memory::data_type::f32;
  else if constexpr (std::is_same_v<T, Eigen::bfloat16>) return dnnl::memory::data_type::bf16;
  else if constexpr (std::is_same_v<T, Eigen::half>) return dnnl::memory::data_type::f16;
  else return dnnl::memory::data_type::undef;
}
template <class T>
constexpr bool onednn_computes = onednn_type<T>() != dnnl::memory::data_type::undef;

// The element types of A, B and C.
struct matmul_types {
  dnnl::memory::data_type a, b, c;
  // One type throughout (float, bfloat16, float16).
  static constexpr matmul_types all(dnnl::memory::data_type t) { return {t, t, t}; }
};
// Exact integer products of int8 rows (gemm_int8.hpp), the first operand
// offset to unsigned bytes.
inline constexpr matmul_types int8_products_types{dnnl::memory::data_type::u8, dnnl::memory::data_type::s8,
                                                  dnnl::memory::data_type::s32};

// Whether oneDNN's u8·s8 sums are exact on this CPU (and under its
// ONEDNN_MAX_CPU_ISA): with VNNI (vpdpbusd, AMX's tdpbusd) they are; without it
// oneDNN adds pairs of products with vpmaddubsw, which saturates at int16 for
// bytes as large as difftx's (oneDNN leaves 7-bit inputs to the caller).
inline bool onednn_int8_exact() {
  static const bool exact = [] {
    using isa = dnnl::cpu_isa;
    const isa effective = dnnl::get_effective_cpu_isa();
    return effective == isa::avx512_core_vnni || effective == isa::avx512_core_bf16 ||
           effective == isa::avx512_core_amx || effective == isa::avx2_vnni;
  }();
  return exact;
}

class onednn_matmuls {
 public:
  static constexpr std::size_t primitive_cache_capacity = 256;

  static onednn_matmuls& instance() {
    static onednn_matmuls matmuls;
    return matmuls;
  }

  // C (=|+=) A · B on `threads` threads; false (nothing written) where oneDNN
  // has no kernel for the types on this CPU.
  bool run(matmul_types types, index_t M, index_t N, index_t K, const matmul_operand& a,
           const matmul_operand& b, void* c, index_t ldc, bool accumulate, int threads) {
    const key k{types.a,         types.b,      types.c,         M,   N,          K,      a.row_stride,
                a.column_stride, b.row_stride, b.column_stride, ldc, accumulate, threads};
    const thread_count_scope scope(threads);
    const auto made = find_or_create(k);
    if (!made) return false;
    dnnl::stream stream(engine_);
    dnnl::memory a_memory(descriptor(types.a, M, K, a.row_stride, a.column_stride), engine_, const_cast<void*>(a.data));
    dnnl::memory b_memory(descriptor(types.b, K, N, b.row_stride, b.column_stride), engine_, const_cast<void*>(b.data));
    dnnl::memory c_memory(descriptor(types.c, M, N, ldc, 1), engine_, c);
    made->primitive.execute(stream, {{DNNL_ARG_SRC, a_memory}, {DNNL_ARG_WEIGHTS, b_memory}, {DNNL_ARG_DST, c_memory}});
    stream.wait();
    return true;
  }

  // The kernel oneDNN picks for a product of the types on this CPU
  // ("brg:avx512_core_amx", "gemm:jit", ...), "" where it has none.
  std::string implementation(matmul_types types, int threads) {
    const thread_count_scope scope(threads);
    const auto made = find_or_create({types.a, types.b, types.c, 256, 256, 256, 256, 1, 256, 1, 256, false, threads});
    return made ? made->kernel : "";
  }

 private:
  struct entry {
    dnnl::matmul primitive;  // a handle: copies share it
    std::string kernel;      // oneDNN's name for it
  };
  using key = std::tuple<dnnl::memory::data_type, dnnl::memory::data_type, dnnl::memory::data_type, index_t, index_t,
                         index_t, index_t, index_t, index_t, index_t, index_t, bool, int>;

  // oneDNN's OpenMP kernels take the team size from omp_get_max_threads(): the
  // policy's count for this call, the caller's setting back after it.
  struct thread_count_scope {
    explicit thread_count_scope([[maybe_unused]] int threads) {
#if defined(_OPENMP)
      previous = omp_get_max_threads();
      omp_set_num_threads(threads);
#endif
    }
    ~thread_count_scope() {
#if defined(_OPENMP)
      omp_set_num_threads(previous);
#endif
    }
    thread_count_scope(const thread_count_scope&) = delete;
    thread_count_scope& operator=(const thread_count_scope&) = delete;
    int previous = 1;
  };

  onednn_matmuls() : engine_(dnnl::engine::kind::cpu, 0) {}

  static dnnl::memory::desc descriptor(dnnl::memory::data_type type, index_t rows, index_t cols, index_t row_stride,
                                       index_t column_stride) {
    return dnnl::memory::desc({rows, cols}, type, dnnl::memory::dims{row_stride, column_stride});
  }

  // The primitive for k, none where oneDNN has no kernel.
  std::optional<entry> find_or_create(const key& k) {
    const std::lock_guard lock(mutex_);
    if (const auto it = primitives_.find(k); it != primitives_.end()) return it->second;
    if (primitives_.size() >= primitive_cache_capacity) primitives_.clear();
    const auto& [a_type, b_type, c_type, M, N, K, a_rows, a_cols, b_rows, b_cols, ldc, accumulate, threads] = k;
    std::optional<entry> made;
    try {
      dnnl::primitive_attr attr;
      if (accumulate) {
        dnnl::post_ops sum;
        sum.append_sum(1.0f);
        attr.set_post_ops(sum);
      }
      const auto a = descriptor(a_type, M, K, a_rows, a_cols), b = descriptor(b_type, K, N, b_rows, b_cols),
                 c = descriptor(c_type, M, N, ldc, 1);
#if DNNL_VERSION_MAJOR >= 3
      const dnnl::matmul::primitive_desc pd(engine_, a, b, c, attr);
#else
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, engine_);
#endif
      made = entry{dnnl::matmul(pd), pd.impl_info_str()};
    } catch (const dnnl::error&) {
      made.reset();  // no kernel for these types here: the caller's own product
    }
    primitives_.emplace(k, made);
    return made;
  }

  dnnl::engine engine_;
  std::mutex mutex_;
  std::map<key, std::optional<entry>> primitives_;
};

}  // namespace difftx::simd_detail

#endif  // DIFFTX_ONEDNN
