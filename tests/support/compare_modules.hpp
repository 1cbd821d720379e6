// Runs two builds of the same module (any number types, any policies) on the
// same inputs and weights and measures how far the candidate is from the
// oracle. Weights and inputs are drawn in the oracle's type and rounded through
// the candidate's, so both see exactly the same numbers.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

#include <difftx/difftx.hpp>
#include <difftx/testing/compare.hpp>

#include "support/helpers.hpp"

namespace test_support {

using difftx::testing::gradient_floor_fraction;

struct comparison {
  double forward = 0, backward = 0;
  std::string worst_backward;
};

template <class From, class To>
auto round_through(From v) {
  using difftx::scalar_traits;
  return scalar_traits<From>::from_double(scalar_traits<To>::to_double(scalar_traits<To>::from_double(scalar_traits<From>::to_double(v))));
}

// model.forward(x, y, saved), on a packed batch where sequences (cu_seqlens) are given.
template <class Module, class X, class Y>
void forward_on(const Module& model, const X& x, Y& y, typename Module::saved_type& saved,
                difftx::sequence_offsets sequences) {
  if constexpr (requires { model.forward(x, y, saved, sequences); })
    model.forward(x, y, saved, sequences);
  else if (sequences.empty())
    model.forward(x, y, saved);
  else
    throw std::logic_error("test_support::forward_on: a packed batch for a module that takes none");
}

template <class Module, class T = typename Module::value_type>
std::pair<difftx::Tensor<T, 3>, difftx::Tensor<T, 3>> run_forward_backward(Module& model, const difftx::Tensor<T, 3>& x,
                                                                            const difftx::Tensor<T, 3>& dy,
                                                                            difftx::sequence_offsets sequences = {}) {
  difftx::Tensor<T, 3> y(dy.shape()), dx(x.shape());
  typename Module::saved_type saved;
  difftx::zero_grad(model);
  forward_on(model, x, y, saved, sequences);
  model.backward(x, dy, saved, dx);
  return {std::move(y), std::move(dx)};
}

template <class Candidate, class Oracle>
comparison compare_modules(Candidate& candidate, Oracle& oracle, const difftx::shape_t<3>& shape, std::uint64_t seed,
                           double input_scale = 1.0) {
  using T = typename Candidate::value_type;
  using R = typename Oracle::value_type;
  using difftx::index_t;
  randomise_parameters(oracle, seed);
  for (auto& p : oracle.parameters())
    for (index_t i = 0; i < p.size(); ++i) p.value[i] = round_through<R, T>(p.value[i]);
  difftx::copy_parameters(oracle, candidate);

  auto x_ref = random_tensor<R, 3>(shape, seed + 1, input_scale);
  auto dy_ref = random_tensor<R, 3>(oracle.output_shape(shape), seed + 2);
  for (auto* t : {&x_ref, &dy_ref})
    for (index_t i = 0; i < t->size(); ++i) t->data()[i] = round_through<R, T>(t->data()[i]);
  const auto [y_ref, dx_ref] = run_forward_backward(oracle, x_ref, dy_ref);
  const auto [y, dx] = run_forward_backward(candidate, convert<T>(x_ref), convert<T>(dy_ref));

  auto grads = candidate.parameters();
  auto grads_ref = oracle.parameters();
  double scale = difftx::testing::max_abs(dx_ref.data(), dx_ref.size());
  for (const auto& g : grads_ref) scale = std::max(scale, difftx::testing::max_abs(g.grad, g.size()));
  const double floor = gradient_floor_fraction * scale;

  comparison c;
  c.forward = difftx::testing::normwise_difference(y.data(), y_ref.data(), y.size());
  c.backward = difftx::testing::normwise_difference(dx.data(), dx_ref.data(), dx.size(), floor);
  c.worst_backward = "input";
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const double d = difftx::testing::normwise_difference(grads[i].grad, grads_ref[i].grad, grads[i].size(), floor);
    if (d > c.backward) {
      c.backward = d;
      c.worst_backward = grads[i].name;
    }
  }
  return c;
}

}  // namespace test_support
