// oneDNN's matmul (the library PyTorch's CPU matrix products run on; AMX,
// AVX512_BF16, AVX512_VNNI and AVX-512 kernels chosen at run time) for
// policy::simd's products of many rows: C[M, N] (=|+=) A[M, K] · B[K, N] in
// float, bfloat16 or float16, sums in float and one rounding into C; or int8
// rows, C = A · B exactly in int32 (u8 · s8 -> s32). For a build that links
// oneDNN (DIFFTX_ONEDNN, CMake target difftx::onednn), through
// linear_onednn.hpp; docs/design.md, "oneDNN".
//
// Primitives are created once per shape, layout, type and thread count and
// kept (at most primitive_cache_capacity; past that the cache starts over), as
// cuBLASLt plans are on the GPU. A type oneDNN has no kernel for on this CPU
// (float16 without AVX512_FP16) is remembered as such and the caller computes
// the product itself. A B multiplied many times (a model's weights) may be
// packed once into the layout oneDNN's kernel reads (onednn_packed_matrix):
// its products then skip the copy into that layout that each call makes of a
// B as it lies.
#pragma once

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
// oneDNN's ISA values are masks, each holding the bits of every ISA it extends
// (dnnl_types.h), so "at least VNNI" is containment: it holds for every ISA
// above avx512_core_vnni or avx2_vnni, those of later oneDNN versions too
// (avx512_core_fp16, avx512_core_amx_fp16, avx2_vnni_2).
inline bool onednn_int8_exact() {
  static const bool exact = [] {
    using isa = dnnl::cpu_isa;
    const auto effective = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto at_least = [&](isa base) { return (effective & static_cast<unsigned>(base)) == static_cast<unsigned>(base); };
    return at_least(isa::avx512_core_vnni) || at_least(isa::avx2_vnni);
  }();
  return exact;
}

// B [K, N] in the layout oneDNN's matmul picks for it (format_tag::any), a copy
// of its own.
struct onednn_packed_matrix {
  matmul_types types;
  index_t K, N;
  dnnl::memory memory;
  std::size_t bytes() const { return memory.get_desc().get_size(); }
};

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
    const auto b_layout = descriptor(types.b, K, N, b.row_stride, b.column_stride);
    const auto made = find_or_create(k, b_layout);
    if (!made) return false;
    execute(made->primitive, types, M, N, K, a, dnnl::memory(b_layout, engine_, const_cast<void*>(b.data)), c, ldc);
    return true;
  }
  // The same with B packed (pack below); false (nothing written) where
  // oneDNN has no kernel for a product of M rows on that layout.
  bool run(index_t M, const matmul_operand& a, const onednn_packed_matrix& b, void* c, index_t ldc, bool accumulate,
           int threads) {
    // Strides (0, 0) stand for a packed B; the primitive kept under them
    // serves only a B of the layout it was made for.
    const key k{b.types.a, b.types.b, b.types.c, M, b.N, b.K, a.row_stride, a.column_stride, 0, 0, ldc, accumulate,
                threads};
    const thread_count_scope scope(threads);
    const auto made = find_or_create(k, b.memory.get_desc());
    if (!made || !(made->b_layout == b.memory.get_desc())) return false;
    execute(made->primitive, b.types, M, b.N, b.K, a, b.memory, c, ldc);
    return true;
  }

  // B [K, N] copied into the layout oneDNN picks for products of many rows
  // with it; none where that is the layout B already has, or where oneDNN has
  // no kernel for the types.
  std::optional<onednn_packed_matrix> pack(matmul_types types, index_t N, index_t K, const matmul_operand& b,
                                           int threads) {
    const thread_count_scope scope(threads);
    try {
      // A prompt's rows; a product of other rows either takes the same layout
      // or declines it, and the caller then multiplies B as it lies.
      constexpr index_t rows = 512;
      const auto plain = descriptor(types.b, K, N, b.row_stride, b.column_stride);
      const dnnl::memory::desc chosen_by_kernel({K, N}, types.b, dnnl::memory::format_tag::any);
      const auto pd = primitive_description(descriptor(types.a, rows, K, K, 1), chosen_by_kernel,
                                            descriptor(types.c, rows, N, N, 1), {});
      if (pd.weights_desc() == plain) return std::nullopt;
      onednn_packed_matrix packed{types, K, N, dnnl::memory(pd.weights_desc(), engine_)};
      dnnl::memory source(plain, engine_, const_cast<void*>(b.data));
      dnnl::stream stream(engine_);
      dnnl::reorder(source, packed.memory).execute(stream, source, packed.memory);
      stream.wait();
      return packed;
    } catch (const dnnl::error&) {
      return std::nullopt;
    }
  }

  // The kernel oneDNN picks for a product of the types on this CPU
  // ("brg:avx512_core_amx", "gemm:jit", ...), "" where it has none.
  std::string implementation(matmul_types types, int threads) {
    const thread_count_scope scope(threads);
    const auto made = find_or_create({types.a, types.b, types.c, 256, 256, 256, 256, 1, 256, 1, 256, false, threads},
                                     descriptor(types.b, 256, 256, 256, 1));
    return made ? made->kernel : "";
  }

 private:
  struct entry {
    dnnl::matmul primitive;       // a handle: copies share it
    std::string kernel;           // oneDNN's name for it
    dnnl::memory::desc b_layout;  // the B it was made for
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

  dnnl::matmul::primitive_desc primitive_description(const dnnl::memory::desc& a, const dnnl::memory::desc& b,
                                                     const dnnl::memory::desc& c, const dnnl::primitive_attr& attr) {
#if DNNL_VERSION_MAJOR >= 3
    return dnnl::matmul::primitive_desc(engine_, a, b, c, attr);
#else
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, engine_);
#endif
  }

  void execute(const dnnl::matmul& primitive, matmul_types types, index_t M, index_t N, index_t K,
               const matmul_operand& a, const dnnl::memory& b, void* c, index_t ldc) {
    dnnl::stream stream(engine_);
    dnnl::memory a_memory(descriptor(types.a, M, K, a.row_stride, a.column_stride), engine_, const_cast<void*>(a.data));
    dnnl::memory c_memory(descriptor(types.c, M, N, ldc, 1), engine_, c);
    primitive.execute(stream, {{DNNL_ARG_SRC, a_memory}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c_memory}});
    stream.wait();
  }

  // The primitive for k with B laid out as b, none where oneDNN has no kernel.
  std::optional<entry> find_or_create(const key& k, const dnnl::memory::desc& b) {
    const std::lock_guard lock(mutex_);
    if (const auto it = primitives_.find(k); it != primitives_.end()) return it->second;
    if (primitives_.size() >= primitive_cache_capacity) primitives_.clear();
    // B's type and strides are b's.
    [[maybe_unused]] const auto& [a_type, b_type, c_type, M, N, K, a_rows, a_cols, b_rows, b_cols, ldc, accumulate,
                                  threads] = k;
    std::optional<entry> made;
    try {
      dnnl::primitive_attr attr;
      if (accumulate) {
        dnnl::post_ops sum;
        sum.append_sum(1.0f);
        attr.set_post_ops(sum);
      }
      const auto pd = primitive_description(descriptor(a_type, M, K, a_rows, a_cols), b,
                                            descriptor(c_type, M, N, ldc, 1), attr);
      made = entry{dnnl::matmul(pd), pd.impl_info_str(), b};
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
