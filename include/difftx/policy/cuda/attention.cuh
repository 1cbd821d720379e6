// CUDA attention forward/backward (formulas and shapes in
// difftx/ops/attention.hpp): the tensor-core kernels (attention_mma.cuh) for
// float16 and bfloat16 with d = 64 or 128, the CUDA-core kernels
// (attention_simt.cuh) for float32, float64 (in double throughout) and the
// other head sizes up to 128. lambda, lse, rowsum and dλ are in the
// accumulation type accum_t<T> (float, or double for float64).
#pragma once

#include <cmath>

#include "difftx/core/tensor.hpp"
#include "difftx/ops/attention.hpp"
#include "difftx/policy/cuda/attention_cudnn.cuh"
#include "difftx/policy/cuda/attention_mma.cuh"
#include "difftx/policy/cuda/attention_simt.cuh"
#include "difftx/policy/cuda/elementwise.cuh"
#include "difftx/policy/cuda/tag.cuh"

namespace difftx {

namespace cuda_detail {

template <class Q, class K, class V>
attention_shape shape_of(const Q& q, const K& k, const V& v, bool causal) {
  const int d = static_cast<int>(q.extent(4));
  return {static_cast<int>(q.extent(0)), static_cast<int>(q.extent(1)), static_cast<int>(q.extent(2)),
          static_cast<int>(k.extent(2)), d, static_cast<int>(v.extent(3)), causal,
          1.0f / std::sqrt(static_cast<float>(d)), 1.0 / std::sqrt(static_cast<double>(d))};
}

template <class T>
constexpr bool has_tensor_cores = std::is_same_v<T, Eigen::half> || std::is_same_v<T, Eigen::bfloat16>;

// Counts what ran an attention call in the context (attention_path.hpp).
inline void record(const policy::cuda& p, attention_path path) {
  p.context->attention_calls[static_cast<std::size_t>(path)].fetch_add(1, std::memory_order_relaxed);
}

// Whether the policy asks for cuDNN and the call is one it may take.
template <class T>
bool try_cudnn(const policy::cuda& p, const attention_shape& s, std::initializer_list<const void*> tensors) {
  return cudnn_applies(p.attention, has_tensor_cores<T>, p.context->compute_major, s.d, s.dv, tensors);
}

// Raises a kernel's dynamic shared-memory limit to `bytes` (above the default 48 KiB).
template <class Kernel>
void allow_shared_memory(Kernel kernel, std::size_t bytes) {
  DIFFTX_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// The CUDA policy's head sizes: d <= 128 (difftx's kernels' tiles).
template <class Q>
void require_head_size(std::string_view where, const Q& q) {
  require(q.extent(4) <= 128, where, "q", "a head size d <= 128 on the CUDA policy", "d = " + std::to_string(q.extent(4)));
}

// What the CUDA kernels take of the op's shapes (ops/attention.hpp allows
// more, which the CPU policies run): as many keys as queries, and one lambda
// for every head. Their kernels and cuDNN's graphs index keys by the query
// count and read lambda[0]; the general case waits for a session with a GPU.
template <class Q, class K, class L>
void require_square_shared_lambda(std::string_view where, const Q& q, const K& k, const L& lambda) {
  require(k.extent(1) == q.extent(1), where, "k", "as many keys as queries (M = N) on the CUDA policy",
          [&] { return "M = " + std::to_string(k.extent(1)) + ", N = " + std::to_string(q.extent(1)); });
  require(lambda.extent(0) <= 1, where, "lambda", "shape [1] (one for every head) on the CUDA policy",
          [&] { return shape_string(lambda.shape()); });
}

// Whether a packed call goes to cuDNN's ragged layout: asked for
// (policy.cudnn_ragged), and two sequences or more.
inline bool ragged_requested(const policy::cuda& p, sequence_offsets sequences) {
  return p.cudnn_ragged && sequences.size() >= 3;
}
// A packed call's own checks, as the per-sequence calls would make them.
template <class Q>
void check_packed_call(std::string_view where, const Q& q, sequence_offsets sequences) {
  detail::check_sequence_offsets(where, "q", q, sequences);
  require_head_size(where, q);
}

}  // namespace cuda_detail

// q [B,N,H,Maps,d], k [B,N,G,Maps,d], v [B,N,G,dv], lambda [1] (Maps = 2)
//   -> o [B,N,H,dv]; saved o2 [B,N,H,dv] (Maps = 2), lse [B,H,Maps,N]
// (the CUDA kernels' part of ops/attention.hpp: M = N, one lambda)
template <int Maps, class T>
  requires supported_by<policy::cuda, T>
void attention_forward(const policy::cuda& p, cview<T, 5> q, cview<T, 5> k, cview<T, 4> v,
                       cview<accum_t<T>, 1> lambda, bool causal, TensorView<T, 4> o, TensorView<T, 4> o2,
                       TensorView<accum_t<T>, 4> lse) {
  using namespace cuda_detail;
  using DT = device_t<T>;
  using A = accum_t<T>;
  static_assert(std::is_same_v<A, device_accum_t<DT>>, "lambda and lse are in the kernels' accumulation type");
  constexpr std::string_view where = "attention_forward";
  detail::check_attention<Maps>(where, memory_space::device, q, k, v, lambda, causal, o, o2, lse, "o");
  require_head_size(where, q);
  require_square_shared_lambda(where, q, k, lambda);
  require_attention_available(where, p.attention, built_with_cudnn);
  const auto s = shape_of(q, k, v, causal);
#if defined(DIFFTX_CUDNN)
  if constexpr (has_tensor_cores<T>)
    if (try_cudnn<T>(p, s, {q.data(), k.data(), v.data(), o.data(), Maps == 2 ? o2.data() : o.data()}) &&
        cudnn_attention_forward<Maps>(p, s, {}, q.data(), k.data(), v.data(), Maps == 2 ? lambda.data() : nullptr, o.data(),
                                      Maps == 2 ? o2.data() : nullptr, lse.data()))
      return record(p, attention_path::cudnn);
#endif
  const auto* qp = device_pointer(q.data());
  const auto* kp = device_pointer(k.data());
  const auto* vp = device_pointer(v.data());
  auto* op = device_pointer(o.data());
  auto* o2p = Maps == 2 ? device_pointer(o2.data()) : nullptr;
  const A* lam = Maps == 2 ? lambda.data() : nullptr;
  if constexpr (has_tensor_cores<T>) {
    if (own_attention_path(true, s.d) == attention_path::tensor_cores) {
      auto launch = [&](auto head) {
        constexpr int D = decltype(head)::value;
        auto kernel = attention_forward_mma<Maps, D, DT>;
        constexpr std::size_t bytes = forward_mma_shared_bytes<Maps, D>();
        allow_shared_memory(kernel, bytes);
        kernel<<<dim3((s.N + mma_block - 1) / mma_block, s.H, s.B), mma_config<Maps, D>::threads, bytes, p.stream()>>>(
            qp, kp, vp, lam, s, op, o2p, lse.data());
      };
      if (s.d == 64)
        launch(std::integral_constant<int, 64>{});
      else
        launch(std::integral_constant<int, 128>{});
      DIFFTX_CUDA_CHECK(cudaGetLastError());
      return record(p, attention_path::tensor_cores);
    }
  }
  record(p, attention_path::cuda_cores);
  const dim3 grid((s.N + simt_rows - 1) / simt_rows, s.H, s.B);
  if (s.d <= 32)
    attention_forward_simt<Maps, 32, DT><<<grid, 128, 0, p.stream()>>>(qp, kp, vp, lam, s, op, o2p, lse.data());
  else
    attention_forward_simt<Maps, 128, DT><<<grid, 128, 0, p.stream()>>>(qp, kp, vp, lam, s, op, o2p, lse.data());
  DIFFTX_CUDA_CHECK(cudaGetLastError());
}

// do [B,N,H,dv] -> dq [B,N,H,Maps,d], dk [B,N,G,Maps,d], dv [B,N,G,dv], dlambda [1] (all assigned)
template <int Maps, class T>
  requires supported_by<policy::cuda, T>
void attention_backward(const policy::cuda& p, cview<T, 5> q, cview<T, 5> k, cview<T, 4> v,
                        cview<accum_t<T>, 1> lambda, bool causal, cview<T, 4> o, cview<T, 4> o2,
                        cview<accum_t<T>, 4> lse, cview<T, 4> d_o, TensorView<T, 5> dq, TensorView<T, 5> dk,
                        TensorView<T, 4> dv, TensorView<accum_t<T>, 1> dlambda) {
  using namespace cuda_detail;
  using DT = device_t<T>;
  using A = accum_t<T>;
  static_assert(std::is_same_v<A, device_accum_t<DT>>, "lambda, lse and dlambda are in the kernels' accumulation type");
  constexpr std::string_view where = "attention_backward";
  detail::check_attention_backward<Maps>(where, memory_space::device, q, k, v, lambda, causal, o, o2, lse, d_o, dq, dk,
                                         dv, dlambda);
  require_head_size(where, q);
  require_square_shared_lambda(where, q, k, lambda);
  require_attention_available(where, p.attention, built_with_cudnn);
  const auto s = shape_of(q, k, v, causal);
#if defined(DIFFTX_CUDNN)
  if constexpr (has_tensor_cores<T>)
    if (try_cudnn<T>(p, s, {q.data(), k.data(), v.data(), o.data(), d_o.data(), dq.data(), dk.data(), dv.data(),
                            Maps == 2 ? o2.data() : o.data()}) &&
        cudnn_attention_backward<Maps>(p, s, {}, q.data(), k.data(), v.data(), Maps == 2 ? lambda.data() : nullptr,
                                       o.data(), Maps == 2 ? o2.data() : nullptr, lse.data(), d_o.data(), dq.data(),
                                       dk.data(), dv.data(), Maps == 2 ? dlambda.data() : nullptr))
      return record(p, attention_path::cudnn);
#endif
  const auto* qp = device_pointer(q.data());
  const auto* kp = device_pointer(k.data());
  const auto* vp = device_pointer(v.data());
  const auto* dop = device_pointer(d_o.data());
  const A* lam = Maps == 2 ? lambda.data() : nullptr;

  // rowsum(dO ⊙ O_m), in A, and dλ: from the rows' O_2 on CUDA cores, from
  // P_2 in float on the tensor cores (attention_mma.cuh says why)
  Tensor<A, 4> rowsum({s.B, s.H, Maps, s.N}, p.memory());
  A* dlam = nullptr;
  if constexpr (Maps == 2) {
    dlam = dlambda.data();
    DIFFTX_CUDA_CHECK(cudaMemsetAsync(dlam, 0, sizeof(A), p.stream()));
  }
  bool tensor_cores = false;
  if constexpr (has_tensor_cores<T>) tensor_cores = own_attention_path(true, s.d) == attention_path::tensor_cores;
  const long long rows = static_cast<long long>(s.B) * s.N * s.H;
  attention_rowsums<Maps, DT><<<blocks_for(rows, 8), 256, 0, p.stream()>>>(
      device_pointer(o.data()), Maps == 2 ? device_pointer(o2.data()) : nullptr, dop, lam, s, rowsum.data(),
      tensor_cores ? nullptr : dlam);
  DIFFTX_CUDA_CHECK(cudaGetLastError());

  if constexpr (has_tensor_cores<T>) {
    if (tensor_cores) {
      Tensor<float, 5> dq_accum(dq.shape(), p.memory());  // zeroed; blocks add their part
      auto launch = [&](auto head) {
        constexpr int D = decltype(head)::value;
        auto kernel = attention_backward_mma<Maps, D, DT>;
        constexpr std::size_t bytes = backward_mma_shared_bytes<Maps, D>();
        allow_shared_memory(kernel, bytes);
        kernel<<<dim3((s.N + mma_block - 1) / mma_block, s.G, s.B), mma_config<Maps, D>::threads, bytes, p.stream()>>>(
            qp, kp, vp, dop, lse.data(), rowsum.data(), lam, s, device_pointer(dk.data()), device_pointer(dv.data()),
            dq_accum.data(), dlam);
      };
      if (s.d == 64)
        launch(std::integral_constant<int, 64>{});
      else
        launch(std::integral_constant<int, 128>{});
      DIFFTX_CUDA_CHECK(cudaGetLastError());
      const float* accumulated = dq_accum.data();
      DT* dqp = device_pointer(dq.data());
      launch_for_each(p, dq.size(), [=] __device__(long long i) { dqp[i] = from_float<DT>(accumulated[i]); });
      return record(p, attention_path::tensor_cores);
    }
  }
  record(p, attention_path::cuda_cores);
  auto launch_simt = [&](auto max_d) {
    constexpr int MaxD = decltype(max_d)::value;
    attention_backward_dkdv_simt<Maps, MaxD, DT><<<dim3((s.N + simt_rows - 1) / simt_rows, s.G, s.B), 128, 0, p.stream()>>>(
        qp, kp, vp, dop, lse.data(), rowsum.data(), lam, s, device_pointer(dk.data()), device_pointer(dv.data()));
    DIFFTX_CUDA_CHECK(cudaGetLastError());
    attention_backward_dq_simt<Maps, MaxD, DT><<<dim3((s.N + simt_rows - 1) / simt_rows, s.H, s.B), 128, 0, p.stream()>>>(
        qp, kp, vp, dop, lse.data(), rowsum.data(), lam, s, device_pointer(dq.data()));
    DIFFTX_CUDA_CHECK(cudaGetLastError());
  };
  if (s.d <= 32)
    launch_simt(std::integral_constant<int, 32>{});
  else
    launch_simt(std::integral_constant<int, 128>{});
}

#if defined(DIFFTX_CUDNN)
// A packed batch (q [1, total, H, Maps, d], sequences = its cu_seqlens) in one
// cuDNN call per map through its ragged layout (attention_cudnn.cuh), where
// the policy asks for it (policy.cudnn_ragged) and cuDNN takes the shape.
// false: nothing written; the caller runs attention_forward on each sequence
// (ops/attention.hpp). Without cuDNN, that generic false is all there is.
template <int Maps, class T>
  requires supported_by<policy::cuda, T>
bool attention_forward_packed(const policy::cuda& p, cview<T, 5> q, cview<T, 5> k, cview<T, 4> v,
                              cview<accum_t<T>, 1> lambda, bool causal, TensorView<T, 4> o, TensorView<T, 4> o2,
                              TensorView<accum_t<T>, 4> lse, sequence_offsets sequences) {
  using namespace cuda_detail;
  if constexpr (!has_tensor_cores<T>) {
    return false;
  } else {
    if (!ragged_requested(p, sequences)) return false;
    constexpr std::string_view where = "attention_forward";
    detail::check_attention<Maps>(where, memory_space::device, q, k, v, lambda, causal, o, o2, lse, "o");
    check_packed_call(where, q, sequences);
    require_square_shared_lambda(where, q, k, lambda);
    const auto s = shape_of(q, k, v, causal);
    if (!try_cudnn<T>(p, s, {q.data(), k.data(), v.data(), o.data(), Maps == 2 ? o2.data() : o.data()}) ||
        !cudnn_attention_forward<Maps>(p, s, sequences, q.data(), k.data(), v.data(),
                                       Maps == 2 ? lambda.data() : nullptr, o.data(), Maps == 2 ? o2.data() : nullptr,
                                       lse.data()))
      return false;
    record(p, attention_path::cudnn_ragged);
    return true;
  }
}

// The backward of attention_forward_packed: dq, dk, dv and dlambda (Maps = 2)
// assigned over the whole batch, or false with nothing written (values wider
// than ragged_backward_max_dv among the cases).
template <int Maps, class T>
  requires supported_by<policy::cuda, T>
bool attention_backward_packed(const policy::cuda& p, cview<T, 5> q, cview<T, 5> k, cview<T, 4> v,
                               cview<accum_t<T>, 1> lambda, bool causal, cview<T, 4> o, cview<T, 4> o2,
                               cview<accum_t<T>, 4> lse, cview<T, 4> d_o, TensorView<T, 5> dq, TensorView<T, 5> dk,
                               TensorView<T, 4> dv, TensorView<accum_t<T>, 1> dlambda, sequence_offsets sequences) {
  using namespace cuda_detail;
  if constexpr (!has_tensor_cores<T>) {
    return false;
  } else {
    if (!ragged_requested(p, sequences) || v.extent(3) > ragged_backward_max_dv) return false;
    constexpr std::string_view where = "attention_backward";
    detail::check_attention_backward<Maps>(where, memory_space::device, q, k, v, lambda, causal, o, o2, lse, d_o, dq,
                                           dk, dv, dlambda);
    check_packed_call(where, q, sequences);
    require_square_shared_lambda(where, q, k, lambda);
    const auto s = shape_of(q, k, v, causal);
    if (!try_cudnn<T>(p, s, {q.data(), k.data(), v.data(), o.data(), d_o.data(), dq.data(), dk.data(), dv.data(),
                             Maps == 2 ? o2.data() : o.data()}) ||
        !cudnn_attention_backward<Maps>(p, s, sequences, q.data(), k.data(), v.data(),
                                        Maps == 2 ? lambda.data() : nullptr, o.data(), Maps == 2 ? o2.data() : nullptr,
                                        lse.data(), d_o.data(), dq.data(), dk.data(), dv.data(),
                                        Maps == 2 ? dlambda.data() : nullptr))
      return false;
    record(p, attention_path::cudnn_ragged);
    return true;
  }
}
#endif  // DIFFTX_CUDNN

}  // namespace difftx
