// gradcheck: compares a hand-written backward with central finite differences.
//
// The scalar checked is L = <dy, f(x, θ)> for a fixed random dy, so the
// analytic gradients are exactly what a backward given dy returns. Each entry
// is perturbed with the five-point stencil
//   dL/dz ≈ (-L(z+2h) + 8 L(z+h) - 8 L(z-h) + L(z-2h)) / 12h,
// whose truncation error is O(h^4) and rounding error O(ε/h); the default h
// balances the two at h = ε^(1/5), ε = 2·scalar_traits<T>::epsilon the machine
// epsilon (7e-4 in double, 1.6e-4 in long double).
//
// Error of an entry: |analytic - numeric| / max(|analytic|, |numeric|, floor),
// floor = max(1e-3 · the largest |gradient| of that tensor,
//             1e-6 · the largest |gradient| of all tensors),
// so tiny entries are judged against their tensor's scale instead of dividing by
// nearly nothing. The check passes when the worst error is below the tolerance.
//
// Any Scalar T works: float, double and long double are perturbed in T itself,
// any other type in its accumulation type and read through
// scalar_traits<T>::to_double. Values and gradients may live in device memory
// (a policy::cuda module): they are read and written through their
// memory_resource, so the same call checks a module on any policy.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "difftx/core/checks.hpp"
#include "difftx/core/random.hpp"
#include "difftx/core/transfer.hpp"
#include "difftx/modules/parameter.hpp"

namespace difftx {

namespace detail {

// z widened for the loss sum: exact for the built-in floating types, through
// double for any other Scalar.
template <Scalar T>
long double widen(const T& z) {
  if constexpr (std::floating_point<T>)
    return static_cast<long double>(z);
  else
    return scalar_traits<T>::to_double(z);
}

// The built-in floating types compute the step in T itself; any other Scalar in double.
template <Scalar T>
using gradcheck_step_t = std::conditional_t<std::floating_point<T>, T, double>;

template <Scalar T>
gradcheck_step_t<T> default_gradcheck_step() {
  using S = gradcheck_step_t<T>;
  return std::pow(static_cast<S>(2 * scalar_traits<T>::epsilon), static_cast<S>(0.2));  // ε^(1/5)
}

// The stencil's points z + 2h, z + h, z - h, z - 2h around z, h = step · max(1, |z|).
template <Scalar T>
struct gradcheck_stencil {
  std::array<T, 4> points;
  long double h;
};

template <Scalar T>
gradcheck_stencil<T> stencil_around(const T& z, gradcheck_step_t<T> step) {
  if constexpr (std::floating_point<T>) {
    const T h = step * std::max<T>(T(1), std::abs(z));
    return {{z + 2 * h, z + h, z - h, z - 2 * h}, h};
  } else {
    using A = accum_t<T>;
    const double h = step * std::max(1.0, std::abs(scalar_traits<T>::to_double(z)));
    const A a = load(z);
    return {{store<T>(a + A(2 * h)), store<T>(a + A(h)), store<T>(a - A(h)), store<T>(a - A(2 * h))}, h};
  }
}

}  // namespace detail

namespace testing {

struct gradcheck_options {
  double step = 0;                     // h, scaled by max(1, |z|) per entry; 0: ε^(1/5) of the type
  double tolerance = 1e-6;             // on the worst error
  index_t max_entries_per_tensor = 0;  // 0: every entry; else a seeded sample of that many
  std::uint64_t seed = 20251121;       // for dy, the input and the sample
};

// The worst entry of one tensor.
struct gradcheck_tensor {
  std::string name;
  std::vector<index_t> shape;
  index_t checked = 0;      // entries compared
  double worst_error = 0;   // as defined above
  index_t worst_index = 0;  // flat, row-major
  double analytic = 0, numeric = 0;
  bool all_zero = false;  // every checked entry 0 in both: nothing about this tensor was tested
};

struct gradcheck_result {
  std::vector<gradcheck_tensor> tensors;
  double tolerance = 0;
  double gradient_scale = 0;  // the largest |gradient| seen; 0 means the check compared only zeros

  const gradcheck_tensor& worst() const {
    return *std::max_element(tensors.begin(), tensors.end(),
                             [](const auto& a, const auto& b) { return a.worst_error < b.worst_error; });
  }
  double worst_error() const { return tensors.empty() ? 0.0 : worst().worst_error; }
  // A check where every gradient is zero (an all-zero input, say) proves
  // nothing, so it does not pass.
  bool passed() const { return gradient_scale > 0 && worst_error() < tolerance; }

  // One line per tensor: name, entries checked, worst error and where.
  std::string report() const {
    std::string out;
    if (gradient_scale == 0) out += "  every gradient is zero: the check is vacuous (is the input all zeros?)\n";
    char line[512];
    for (const auto& t : tensors) {
      std::snprintf(line, sizeof line, "  %-28s %7td entries  worst %.3e at %s (analytic % .6e, numeric % .6e)%s\n",
                    t.name.c_str(), t.checked, t.worst_error, position(t).c_str(), t.analytic, t.numeric,
                    t.all_zero ? "  all zero" : "");
      out += line;
    }
    return out;
  }
  // "name[i, j, ...]" of the worst entry overall.
  std::string where() const { return tensors.empty() ? std::string() : worst().name + position(worst()); }

 private:
  static std::string position(const gradcheck_tensor& t) {
    std::vector<index_t> coords(t.shape.size());
    index_t rest = t.worst_index;
    for (std::size_t a = t.shape.size(); a-- > 0;) {
      coords[a] = rest % t.shape[a];
      rest /= t.shape[a];
    }
    return shape_string(coords);
  }
};

// One variable of the function: its values (perturbed in place and restored)
// and the analytic gradient the backward wrote, both in `memory` (null: host
// memory; on a device they are read and written by download and upload).
template <Scalar T>
struct gradcheck_variable {
  std::string name;
  std::vector<index_t> shape;
  T* value = nullptr;
  const T* grad = nullptr;
  memory_resource* memory = nullptr;
  index_t size() const {
    index_t n = 1;
    for (auto e : shape) n *= e;
    return n;
  }
  memory_resource& resource() const { return memory ? *memory : host_memory(); }
};

// The general form: loss() evaluates L at the current values; gradients() fills
// every variable's grad with the analytic dL/dvariable.
template <Scalar T>
gradcheck_result gradcheck(const std::vector<gradcheck_variable<T>>& variables, const std::function<long double()>& loss,
                           const std::function<void()>& gradients, const gradcheck_options& options = {}) {
  require(options.step >= 0, "gradcheck", "options.step", "a step >= 0 (0: automatic)", std::to_string(options.step));
  const auto step = options.step > 0 ? static_cast<detail::gradcheck_step_t<T>>(options.step)
                                     : detail::default_gradcheck_step<T>();
  require(options.tolerance > 0, "gradcheck", "options.tolerance", "a tolerance > 0", std::to_string(options.tolerance));
  for (const auto& v : variables)
    require(v.value != nullptr && v.grad != nullptr && v.size() > 0, "gradcheck", v.name,
            "a non-empty variable with values and gradients", shape_string(v.shape));
  gradients();

  random_stream rng(options.seed ^ 0x5eedULL);
  struct sample {
    std::vector<index_t> entries;
    std::vector<double> analytic, numeric;
  };
  std::vector<sample> samples(variables.size());
  double global_scale = 0;
  for (std::size_t vi = 0; vi < variables.size(); ++vi) {
    const auto& v = variables[vi];
    auto& s = samples[vi];
    const index_t n = v.size();
    auto& memory = v.resource();
    const bool on_host = memory.space() == memory_space::host;
    const auto grad = to_host(TensorView<const T, 1>(v.grad, {n}, memory.space()), memory);  // analytic dL/dv
    // One entry of the values, read and written where it lives.
    auto get = [&](index_t i) {
      if (on_host) return v.value[i];
      T z{};
      memory.download(&z, v.value + i, sizeof(T));
      return z;
    };
    auto set = [&](index_t i, const T& z) {
      if (on_host)
        v.value[i] = z;
      else
        memory.upload(v.value + i, &z, sizeof(T));
    };
    if (options.max_entries_per_tensor <= 0 || options.max_entries_per_tensor >= n) {
      for (index_t i = 0; i < n; ++i) s.entries.push_back(i);
    } else {
      s.entries = {0, n - 1};
      while (static_cast<index_t>(s.entries.size()) < options.max_entries_per_tensor)
        s.entries.push_back(std::min<index_t>(n - 1, static_cast<index_t>(rng.uniform() * static_cast<double>(n))));
      std::sort(s.entries.begin(), s.entries.end());
      s.entries.erase(std::unique(s.entries.begin(), s.entries.end()), s.entries.end());
    }
    for (index_t i : s.entries) {
      const T original = get(i);
      const auto stencil = detail::stencil_around(original, step);
      auto at = [&](std::size_t point) {
        set(i, stencil.points[point]);
        return loss();
      };
      const long double numeric = (-at(0) + 8 * at(1) - 8 * at(2) + at(3)) / (12 * stencil.h);
      set(i, original);
      s.analytic.push_back(scalar_traits<T>::to_double(grad.data()[i]));
      s.numeric.push_back(static_cast<double>(numeric));
      global_scale = std::max({global_scale, std::abs(s.analytic.back()), std::abs(s.numeric.back())});
    }
  }

  gradcheck_result result;
  result.tolerance = options.tolerance;
  result.gradient_scale = global_scale;
  for (std::size_t vi = 0; vi < variables.size(); ++vi) {
    const auto& s = samples[vi];
    double tensor_scale = 0;
    for (std::size_t e = 0; e < s.entries.size(); ++e)
      tensor_scale = std::max({tensor_scale, std::abs(s.analytic[e]), std::abs(s.numeric[e])});
    const double floor = std::max({1e-3 * tensor_scale, 1e-6 * global_scale, 1e-300});
    gradcheck_tensor t{variables[vi].name, variables[vi].shape, static_cast<index_t>(s.entries.size())};
    t.all_zero = tensor_scale == 0;
    for (std::size_t e = 0; e < s.entries.size(); ++e) {
      const double a = s.analytic[e], n = s.numeric[e];
      const double error = std::abs(a - n) / std::max({std::abs(a), std::abs(n), floor});
      if (e == 0 || error > t.worst_error) {
        t.worst_error = error;
        t.worst_index = s.entries[e];
        t.analytic = a;
        t.numeric = n;
      }
    }
    result.tensors.push_back(std::move(t));
  }
  return result;
}

// A module with one input [B, N, C]: checks dL/dx and every parameter, with
// L = <dy, module(x)>. x (in host memory or the module's) is copied into the
// module's memory; the module's parameters are perturbed and restored, and its
// gradients are left holding the analytic dL/dθ.
template <class Module>
  requires Scalar<typename Module::value_type>
gradcheck_result gradcheck(Module& model, cview<typename Module::value_type, 3> x,
                           const gradcheck_options& options = {}) {
  using T = typename Module::value_type;
  memory_resource& memory = model.policy().memory();
  const bool x_on_host = x.space() == memory_space::host;
  require(x_on_host || x.space() == memory.space(), "gradcheck", "x",
          "host memory or the module's (" + std::string(to_string(memory.space())) + " memory)",
          std::string(to_string(x.space())) + " memory");
  Tensor<T, 3> input = to_memory(x, x_on_host ? host_memory() : memory, memory);
  Tensor<T, 3> dy_host(model.output_shape(x.shape()));
  random_stream rng(options.seed);
  fill_normal(dy_host.view(), rng);
  const Tensor<T, 3> dy = to_memory(dy_host, memory);
  Tensor<T, 3> y(dy.shape(), memory), dx(x.shape(), memory);
  typename Module::saved_type saved;

  auto loss = [&]() -> long double {
    model.forward(input.view(), y.view(), saved);
    const auto y_host = to_host(y);
    long double l = 0;
    for (index_t i = 0; i < y_host.size(); ++i) l += detail::widen(dy_host.data()[i]) * detail::widen(y_host.data()[i]);
    return l;
  };
  auto gradients = [&]() {
    zero_grad(model);
    model.forward(input.view(), y.view(), saved);
    model.backward(input.view(), dy.view(), saved, dx.view());
  };
  std::vector<gradcheck_variable<T>> variables{
      {"input", std::vector<index_t>(x.shape().begin(), x.shape().end()), input.data(), dx.data(), &memory}};
  for (auto& p : model.parameters()) variables.push_back({p.name, p.shape, p.value, p.grad, p.memory});
  return gradcheck<T>(variables, loss, gradients, options);
}

}  // namespace testing

}  // namespace difftx
