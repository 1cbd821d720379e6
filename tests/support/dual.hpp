// A forward-mode dual number defined only for the tests: value + ε·tangent with
// ε² = 0. Running a module's forward in Dual gives J·dx in the tangents; it
// plugs into difftx the way a user type would, by specialising scalar_traits.
#pragma once

#include <cmath>
#include <string_view>

#include <difftx/core/scalar_traits.hpp>

namespace dual_test {

struct Dual {
  double value = 0, tangent = 0;
  Dual() = default;
  explicit Dual(double v, double t = 0) : value(v), tangent(t) {}
  friend Dual operator+(Dual a, Dual b) { return Dual(a.value + b.value, a.tangent + b.tangent); }
  friend Dual operator-(Dual a, Dual b) { return Dual(a.value - b.value, a.tangent - b.tangent); }
  friend Dual operator*(Dual a, Dual b) { return Dual(a.value * b.value, a.tangent * b.value + a.value * b.tangent); }
  friend Dual operator/(Dual a, Dual b) {
    return Dual(a.value / b.value, (a.tangent * b.value - a.value * b.tangent) / (b.value * b.value));
  }
  friend Dual operator-(Dual a) { return Dual(-a.value, -a.tangent); }
  friend bool operator<(Dual a, Dual b) { return a.value < b.value; }
};

}  // namespace dual_test

template <>
struct difftx::scalar_traits<dual_test::Dual> {
  using Dual = dual_test::Dual;
  using accum_type = Dual;
  static constexpr std::string_view name = "dual";
  static constexpr double epsilon = 0x1p-53;
  static Dual to_accum(Dual x) { return x; }
  static Dual from_accum(Dual x) { return x; }
  static double to_double(Dual x) { return x.value; }
  static Dual from_double(double x) { return Dual(x); }
  static Dual exp(Dual x) {
    const double e = std::exp(x.value);
    return Dual(e, e * x.tangent);
  }
  static Dual log(Dual x) { return Dual(std::log(x.value), x.tangent / x.value); }
  static Dual sqrt(Dual x) {
    const double s = std::sqrt(x.value);
    return Dual(s, x.tangent / (2 * s));
  }
};
