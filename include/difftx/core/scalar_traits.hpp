// The number-type customization point.
//
// difftx never calls arithmetic on a storage type T directly: every kernel loads
// T into scalar_traits<T>::accum_type, computes there, and stores back. A user
// type joins the library by specialising scalar_traits (as Eigen's NumTraits),
// and the Scalar concept below states exactly what that specialisation must give.
#pragma once

#include <cmath>
#include <concepts>
#include <limits>
#include <string_view>

#include "difftx/core/x86_intrinsics.hpp"  // before Eigen
#include <Eigen/Core>

namespace difftx {

// Primary template: deliberately empty, so an unspecialised type fails the
// Scalar concept (and the static_asserts that use it) with one message.
template <class T>
struct scalar_traits {};

namespace detail {
// Members shared by the built-in floating-point specialisations.
template <class Storage, class Accum>
struct float_traits_base {
  using accum_type = Accum;
  static constexpr Accum to_accum(Storage x) noexcept { return static_cast<Accum>(x); }
  static constexpr Storage from_accum(Accum x) noexcept { return static_cast<Storage>(x); }
  static constexpr double to_double(Storage x) noexcept { return static_cast<double>(static_cast<Accum>(x)); }
  static constexpr Storage from_double(double x) noexcept { return static_cast<Storage>(static_cast<Accum>(x)); }
  static Accum exp(Accum x) noexcept { return std::exp(x); }
  static Accum log(Accum x) noexcept { return std::log(x); }
  static Accum sqrt(Accum x) noexcept { return std::sqrt(x); }
};
}  // namespace detail

template <>
struct scalar_traits<float> : detail::float_traits_base<float, float> {
  static constexpr std::string_view name = "float32";
  static constexpr double epsilon = 0x1p-24;  // unit roundoff of the storage type
};

template <>
struct scalar_traits<double> : detail::float_traits_base<double, double> {
  static constexpr std::string_view name = "float64";
  static constexpr double epsilon = 0x1p-53;
};

template <>
struct scalar_traits<long double> : detail::float_traits_base<long double, long double> {
  static constexpr std::string_view name = "long double";
  static constexpr double epsilon = static_cast<double>(std::numeric_limits<long double>::epsilon()) / 2;
};

// Reduced-precision storage: arithmetic happens in float.
template <>
struct scalar_traits<Eigen::half> : detail::float_traits_base<Eigen::half, float> {
  static constexpr std::string_view name = "float16";
  static constexpr double epsilon = 0x1p-11;
};

template <>
struct scalar_traits<Eigen::bfloat16> : detail::float_traits_base<Eigen::bfloat16, float> {
  static constexpr std::string_view name = "bfloat16";
  static constexpr double epsilon = 0x1p-8;
};

template <class T>
using accum_t = typename scalar_traits<T>::accum_type;

// What the library needs of a number type T and of its accumulation type A:
//  - conversions T <-> A and T <-> double (double only for I/O, init and tests),
//  - A constructible from a double constant, with + - * / unary-, and <,
//  - exp, log and sqrt on A, a printable name and T's unit roundoff.
template <class T>
concept has_scalar_traits = requires { typename scalar_traits<T>::accum_type; };

template <class T>
concept Scalar = has_scalar_traits<T> && std::copyable<T> && requires(T x, accum_t<T> a, double d) {
  requires std::copyable<accum_t<T>>;
  requires std::constructible_from<accum_t<T>, double>;
  { scalar_traits<T>::name } -> std::convertible_to<std::string_view>;
  { scalar_traits<T>::epsilon } -> std::convertible_to<double>;
  { scalar_traits<T>::to_accum(x) } -> std::same_as<accum_t<T>>;
  { scalar_traits<T>::from_accum(a) } -> std::same_as<T>;
  { scalar_traits<T>::to_double(x) } -> std::same_as<double>;
  { scalar_traits<T>::from_double(d) } -> std::same_as<T>;
  { scalar_traits<T>::exp(a) } -> std::convertible_to<accum_t<T>>;
  { scalar_traits<T>::log(a) } -> std::convertible_to<accum_t<T>>;
  { scalar_traits<T>::sqrt(a) } -> std::convertible_to<accum_t<T>>;
  { a + a } -> std::convertible_to<accum_t<T>>;
  { a - a } -> std::convertible_to<accum_t<T>>;
  { a * a } -> std::convertible_to<accum_t<T>>;
  { a / a } -> std::convertible_to<accum_t<T>>;
  { -a } -> std::convertible_to<accum_t<T>>;
  { a < a } -> std::convertible_to<bool>;
};

// A policy computes with the number types it lists (policy::reference: every
// Scalar; policy::simd: float, double, float16, bfloat16; ...). Modules are
// constrained on both, so a wrong type fails with one "constraints not
// satisfied" error whose note names the requirement that failed.
template <class Policy, class T>
concept supported_by = Scalar<T> && Policy::template supports<T>;

// Small helpers so kernels read like the math.
template <class T>
constexpr accum_t<T> load(const T& x) noexcept(noexcept(scalar_traits<T>::to_accum(x))) {
  return scalar_traits<T>::to_accum(x);
}
template <class T>
constexpr T store(const accum_t<T>& a) noexcept(noexcept(scalar_traits<T>::from_accum(a))) {
  return scalar_traits<T>::from_accum(a);
}

}  // namespace difftx
