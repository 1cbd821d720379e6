// Floating-point operation counts for the benchmark counters: a multiply-add
// is 2 FLOPs; element-wise work (softmax, norms, RoPE, SwiGLU gate) is not
// counted. Attention counts only the query/key pairs a causal kernel must
// visit, N (N + 1) / 2 per head, and its backward only the products the
// gradients need (not the recomputation of the scores), so GFLOP/s are
// conservative.
#pragma once

#include <cstdint>

namespace difftx_bench {

inline double pairs(double n, bool causal) { return causal ? n * (n + 1) / 2 : n * n; }

// y[M, N] = x[M, K] w[N, K]^T; the backward does two such products.
inline double linear_forward(double m, double n, double k) { return 2 * m * n * k; }
inline double linear_backward(double m, double n, double k) { return 4 * m * n * k; }

// Attention with `maps` maps of head size d per head, value size dv, `heads` heads.
//   forward : per pair and map, S = q·k (2d) and P·V (2dv)
//   backward: per pair, dV (2dv) and dP (2dv); per map, dQ (2d) and dK (2d)
inline double attention_forward(double batch, double heads, double n, int maps, double d, double dv, bool causal) {
  return batch * heads * pairs(n, causal) * maps * (2 * d + 2 * dv);
}
inline double attention_backward(double batch, double heads, double n, int maps, double d, double dv, bool causal) {
  return batch * heads * pairs(n, causal) * (4 * dv + maps * 4 * d);
}

// MultiHead (differential, h heads, g groups, half head size D) and the
// baseline Attention (H heads of size D): projections plus attention.
inline double multihead_forward(double b, double n, double c, double h, double g, double D, bool causal) {
  const double tokens = b * n;
  return linear_forward(tokens, 2 * h * D + 4 * g * D, c) + linear_forward(tokens, c, 2 * h * D) +
         attention_forward(b, h, n, 2, D, 2 * D, causal);
}
inline double multihead_backward(double b, double n, double c, double h, double g, double D, bool causal) {
  const double tokens = b * n;
  return linear_backward(tokens, 2 * h * D + 4 * g * D, c) + linear_backward(tokens, c, 2 * h * D) +
         attention_backward(b, h, n, 2, D, 2 * D, causal);
}
inline double baseline_forward(double b, double n, double c, double H, double G, double D, bool causal) {
  const double tokens = b * n;
  return linear_forward(tokens, H * D + 2 * G * D, c) + linear_forward(tokens, c, H * D) +
         attention_forward(b, H, n, 1, D, D, causal);
}
inline double baseline_backward(double b, double n, double c, double H, double G, double D, bool causal) {
  const double tokens = b * n;
  return linear_backward(tokens, H * D + 2 * G * D, c) + linear_backward(tokens, c, H * D) +
         attention_backward(b, H, n, 1, D, D, causal);
}
// Differential attention V2 (h output heads of D, 2h query heads, g groups):
// q, k, v and lambda_proj (h outputs), o_proj from hD, one attention of 2h heads.
inline double multihead_v2_forward(double b, double n, double c, double h, double g, double D, bool causal) {
  const double tokens = b * n;
  return linear_forward(tokens, 2 * h * D + 2 * g * D + h, c) + linear_forward(tokens, c, h * D) +
         attention_forward(b, 2 * h, n, 1, D, D, causal);
}
inline double multihead_v2_backward(double b, double n, double c, double h, double g, double D, bool causal) {
  const double tokens = b * n;
  return linear_backward(tokens, 2 * h * D + 2 * g * D + h, c) + linear_backward(tokens, c, h * D) +
         attention_backward(b, 2 * h, n, 1, D, D, causal);
}
// DecoderLayer: MultiHead plus SwiGLU's three projections.
inline double decoder_forward(double b, double n, double c, double h, double g, double D, double f, bool causal) {
  return multihead_forward(b, n, c, h, g, D, causal) + 3 * linear_forward(b * n, f, c);
}
inline double decoder_backward(double b, double n, double c, double h, double g, double D, double f, bool causal) {
  return multihead_backward(b, n, c, h, g, D, causal) + 3 * linear_backward(b * n, f, c);
}
// BaselineLayer: the baseline Attention (H heads of D) plus SwiGLU's three projections.
inline double baseline_layer_forward(double b, double n, double c, double H, double G, double D, double f, bool causal) {
  return baseline_forward(b, n, c, H, G, D, causal) + 3 * linear_forward(b * n, f, c);
}
inline double baseline_layer_backward(double b, double n, double c, double H, double G, double D, double f, bool causal) {
  return baseline_backward(b, n, c, H, G, D, causal) + 3 * linear_backward(b * n, f, c);
}

}  // namespace difftx_bench
