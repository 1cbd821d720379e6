// CUDA softmax cross-entropy (formulas in difftx/ops/cross_entropy.hpp), in
// the accumulation type (float, or double for float64).
//
// Targets live in device memory (token_t) and are checked as the reference
// checks them (each < V; negative: ignored) by the scan of
// policy/cuda/embedding.cuh, which also counts the targets >= 0 (K): one
// 16-byte download per call, before anything is written.
//   forward : one block per row: max, sum of exponentials, lse and the row's
//             loss (lse - z[t], or 0 for t < 0); then one block sums the rows'
//             losses in a fixed order (deterministic) and divides by K.
//   backward: one thread per logit, dz = dloss / K · (softmax - one-hot).
#pragma once

#include <climits>
#include <string>

#include "difftx/ops/cross_entropy.hpp"
#include "difftx/policy/cuda/device_types.cuh"
#include "difftx/policy/cuda/elementwise.cuh"
#include "difftx/policy/cuda/embedding.cuh"
#include "difftx/policy/cuda/tag.cuh"

namespace difftx {

namespace cuda_detail {

constexpr unsigned cross_entropy_threads = 256;

// op-reduction over a block of cross_entropy_threads threads; every thread gets the result.
template <class A, class Op>
__device__ __forceinline__ A cross_entropy_block_reduce(A x, Op op) {
  __shared__ A partial[cross_entropy_threads / 32];
  for (int offset = 16; offset > 0; offset /= 2) x = op(x, __shfl_xor_sync(0xffffffffu, x, offset));
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = x;
  __syncthreads();
  A total = partial[0];
  for (unsigned w = 1; w < cross_entropy_threads / 32; ++w) total = op(total, partial[w]);
  return total;
}

// Row m of logits [M, V]: lse[m], and row_loss[m] = lse[m] - z[m, t_m] (0 where t_m < 0).
template <class DT, class A = device_accum_t<DT>>
__global__ void __launch_bounds__(cross_entropy_threads)
    cross_entropy_rows_kernel(const DT* logits, const token_t* targets, long long V, A* lse, A* row_loss) {
  const long long m = blockIdx.x;
  const DT* z = logits + m * V;
  A row_max = lowest_of<A>();
  for (long long v = threadIdx.x; v < V; v += blockDim.x) row_max = max_of(row_max, to_accum(z[v]));
  row_max = cross_entropy_block_reduce(row_max, [](A a, A b) { return max_of(a, b); });
  A sum = 0;
  for (long long v = threadIdx.x; v < V; v += blockDim.x) sum += exp_of(to_accum(z[v]) - row_max);
  sum = cross_entropy_block_reduce(sum, [](A a, A b) { return a + b; });
  if (threadIdx.x == 0) {
    const A row_lse = row_max + log_of(sum);
    const token_t t = targets[m];
    lse[m] = row_lse;
    row_loss[m] = t >= 0 ? row_lse - to_accum(z[t]) : A(0);
  }
}

// loss[0] = (sum of row_loss) / count, or 0 when count = 0; one block, fixed order.
template <class A>
__global__ void __launch_bounds__(cross_entropy_threads)
    cross_entropy_loss_kernel(const A* row_loss, long long M, long long count, A* loss) {
  A total = 0;
  for (long long m = threadIdx.x; m < M; m += blockDim.x) total += row_loss[m];
  total = cross_entropy_block_reduce(total, [](A a, A b) { return a + b; });
  if (threadIdx.x == 0) loss[0] = count > 0 ? total / static_cast<A>(count) : A(0);
}

}  // namespace cuda_detail

// logits[M, V], targets[M] -> loss[1] (mean over rows with a target >= 0), lse[M].
// No output has type T, so callers name it: cross_entropy_forward<T>(policy, ...).
template <class T>
  requires supported_by<policy::cuda, T>
void cross_entropy_forward(const policy::cuda& p, cview<T, 2> logits, cview<token_t, 1> targets,
                           TensorView<accum_t<T>, 1> loss, TensorView<accum_t<T>, 1> lse) {
  using namespace cuda_detail;
  constexpr std::string_view where = "cross_entropy_forward";
  detail::check_cross_entropy(where, memory_space::device, logits, targets, loss, lse);
  require(logits.extent(0) <= INT_MAX, where, "logits",
          "at most " + std::to_string(INT_MAX) + " rows on the CUDA policy",
          std::to_string(logits.extent(0)) + " rows");
  const index_t count = cuda_detail::check_token_range(p, where, "targets", targets, logits.extent(1), true);
  using A = accum_t<T>;
  static_assert(std::is_same_v<A, device_accum_t<device_t<T>>>, "loss and lse are in the kernels' accumulation type");
  const index_t M = logits.extent(0), V = logits.extent(1);
  Tensor<A, 1> row_loss({M}, p.memory());
  cross_entropy_rows_kernel<<<static_cast<unsigned>(M), cross_entropy_threads, 0, p.stream()>>>(
      device_pointer(logits.data()), targets.data(), V, lse.data(), row_loss.data());
  DIFFTX_CUDA_CHECK(cudaGetLastError());
  cross_entropy_loss_kernel<<<1, cross_entropy_threads, 0, p.stream()>>>(row_loss.data(), M, count, loss.data());
  DIFFTX_CUDA_CHECK(cudaGetLastError());
}

// dloss (the gradient at loss[0]) -> dlogits[M, V] (assign)
template <class T>
  requires supported_by<policy::cuda, T>
void cross_entropy_backward(const policy::cuda& p, cview<T, 2> logits, cview<token_t, 1> targets,
                            cview<accum_t<T>, 1> lse, double dloss, TensorView<T, 2> dlogits) {
  using namespace cuda_detail;
  constexpr std::string_view where = "cross_entropy_backward";
  detail::check_cross_entropy_backward(where, memory_space::device, logits, targets, lse, dlogits);
  const index_t count = cuda_detail::check_token_range(p, where, "targets", targets, logits.extent(1), true);
  using A = accum_t<T>;
  using DT = device_t<T>;
  const A scale = count > 0 ? static_cast<A>(dloss / static_cast<double>(count)) : A(0);
  const long long V = logits.extent(1);
  const DT* zp = device_pointer(logits.data());
  const token_t* tp = targets.data();
  const A* lsep = lse.data();
  DT* dzp = device_pointer(dlogits.data());
  launch_for_each(p, dlogits.size(), [=] __device__(long long e) {
    const long long m = e / V, v = e % V;
    const token_t t = tp[m];
    if (t < 0) {
      dzp[e] = from_accum<DT>(A(0));
      return;
    }
    const A prob = exp_of(to_accum(zp[e]) - lsep[m]);
    dzp[e] = from_accum<DT>(scale * (v == t ? prob - A(1) : prob));
  });
}

}  // namespace difftx
