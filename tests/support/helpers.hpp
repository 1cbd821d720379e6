// Helpers shared by the test suites: parameter randomisation in the fixtures'
// distributions, cross-type copies, token ranges of [B, N, C] inputs, and the
// check that a call throws the expected input_error.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include <difftx/difftx.hpp>

namespace test_support {

using difftx::index_t;

// Every parameter drawn so each gradient is exercised with non-trivial values:
// projections ~ N(0, 1.5^2 / in), lambda vectors ~ N(0, 0.3^2), norm weights ~ 1 + 0.2 N(0, 1).
template <class Module>
void randomise_parameters(Module& module, std::uint64_t seed) {
  using T = typename Module::value_type;
  difftx::random_stream rng(seed);
  for (auto& p : module.parameters()) {
    auto v = p.value_view();
    for (index_t i = 0; i < p.size(); ++i) {
      double x;
      if (p.shape.size() == 2)
        x = rng.normal(0.0, 1.5 / std::sqrt(static_cast<double>(p.shape[1])));
      else if (p.name.find("lambda") != std::string::npos)
        x = rng.normal(0.0, 0.3);
      else
        x = 1.0 + 0.2 * rng.normal();
      v.data()[i] = difftx::scalar_traits<T>::from_double(x);
    }
  }
}

template <class T, std::size_t R, class F>
difftx::Tensor<T, R> convert(const difftx::Tensor<F, R>& from) {
  difftx::Tensor<T, R> to(from.shape());
  for (index_t i = 0; i < from.size(); ++i)
    to.data()[i] = difftx::scalar_traits<T>::from_double(difftx::scalar_traits<F>::to_double(from.data()[i]));
  return to;
}

template <class T, std::size_t R>
difftx::Tensor<T, R> random_tensor(const difftx::shape_t<R>& shape, std::uint64_t seed, double stddev = 1.0) {
  difftx::Tensor<T, R> t(shape);
  difftx::random_stream rng(seed);
  difftx::fill_normal(t.view(), rng, 0.0, stddev);
  return t;
}

// Tokens [n0, n1) of every sequence of x [B, N, C], as T.
template <class T, class R>
difftx::Tensor<T, 3> token_range(const difftx::Tensor<R, 3>& x, index_t n0, index_t n1) {
  difftx::Tensor<T, 3> out({x.extent(0), n1 - n0, x.extent(2)});
  for (index_t b = 0; b < x.extent(0); ++b)
    for (index_t n = n0; n < n1; ++n)
      for (index_t c = 0; c < x.extent(2); ++c)
        out(b, n - n0, c) = difftx::scalar_traits<T>::from_double(difftx::scalar_traits<R>::to_double(x(b, n, c)));
  return out;
}

// Runs f, which must throw input_error whose parts contain the given words.
inline void expect_input_error(const std::function<void()>& f, const std::string& where, const std::string& argument,
                               const std::string& expected, const std::string& got) {
  try {
    f();
    FAIL("no input_error thrown (expected one from " << where << " about " << argument << ")");
  } catch (const difftx::input_error& e) {
    const std::string message = e.what();
    INFO("message: " << message);
    CHECK(e.where() == where);
    CHECK(e.argument() == argument);
    CHECK(e.expected().find(expected) != std::string::npos);
    CHECK(e.got().find(got) != std::string::npos);
    CHECK(message.find(where) != std::string::npos);
    CHECK(message.find(argument) != std::string::npos);
  }
}

}  // namespace test_support
