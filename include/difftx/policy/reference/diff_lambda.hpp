// Reference lambda re-parameterisation (formulas in difftx/ops/diff_lambda.hpp).
#pragma once

#include "difftx/ops/diff_lambda.hpp"
#include "difftx/policy/reference/tag.hpp"

namespace difftx {

namespace detail {
template <Scalar T>
accum_t<T> dot(cview<T, 1> a, cview<T, 1> b) {
  accum_t<T> acc(0.0);
  for (index_t c = 0; c < a.size(); ++c) acc = acc + load(a(c)) * load(b(c));
  return acc;
}
}  // namespace detail

// lq1, lk1, lq2, lk2 [d] -> lambda [1]
template <Scalar T>
void diff_lambda_forward(const policy::reference&, TensorView<const T, 1> lq1, cview<T, 1> lk1, cview<T, 1> lq2,
                         cview<T, 1> lk2, double lambda_init, TensorView<accum_t<T>, 1> lambda) {
  constexpr std::string_view where = "diff_lambda_forward";
  detail::check_diff_lambda(where, memory_space::host, lq1, lk1, lq2, lk2, lambda, "lambda");
  using A = accum_t<T>;
  const A a = detail::dot<T>(lq1, lk1), b = detail::dot<T>(lq2, lk2);
  const bool a_larger = b < a;
  const A larger = a_larger ? a : b, gap = a_larger ? a - b : b - a;  // gap >= 0
  const A difference =
      A(0) < gap ? scalar_traits<T>::exp(larger) * (A(1) - scalar_traits<T>::exp(-gap)) : A(0);  // |e1 - e2|
  lambda(0) = (a_larger ? difference : -difference) + A(lambda_init);
}

// dlambda [1] -> dlq1, dlk1, dlq2, dlk2 [d] (+=)
template <Scalar T>
void diff_lambda_backward(const policy::reference&, TensorView<const T, 1> lq1, cview<T, 1> lk1, cview<T, 1> lq2,
                          cview<T, 1> lk2, cview<accum_t<T>, 1> dlambda, TensorView<T, 1> dlq1, TensorView<T, 1> dlk1,
                          TensorView<T, 1> dlq2, TensorView<T, 1> dlk2) {
  constexpr std::string_view where = "diff_lambda_backward";
  detail::check_diff_lambda_backward(where, memory_space::host, lq1, lk1, lq2, lk2, dlambda, dlq1, dlk1, dlq2, dlk2);
  const auto g1 = dlambda(0) * scalar_traits<T>::exp(detail::dot<T>(lq1, lk1));
  const auto g2 = dlambda(0) * scalar_traits<T>::exp(detail::dot<T>(lq2, lk2));
  for (index_t c = 0; c < lq1.size(); ++c) {
    dlq1(c) = store<T>(load(dlq1(c)) + g1 * load(lk1(c)));
    dlk1(c) = store<T>(load(dlk1(c)) + g1 * load(lq1(c)));
    dlq2(c) = store<T>(load(dlq2(c)) - g2 * load(lk2(c)));
    dlk2(c) = store<T>(load(dlk2(c)) - g2 * load(lq2(c)));
  }
}

}  // namespace difftx
