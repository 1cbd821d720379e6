// Rotary position embedding, interleaved pairs, applied in place to every
// vector of size d in x[B, N, V, d] (V vectors per token: 2h query halves or
// 2g key halves). Token n of every batch row sits at position p = offset + n.
//   forward : (x[2i], x[2i+1]) <- (x[2i] cos a - x[2i+1] sin a, x[2i] sin a + x[2i+1] cos a),
//             a = p · f_i, f_i = rope_inverse_frequency(theta, scaling, i, d)
//   backward: the transpose of a rotation is the rotation by -a, so dx is the
//             forward applied to dy with the angle negated (also in place).
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
inline void check_rope_parameters(std::string_view where, std::string_view theta_key, double theta,
                                  const std::string& key, const rope_scaling& s) {
  const auto finite_positive = [&](double v, const char* name, const char* expected) {
    require(v > 0 && std::isfinite(v), where, key + "." + name, expected, [&] { return std::to_string(v); });
  };
  require(theta > 0 && std::isfinite(theta), where, theta_key, "a finite theta > 0", [&] { return std::to_string(theta); });
  finite_positive(s.factor, "factor", "a finite scaling factor > 0");
  if (s.type == rope_type::standard)
    require(s.factor == 1.0, where, key + ".factor", "1 (the default RoPE does not scale; use rope_type::linear)",
            [&] { return std::to_string(s.factor); });
  if (s.type != rope_type::llama3) return;
  finite_positive(s.low_freq_factor, "low_freq_factor", "a finite low_freq_factor > 0");
  finite_positive(s.original_max_positions, "original_max_positions", "a finite original context length > 0");
  require(s.high_freq_factor > s.low_freq_factor && std::isfinite(s.high_freq_factor), where,
          key + ".high_freq_factor", "a finite high_freq_factor > low_freq_factor (" + std::to_string(s.low_freq_factor) + ")",
          [&] { return std::to_string(s.high_freq_factor); });
}

template <class X>
void check_rope(std::string_view where, memory_space space, const X& x, const char* x_name, index_t offset,
                double theta, const rope_scaling& scaling) {
  require_nonempty(where, x_name, x);
  require(x.extent(3) % 2 == 0, where, x_name, "an even vector size d (interleaved pairs)",
          [&] { return "d = " + std::to_string(x.extent(3)); });
  require(offset >= 0, where, "offset", "a position offset >= 0", [&] { return std::to_string(offset); });
  check_rope_parameters(where, "theta", theta, "scaling", scaling);
  require_all_in(where, space, {{x_name, x.space()}});
}

}  // namespace detail
}  // namespace difftx
