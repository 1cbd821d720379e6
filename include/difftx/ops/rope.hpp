// Rotary position embedding, interleaved pairs, applied in place to every
// vector of size d in x[B, N, V, d] (V vectors per token: 2h query halves or
// 2g key halves). Token n of every batch row sits at position p = offset + n.
//   forward : (x[2i], x[2i+1]) <- (x[2i] c - x[2i+1] s, x[2i] s + x[2i+1] c),
//             c = cos a, s = sin a, a = p · f_i, f_i = rope_inverse_frequency(theta, scaling, i, d);
//             or, given a rope_table, c = table.cos(p, i), s = table.sin(p, i) as they are
//   backward: the transpose of [[c, -s], [s, c]] is the same with -s, so dx is
//             the forward applied to dy with s negated (also in place).
// The frequencies of each scaling (transformers' rope_type) are in
// docs/semantics.md, "RoPE frequencies".
#pragma once

#include <cmath>
#include <numbers>
#include <string>

#include "difftx/ops/common.hpp"

// Host and device: the CUDA policy computes each pair's frequency in its kernel.
#if defined(__CUDACC__)
#define DIFFTX_HOST_DEVICE __host__ __device__
#else
#define DIFFTX_HOST_DEVICE
#endif

namespace difftx {

enum class rope_type {
  standard,  // transformers' "default": f_i = theta^(-2i/d)
  linear,    // f_i / factor (positions divided by factor)
  llama3,    // long wavelengths divided by factor, short ones kept, a smooth blend between
};

struct rope_scaling {
  rope_type type = rope_type::standard;
  double factor = 1.0;                          // linear, llama3
  double low_freq_factor = 1.0;                 // llama3
  double high_freq_factor = 4.0;                // llama3
  double original_max_positions = 8192.0;       // llama3: original_max_position_embeddings

  friend bool operator==(const rope_scaling&, const rope_scaling&) = default;
};

inline const char* rope_type_name(rope_type t) noexcept {
  return t == rope_type::llama3 ? "llama3" : t == rope_type::linear ? "linear" : "default";
}

// f_i, pair i of a vector of size d, in double whatever the tensor's type.
DIFFTX_HOST_DEVICE inline double rope_inverse_frequency(double theta, const rope_scaling& s, index_t i, index_t d) {
  const double f = ::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
  if (s.type == rope_type::linear) return f / s.factor;
  if (s.type != rope_type::llama3) return f;
  const double wavelength = 2.0 * std::numbers::pi / f;
  if (wavelength > s.original_max_positions / s.low_freq_factor) return f / s.factor;
  if (wavelength < s.original_max_positions / s.high_freq_factor) return f;
  const double smooth =
      (s.original_max_positions / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1.0 - smooth) * f / s.factor + smooth * f;
}

namespace detail {

// What rope_inverse_frequency needs of its parameters, named as the caller
// calls them (a module: "config.rope_theta", "config.rope_scaling").
// The argument names and messages are built only for a failure: a decode
// step checks every layer's parameters (formatting them cost 1% of a step).
inline void check_rope_parameters(std::string_view where, std::string_view theta_key, double theta,
                                  std::string_view key, const rope_scaling& s) {
  const auto named = [key](const char* name) { return [key, name] { return std::string(key) + "." + name; }; };
  const auto text = [](double v) { return [v] { return std::to_string(v); }; };
  const auto finite_positive = [&](double v, const char* name, const char* expected) {
    require(v > 0 && std::isfinite(v), where, named(name), expected, text(v));
  };
  require(theta > 0 && std::isfinite(theta), where, theta_key, "a finite theta > 0", text(theta));
  finite_positive(s.factor, "factor", "a finite scaling factor > 0");
  if (s.type == rope_type::standard)
    require(s.factor == 1.0, where, named("factor"), "1 (the default RoPE does not scale; use rope_type::linear)",
            text(s.factor));
  if (s.type != rope_type::llama3) return;
  finite_positive(s.low_freq_factor, "low_freq_factor", "a finite low_freq_factor > 0");
  finite_positive(s.original_max_positions, "original_max_positions", "a finite original context length > 0");
  require(s.high_freq_factor > s.low_freq_factor && std::isfinite(s.high_freq_factor), where, named("high_freq_factor"),
          [&] { return "a finite high_freq_factor > low_freq_factor (" + std::to_string(s.low_freq_factor) + ")"; },
          text(s.high_freq_factor));
}

// What every RoPE call needs of x and the offset.
template <class X>
void check_rope_vectors(std::string_view where, memory_space space, const X& x, const char* x_name, index_t offset) {
  require_nonempty(where, x_name, x);
  require(x.extent(3) % 2 == 0, where, x_name, "an even vector size d (interleaved pairs)",
          [&] { return "d = " + std::to_string(x.extent(3)); });
  require(offset >= 0, where, "offset", "a position offset >= 0", [&] { return std::to_string(offset); });
  require_all_in(where, space, {{x_name, x.space()}});
}

template <class X>
void check_rope(std::string_view where, memory_space space, const X& x, const char* x_name, index_t offset,
                double theta, const rope_scaling& scaling) {
  check_rope_vectors(where, space, x, x_name, offset);
  check_rope_parameters(where, "theta", theta, "scaling", scaling);
}

}  // namespace detail

// Caller-given rotation tables, the (cos, sin) pair of FlashAttention's
// apply_rotary_emb and the Differential Transformer's rel_pos: cos and sin
// [P, d/2] in the accumulation type, row p for position p. They are read as
// given, not recomputed from a theta, so any rotation (another frequency
// rule, tables rounded to a storage type) is applied exactly as the caller's
// own code applies it. Empty: the caller gives none.
template <class A>
struct rope_table {
  TensorView<const A, 2> cos, sin;
  bool empty() const noexcept { return cos.empty(); }
  index_t positions() const noexcept { return cos.extent(0); }
};

namespace detail {

// A table's shapes against x [B, N, V, d] at offset: [P, d/2] each, P >= offset + N.
template <class X, class A>
void check_rope(std::string_view where, memory_space space, const X& x, const char* x_name, index_t offset,
                const rope_table<A>& table) {
  check_rope_vectors(where, space, x, x_name, offset);
  const index_t half = x.extent(3) / 2, needed = offset + x.extent(1);
  require(table.cos.extent(1) == half && table.cos.extent(0) >= needed, where, "table.cos",
          [&] { return "shape [P, " + std::to_string(half) + "] with P >= " + std::to_string(needed); },
          [&] { return shape_string(table.cos.shape()); });
  require_shape(where, "table.sin", table.sin, table.cos.shape());
  require_all_in(where, space, {{"table.cos", table.cos.space()}, {"table.sin", table.sin.space()}});
}

}  // namespace detail
}  // namespace difftx
