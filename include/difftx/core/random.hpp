// Seeded, portable random numbers for parameter initialisation and tests.
//
// std::mt19937_64 is specified bit for bit by the standard, but the standard
// distributions are not, so the same seed would give other numbers with another
// standard library. The two transforms below are written out for that reason.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>

#include "difftx/core/checks.hpp"

namespace difftx {

class random_stream {
 public:
  explicit random_stream(std::uint64_t seed) : engine_(seed) {}

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1p-53; }
  double uniform(double low, double high) { return low + (high - low) * uniform(); }

  // Standard normal by Box-Muller (one value per call; the pair's second is dropped for simplicity).
  double normal() {
    const double u1 = 1.0 - uniform();  // in (0, 1], so log is finite
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }
  double normal(double mean, double stddev) { return mean + stddev * normal(); }

 private:
  std::mt19937_64 engine_;
};

template <Scalar T, std::size_t R>
void fill_normal(TensorView<T, R> x, random_stream& rng, double mean = 0.0, double stddev = 1.0) {
  require_space("fill_normal", "x", x, memory_space::host);
  for (index_t i = 0; i < x.size(); ++i) x.data()[i] = scalar_traits<T>::from_double(rng.normal(mean, stddev));
}

template <Scalar T, std::size_t R>
void fill_uniform(TensorView<T, R> x, random_stream& rng, double low, double high) {
  require_space("fill_uniform", "x", x, memory_space::host);
  for (index_t i = 0; i < x.size(); ++i) x.data()[i] = scalar_traits<T>::from_double(rng.uniform(low, high));
}

template <Scalar T, std::size_t R>
void fill_constant(TensorView<T, R> x, double value) {
  require_space("fill_constant", "x", x, memory_space::host);
  for (index_t i = 0; i < x.size(); ++i) x.data()[i] = scalar_traits<T>::from_double(value);
}

}  // namespace difftx
