// simd SwiGLU gate (formulas in difftx/ops/swiglu.hpp), elementwise over all
// M·F entries in chunks per thread.
#pragma once

#include <vector>

#include "difftx/ops/swiglu.hpp"
#include "difftx/policy/simd/common.hpp"

namespace difftx {

namespace simd_detail {
template <class A>
vec<A> sigmoid(const vec<A>& z) {
  return vec<A>(A(1)) / (vec<A>(A(1)) + exponential(-z));
}
}  // namespace simd_detail

// h[M, F] = swish(g) ⊙ u
template <class T>
  requires supported_by<policy::simd, T>
void swiglu_gate_forward(const policy::simd& p, cview<T, 2> g, cview<T, 2> u, TensorView<T, 2> h) {
  using namespace simd_detail;
  using A = accum_t<T>;
  constexpr std::string_view where = "swiglu_gate_forward";
  detail::check_swiglu_gate(where, memory_space::host, g, u, h, "h");
  constexpr index_t W = vec<A>::size, chunk = 1024;
  parallel_chunks(p, g.size(), chunk, [&](index_t begin, index_t end) {
    A g_chunk[chunk], u_chunk[chunk], h_chunk[chunk];
    const index_t n = end - begin;
    const A* gs = chunk_as_accum(g.data() + begin, n, g_chunk);
    const A* us = chunk_as_accum(u.data() + begin, n, u_chunk);
    A* hs = output_chunk(h.data() + begin, h_chunk);
    index_t i = 0;
    for (; i + W <= n; i += W) {
      const auto z = vec<A>::load_unaligned(gs + i);
      (z * sigmoid(z) * vec<A>::load_unaligned(us + i)).store_unaligned(hs + i);
    }
    for (; i < n; ++i) hs[i] = gs[i] / (A(1) + std::exp(-gs[i])) * us[i];
    if (hs == h_chunk) from_accum(hs, n, h.data() + begin);
  });
}

// dh[M, F] -> dg, du (assign)
template <class T>
  requires supported_by<policy::simd, T>
void swiglu_gate_backward(const policy::simd& p, cview<T, 2> g, cview<T, 2> u, cview<T, 2> dh, TensorView<T, 2> dg,
                          TensorView<T, 2> du) {
  using namespace simd_detail;
  using A = accum_t<T>;
  constexpr std::string_view where = "swiglu_gate_backward";
  detail::check_swiglu_gate_backward(where, memory_space::host, g, u, dh, dg, du);
  constexpr index_t W = vec<A>::size, chunk = 1024;
  parallel_chunks(p, g.size(), chunk, [&](index_t begin, index_t end) {
    A g_chunk[chunk], u_chunk[chunk], dh_chunk[chunk], dg_chunk[chunk], du_chunk[chunk];
    const index_t n = end - begin;
    const A* gs = chunk_as_accum(g.data() + begin, n, g_chunk);
    const A* us = chunk_as_accum(u.data() + begin, n, u_chunk);
    const A* dhs = chunk_as_accum(dh.data() + begin, n, dh_chunk);
    A* dgs = output_chunk(dg.data() + begin, dg_chunk);
    A* dus = output_chunk(du.data() + begin, du_chunk);
    const vec<A> one(A(1));
    index_t i = 0;
    for (; i + W <= n; i += W) {
      const auto z = vec<A>::load_unaligned(gs + i), grad = vec<A>::load_unaligned(dhs + i);
      const auto sig = sigmoid(z);
      (grad * vec<A>::load_unaligned(us + i) * sig * multiply_add(z, one - sig, one)).store_unaligned(dgs + i);
      (grad * z * sig).store_unaligned(dus + i);
    }
    for (; i < n; ++i) {
      const A sig = A(1) / (A(1) + std::exp(-gs[i]));
      dgs[i] = dhs[i] * us[i] * sig * (A(1) + gs[i] * (A(1) - sig));
      dus[i] = dhs[i] * gs[i] * sig;
    }
    if (dgs == dg_chunk) from_accum(dgs, n, dg.data() + begin);
    if (dus == du_chunk) from_accum(dus, n, du.data() + begin);
  });
}

}  // namespace difftx
