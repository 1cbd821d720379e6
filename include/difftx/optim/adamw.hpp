// AdamW (Loshchilov & Hutter, decoupled weight decay) over named parameters,
// with a learning-rate schedule of linear warm-up then cosine or linear decay,
// and global gradient-norm clipping. The update is PyTorch's torch.optim.AdamW
// (amsgrad off, maximize off), per element, at step t = 1, 2, ...:
//   lr_t = schedule(t - 1)
//   p   ← p · (1 − lr_t · wd)                      (only parameters that decay)
//   m   ← β1 m + (1 − β1) g,   v ← β2 v + (1 − β2) g²
//   p   ← p − lr_t · (m / (1 − β1^t)) / (sqrt(v / (1 − β2^t)) + eps)
// m and v are kept in the accumulation type; gradients are read, not cleared.
// By default weight decay applies to matrices (rank ≥ 2: projections, the
// embedding and the head) and not to vectors (norm weights, the λ vectors),
// the usual choice for transformers; pass another predicate to change it.
// Host memory only (policy::reference and CPU policies).
#pragma once

#include <cmath>
#include <functional>
#include <numbers>
#include <string>
#include <vector>

#include "difftx/core/checks.hpp"
#include "difftx/modules/parameter.hpp"

namespace difftx {

enum class lr_decay { constant, linear, cosine };

// The learning rate at step s = 0, 1, ...: (s + 1) / warmup · peak during the
// warm-up, then from peak down to final_ratio · peak over the remaining steps
// up to total_steps (cosine: half a cosine period; linear: a straight line),
// then final_ratio · peak.
struct lr_schedule {
  double peak = 1e-3;
  index_t warmup_steps = 0;
  index_t total_steps = 0;  // 0: no decay
  lr_decay decay = lr_decay::cosine;
  double final_ratio = 0.1;

  double at(index_t step) const {
    if (step < warmup_steps) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
    if (decay == lr_decay::constant || total_steps <= warmup_steps) return peak;
    const double progress =
        std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps));
    const double shape = decay == lr_decay::cosine ? 0.5 * (1.0 + std::cos(std::numbers::pi * progress)) : 1.0 - progress;
    return peak * (final_ratio + (1.0 - final_ratio) * shape);
  }
};

struct AdamWConfig {
  lr_schedule lr;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

template <Scalar T>
class AdamW {
  using A = accum_t<T>;

 public:
  using decay_predicate = std::function<bool(const parameter_ref<T>&)>;
  // Matrices decay, vectors (norm weights, lambda vectors) do not.
  static bool decay_matrices(const parameter_ref<T>& p) { return p.shape.size() >= 2; }

  AdamW(std::vector<parameter_ref<T>> parameters, const AdamWConfig& config, decay_predicate decays = decay_matrices)
      : parameters_(std::move(parameters)), config_(checked(config)) {
    for (const auto& p : parameters_) {
      require(p.value != nullptr && p.grad != nullptr && p.size() > 0, "AdamW", p.name, "a parameter with values and gradients",
              shape_string(p.shape));
      require_space("AdamW", p.name, p.grad_view(), memory_space::host);
      m_.emplace_back(static_cast<std::size_t>(p.size()), A(0.0));
      v_.emplace_back(static_cast<std::size_t>(p.size()), A(0.0));
      decays_.push_back(decays(p));
    }
  }

  const AdamWConfig& config() const noexcept { return config_; }
  const std::vector<parameter_ref<T>>& parameters() const noexcept { return parameters_; }
  bool decays(std::size_t i) const noexcept { return decays_[i]; }
  index_t steps_taken() const noexcept { return step_; }
  // The learning rate the next step() uses.
  double learning_rate() const { return config_.lr.at(step_); }

  // One update from the current gradients.
  void step() {
    const double lr = learning_rate();
    ++step_;
    const double bias1 = 1.0 - std::pow(config_.beta1, static_cast<double>(step_));
    const double bias2 = 1.0 - std::pow(config_.beta2, static_cast<double>(step_));
    const A b1(config_.beta1), b2(config_.beta2), one(1.0), eps(config_.eps);
    const A step_size(lr / bias1), inv_sqrt_bias2(1.0 / std::sqrt(bias2)), shrink(1.0 - lr * config_.weight_decay);
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      const auto& p = parameters_[i];
      auto& m = m_[i];
      auto& v = v_[i];
      for (index_t e = 0; e < p.size(); ++e) {
        const auto ei = static_cast<std::size_t>(e);
        const A g = load(p.grad[e]);
        A value = load(p.value[e]);
        if (decays_[i]) value = value * shrink;
        m[ei] = b1 * m[ei] + (one - b1) * g;
        v[ei] = b2 * v[ei] + (one - b2) * g * g;
        value = value - step_size * m[ei] / (scalar_traits<T>::sqrt(v[ei]) * inv_sqrt_bias2 + eps);
        p.value[e] = store<T>(value);
      }
    }
  }

 private:
  static AdamWConfig checked(const AdamWConfig& c) {
    require(c.lr.peak >= 0, "AdamW", "config.lr.peak", "a learning rate >= 0", std::to_string(c.lr.peak));
    require(c.lr.warmup_steps >= 0, "AdamW", "config.lr.warmup_steps", "a step count >= 0", std::to_string(c.lr.warmup_steps));
    require(c.beta1 >= 0 && c.beta1 < 1, "AdamW", "config.beta1", "0 <= beta1 < 1", std::to_string(c.beta1));
    require(c.beta2 >= 0 && c.beta2 < 1, "AdamW", "config.beta2", "0 <= beta2 < 1", std::to_string(c.beta2));
    require(c.eps > 0, "AdamW", "config.eps", "eps > 0", std::to_string(c.eps));
    require(c.weight_decay >= 0, "AdamW", "config.weight_decay", "a decay >= 0", std::to_string(c.weight_decay));
    return c;
  }

  std::vector<parameter_ref<T>> parameters_;
  AdamWConfig config_;
  std::vector<std::vector<A>> m_, v_;
  std::vector<bool> decays_;
  index_t step_ = 0;
};

namespace detail {

// Σ g² over the parameters' gradients (host memory), in double.
template <Scalar T>
double gradient_sum_of_squares(const std::vector<parameter_ref<T>>& parameters, std::string_view where) {
  double sum_sq = 0;
  for (const auto& p : parameters) {
    require_space(where, p.name, p.grad_view(), memory_space::host);
    for (index_t e = 0; e < p.size(); ++e) {
      const double g = scalar_traits<T>::to_double(p.grad[e]);
      sum_sq += g * g;
    }
  }
  return sum_sq;
}

// torch.nn.utils.clip_grad_norm_'s scaling, given the norm: every gradient
// times max_norm / (norm + 1e-6) where that is below 1; max_norm <= 0 only measures.
template <Scalar T>
void clip_to_norm(const std::vector<parameter_ref<T>>& parameters, double norm, double max_norm) {
  const double coef = max_norm / (norm + 1e-6);  // torch's guard against a zero norm
  if (max_norm > 0 && coef < 1)
    for (const auto& p : parameters)
      for (index_t e = 0; e < p.size(); ++e)
        p.grad[e] = scalar_traits<T>::from_double(scalar_traits<T>::to_double(p.grad[e]) * coef);
}

}  // namespace detail

// Scales every gradient by max_norm / (‖g‖ + 1e-6) when that is below 1, where ‖g‖ is the L2 norm of
// all gradients together (torch.nn.utils.clip_grad_norm_); returns ‖g‖ before
// clipping. max_norm <= 0 only measures. (A tensor-parallel model's norm
// needs every rank's parts: parallel::clip_grad_norm, parallel/tensor_parallel.hpp.)
template <Scalar T>
double clip_grad_norm(const std::vector<parameter_ref<T>>& parameters, double max_norm) {
  const double norm = std::sqrt(detail::gradient_sum_of_squares(parameters, "clip_grad_norm"));
  detail::clip_to_norm(parameters, norm, max_norm);
  return norm;
}

}  // namespace difftx
