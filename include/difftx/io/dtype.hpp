// The element types difftx decodes and writes, and conversion between their
// bytes and any difftx::Scalar (through double, which holds every one exactly,
// or a plain copy where the Scalar's bits are the file's).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "difftx/core/x86_intrinsics.hpp"  // before Eigen
#include <Eigen/Core>

#include "difftx/core/scalar_traits.hpp"

namespace difftx::io {

static_assert(std::endian::native == std::endian::little,
              "difftx::io reads and writes little-endian files and supports little-endian hosts only");

enum class dtype { f64, f32, f16, bf16 };

// The safetensors spelling: "F64", "F32", "F16", "BF16".
constexpr std::string_view safetensors_name(dtype t) noexcept {
  switch (t) {
    case dtype::f64: return "F64";
    case dtype::f32: return "F32";
    case dtype::f16: return "F16";
    case dtype::bf16: return "BF16";
  }
  return "?";
}

constexpr std::size_t size_of(dtype t) noexcept {
  return t == dtype::f64 ? 8 : t == dtype::f32 ? 4 : 2;
}

inline std::optional<dtype> parse_safetensors_dtype(std::string_view name) noexcept {
  for (dtype t : {dtype::f64, dtype::f32, dtype::f16, dtype::bf16})
    if (safetensors_name(t) == name) return t;
  return std::nullopt;
}

// The user-facing spelling: "float64", "float32", "float16", "bfloat16".
constexpr std::string_view dtype_name(dtype t) noexcept {
  switch (t) {
    case dtype::f64: return "float64";
    case dtype::f32: return "float32";
    case dtype::f16: return "float16";
    case dtype::bf16: return "bfloat16";
  }
  return "?";
}

inline std::optional<dtype> parse_dtype_name(std::string_view name) noexcept {
  for (dtype t : {dtype::f64, dtype::f32, dtype::f16, dtype::bf16})
    if (dtype_name(t) == name) return t;
  return std::nullopt;
}

// One element of type t at p, as a double (which holds every one exactly).
inline double decode_one(dtype t, const std::byte* p) noexcept {
  switch (t) {
    case dtype::f64: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    case dtype::f32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case dtype::f16: {
      std::uint16_t raw;
      std::memcpy(&raw, p, 2);
      return static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(raw));
    }
    case dtype::bf16: break;
  }
  std::uint16_t raw;
  std::memcpy(&raw, p, 2);
  return static_cast<float>(Eigen::numext::bit_cast<Eigen::bfloat16>(raw));
}

// The dtype whose bytes are T's own, if any: decoding it into T is a copy.
template <class T>
inline constexpr std::optional<dtype> dtype_of = std::nullopt;
template <>
inline constexpr std::optional<dtype> dtype_of<double> = dtype::f64;
template <>
inline constexpr std::optional<dtype> dtype_of<float> = dtype::f32;
template <>
inline constexpr std::optional<dtype> dtype_of<Eigen::half> = dtype::f16;
template <>
inline constexpr std::optional<dtype> dtype_of<Eigen::bfloat16> = dtype::bf16;

// Decodes count elements of type t at bytes (unaligned is fine) into out as T:
// a copy where T's bits are t's own, otherwise each element through
// scalar_traits<T>::from_double, so the values are exactly those of decode()
// then from_double, without a vector of doubles in between.
template <Scalar T>
void decode_into(dtype t, const std::byte* bytes, std::size_t count, T* out) noexcept {
  if (count == 0) return;
  if constexpr (dtype_of<T>.has_value()) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) == size_of(*dtype_of<T>));
    if (t == *dtype_of<T>) {
      std::memcpy(out, bytes, count * sizeof(T));
      return;
    }
  }
  const auto convert = [&]<class Stored>() {
    for (std::size_t i = 0; i < count; ++i) {
      Stored s;
      std::memcpy(&s, bytes + i * sizeof(Stored), sizeof(Stored));
      out[i] = scalar_traits<T>::from_double(scalar_traits<Stored>::to_double(s));
    }
  };
  switch (t) {
    case dtype::f64: return convert.template operator()<double>();
    case dtype::f32: return convert.template operator()<float>();
    case dtype::f16: return convert.template operator()<Eigen::half>();
    case dtype::bf16: return convert.template operator()<Eigen::bfloat16>();
  }
}

// Stores value as type t at p, rounding to nearest even where t is narrower.
inline void encode_one(dtype t, double value, std::byte* p) noexcept {
  switch (t) {
    case dtype::f64: std::memcpy(p, &value, 8); return;
    case dtype::f32: {
      const float f = static_cast<float>(value);
      std::memcpy(p, &f, 4);
      return;
    }
    case dtype::f16: {
      const auto raw = Eigen::numext::bit_cast<std::uint16_t>(Eigen::half(static_cast<float>(value)));
      std::memcpy(p, &raw, 2);
      return;
    }
    case dtype::bf16: break;
  }
  const auto raw = Eigen::numext::bit_cast<std::uint16_t>(Eigen::bfloat16(static_cast<float>(value)));
  std::memcpy(p, &raw, 2);
}

// Stores count values of any Scalar as type t at out.
template <Scalar T>
void encode_values(dtype t, const T* values, std::size_t count, std::byte* out) noexcept {
  for (std::size_t i = 0; i < count; ++i) encode_one(t, scalar_traits<T>::to_double(values[i]), out + i * size_of(t));
}

// Decodes `count` elements of type t from bytes.
inline std::vector<double> decode(dtype t, const std::byte* bytes, std::size_t count) {
  std::vector<double> out(count);
  for (std::size_t i = 0; i < count; ++i) out[i] = decode_one(t, bytes + i * size_of(t));
  return out;
}

// Encodes values as type t.
inline std::vector<std::byte> encode(dtype t, const std::vector<double>& values) {
  std::vector<std::byte> out(values.size() * size_of(t));
  for (std::size_t i = 0; i < values.size(); ++i) encode_one(t, values[i], out.data() + i * size_of(t));
  return out;
}

template <Scalar T>
std::vector<double> to_doubles(const T* data, std::size_t count) {
  std::vector<double> out(count);
  for (std::size_t i = 0; i < count; ++i) out[i] = scalar_traits<T>::to_double(data[i]);
  return out;
}

}  // namespace difftx::io
