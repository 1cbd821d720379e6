// Tensor parallelism, Megatron-LM's scheme: a module's heads (or hidden
// units) split over the ranks of a communicator (communicator.hpp), each rank
// computing its share from the whole input and one all-reduce summing the
// shares of the output.
//
//   TensorParallel<MultiHead<T, D, P>, Comm>   rank r of p holds heads [r·h/p, (r+1)·h/p)
//       and their key/value groups: those rows of q_proj, k_proj, v_proj, those
//       columns of out_proj; the lambda vectors and subln weight whole, their
//       gradients summed over the ranks (each rank's heads add a part).
//   TensorParallel<MultiHeadV2<T, D, P>, Comm> the same with lambda_proj by rows, o_proj by columns.
//   TensorParallel<SwiGLU<T, P>, Comm>         hidden units [r·F/p, (r+1)·F/p): rows of
//       gate_proj and up_proj, columns of down_proj.
//   TensorParallelDecoderLayer<Comm, T, D, P>  (and ...V2) the decoder layer around both;
//       its norms are whole on every rank. Stack<> of them is a tensor-parallel model.
//
// Forward: y = Σ_r part_r(x), one all-reduce of [B, N, C] per module. Backward:
// dx = Σ_r dpart_r(dy), one all-reduce of [B, N, C], plus one of the whole
// parameters' gradients (MultiHead: 4D + 2D elements). Parameters keep the
// whole module's names; parameter_ref::shard says which part a rank holds, so
// io::load_parameters reads a whole checkpoint into every rank's part and
// io::store_parameters(file, module, dtype, comm) (checkpoint.hpp) gathers it.
//
// Construction is collective (every rank, same arguments): the ranks compare
// their configurations and all throw input_error if any differs, or if the
// heads, key/value groups or hidden units do not divide among them. A new
// module holds the values a whole module gets from the same seed (built once
// whole, then cut), so a p-rank model starts equal to its one-process twin.
#pragma once

#include <cmath>
#include <concepts>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "difftx/core/transfer.hpp"
#include "difftx/modules/decoder_layer.hpp"
#include "difftx/ops/elementwise.hpp"
#include "difftx/optim/adamw.hpp"
#include "difftx/parallel/communicator.hpp"

namespace difftx::parallel {

// How TensorParallel splits a module kind: `arguments` (the module's
// constructor arguments), whole(a) and part(a, ranks) (the module for all
// heads, and one rank's share), full_config, fingerprint (what every rank
// must agree on) and split_of(parameter name).
template <class Module>
struct tensor_parallel_traits;

namespace detail {

inline index_t divided(std::string_view where, std::string_view argument, index_t n, int ranks) {
  require(n % ranks == 0, where, argument, "a multiple of the " + std::to_string(ranks) + " ranks", std::to_string(n));
  return n / ranks;
}

// "q_proj.weight" and the like: split by rows, unless it is the output projection.
inline parameter_shard::split projection_split(std::string_view name, std::string_view output_projection) {
  if (name == output_projection) return parameter_shard::split::columns;
  return name.ends_with("_proj.weight") ? parameter_shard::split::rows : parameter_shard::split::none;
}

template <class Module>
constexpr index_t compiled_head_dim_of() {
  if constexpr (requires { Module::compiled_head_dim; })
    return Module::compiled_head_dim;
  else
    return 0;
}

}  // namespace detail

namespace detail {

// What the attention modules share: a config with heads and kv_heads (0: as
// many as heads), split into h/p heads and g/p groups per rank.
template <class Module, class Config>
struct attention_split {
  using module_type = Module;
  using policy_type = typename Module::policy_type;
  struct arguments {
    arguments(const Config& c, policy_type p = {}) : config(c), policy(std::move(p)) {}
    Config config;
    policy_type policy;
  };
  static module_type whole(const arguments& a) { return module_type(a.config, a.policy); }
  static module_type part(std::string_view name, const arguments& a, int ranks) {
    auto c = a.config;
    const index_t groups = c.kv_heads == 0 ? c.heads : c.kv_heads;
    c.heads = divided(name, "config.heads", c.heads, ranks);
    c.kv_heads = divided(name, "config.kv_heads", groups, ranks);
    return module_type(c, a.policy);
  }
  static Config full_config(const module_type& part, int ranks) {
    auto c = part.config();
    c.heads *= ranks;
    c.kv_heads *= ranks;
    return c;
  }
};

// RoPE's numbers in a config's fingerprint: every rank must rotate alike.
template <class Config>
void append_rope_fingerprint(std::vector<double>& f, const Config& c) {
  const auto& s = c.rope_scaling;
  f.insert(f.end(), {c.rope_theta, double(static_cast<int>(s.type)), s.factor, s.low_freq_factor, s.high_freq_factor,
                     s.original_max_positions});
}

}  // namespace detail

template <Scalar T, index_t D, class Policy>
struct tensor_parallel_traits<MultiHead<T, D, Policy>> : detail::attention_split<MultiHead<T, D, Policy>, MultiHeadConfig> {
  using base = detail::attention_split<MultiHead<T, D, Policy>, MultiHeadConfig>;
  static constexpr std::string_view name = "TensorParallel<MultiHead>";
  static auto part(const typename base::arguments& a, int ranks) { return base::part(name, a, ranks); }
  static std::vector<double> fingerprint(const typename base::arguments& a) {
    const auto& c = a.config;
    auto f = std::vector<double>{double(c.d_model), double(c.heads), double(c.kv_heads), double(c.layer_index),
                                 double(c.causal), double(c.head_dim), c.subln_eps};
    detail::append_rope_fingerprint(f, c);
    return f;
  }
  static parameter_shard::split split_of(std::string_view name) { return detail::projection_split(name, "out_proj.weight"); }
};

template <Scalar T, index_t D, class Policy>
struct tensor_parallel_traits<MultiHeadV2<T, D, Policy>>
    : detail::attention_split<MultiHeadV2<T, D, Policy>, MultiHeadV2Config> {
  using base = detail::attention_split<MultiHeadV2<T, D, Policy>, MultiHeadV2Config>;
  static constexpr std::string_view name = "TensorParallel<MultiHeadV2>";
  static auto part(const typename base::arguments& a, int ranks) { return base::part(name, a, ranks); }
  static std::vector<double> fingerprint(const typename base::arguments& a) {
    const auto& c = a.config;
    auto f = std::vector<double>{double(c.d_model), double(c.heads),    double(c.kv_heads),
                                 double(c.causal),  double(c.head_dim), double(c.differential)};
    detail::append_rope_fingerprint(f, c);
    return f;
  }
  static parameter_shard::split split_of(std::string_view name) { return detail::projection_split(name, "o_proj.weight"); }
};

template <Scalar T, class Policy>
struct tensor_parallel_traits<SwiGLU<T, Policy>> {
  using module_type = SwiGLU<T, Policy>;
  struct arguments {
    arguments(index_t d_model_, index_t ffn_dim_ = 0, Policy p = {})
        : d_model(d_model_), ffn_dim(ffn_dim_ == 0 ? default_ffn_dim(d_model_) : ffn_dim_), policy(std::move(p)) {}
    index_t d_model, ffn_dim;
    Policy policy;
  };
  static constexpr std::string_view name = "TensorParallel<SwiGLU>";
  static module_type whole(const arguments& a) { return module_type(a.d_model, a.ffn_dim, a.policy); }
  static module_type part(const arguments& a, int ranks) {
    return module_type(a.d_model, detail::divided(name, "ffn_dim", a.ffn_dim, ranks), a.policy);
  }
  static std::vector<double> fingerprint(const arguments& a) { return {double(a.d_model), double(a.ffn_dim)}; }
  static parameter_shard::split split_of(std::string_view name) { return detail::projection_split(name, "down_proj.weight"); }
};

// Every parameter of `parallel` (a tensor-parallel module, layer or stack)
// from this rank's part of the same parameter of `whole` (its one-process
// twin, held by this rank): how a model built or trained whole is split.
// The names and whole shapes must match (input_error before anything is written).
template <class Whole, class Parallel>
void copy_parts(Whole& whole, Parallel& parallel) {
  using T = typename Parallel::value_type;
  const auto from = whole.parameters();
  const auto to = parallel.parameters();
  for (std::size_t i = 0; i < from.size() && i < to.size(); ++i)
    require(to[i].name == from[i].name && to[i].full_shape() == from[i].shape, "copy_parts", to[i].name,
            "'" + from[i].name + "' of shape " + shape_string(from[i].shape) + " as in whole",
            "'" + to[i].name + "' of whole shape " + shape_string(to[i].full_shape()));
  require(to.size() == from.size(), "copy_parts", "parallel", std::to_string(from.size()) + " parameters as in whole",
          std::to_string(to.size()));
  std::vector<T> full, part;
  for (std::size_t i = 0; i < to.size(); ++i) {
    full.resize(static_cast<std::size_t>(from[i].size()));
    part.resize(static_cast<std::size_t>(to[i].size()));
    difftx::detail::copy_elements(full.data(), host_memory(), from[i].value, *from[i].memory, from[i].size());
    take_shard(to[i], full.data(), part.data());
    difftx::detail::copy_elements(to[i].value, *to[i].memory, part.data(), host_memory(), to[i].size());
  }
}

template <class Module, communicator Comm>
class TensorParallel {
  using traits = tensor_parallel_traits<Module>;
  using arguments = typename traits::arguments;

 public:
  using value_type = typename Module::value_type;
  using policy_type = typename Module::policy_type;
  using saved_type = typename Module::saved_type;  // this rank's part's
  using cache_type = KVCache<value_type>;          // attention modules: this rank's groups
  static constexpr index_t compiled_head_dim = detail::compiled_head_dim_of<Module>();

 private:
  using T = value_type;

 public:
  // comm, then what the whole module's constructor takes (a config and a
  // policy; SwiGLU: d_model, ffn_dim, policy).
  template <class... Args>
    requires std::constructible_from<arguments, const Args&...>
  explicit TensorParallel(Comm& comm, const Args&... args) : TensorParallel(comm, arguments(args...)) {}

  // The whole module's configuration (all heads).
  auto config() const
    requires requires(const Module& m) { m.config(); }
  {
    return traits::full_config(local_, comm_->size());
  }
  index_t head_dim() const
    requires requires(const Module& m) { m.head_dim(); }
  {
    return local_.head_dim();
  }
  double lambda_init() const
    requires requires(const Module& m) { m.lambda_init(); }
  {
    return local_.lambda_init();
  }
  index_t d_model() const
    requires requires(const Module& m) { m.d_model(); }
  {
    return local_.d_model();
  }
  index_t ffn_dim() const
    requires requires(const Module& m) { m.ffn_dim(); }
  {
    return local_.ffn_dim() * comm_->size();
  }
  shape_t<3> output_shape(const shape_t<3>& input) const { return local_.output_shape(input); }
  const Module& local() const noexcept { return local_; }  // this rank's part, as a module of its own
  Comm& communicator() const noexcept { return *comm_; }

  // x [B, N, C] (every rank the same) -> y [B, N, C] (every rank the same).
  void forward(cview<T, 3> x, TensorView<T, 3> y, saved_type& s) const {
    local_.forward(x, y, s);
    sum_over_ranks(y);
  }
  void forward(cview<T, 3> x, TensorView<T, 3> y, saved_type& s, sequence_offsets sequences) const {
    local_.forward(x, y, s, sequences);
    sum_over_ranks(y);
  }
  void forward(cview<T, 3> x, TensorView<T, 3> y, sequence_offsets sequences = {}) const
    requires requires(const Module& m, cview<T, 3> in, TensorView<T, 3> out) { m.forward(in, out); }
  {
    local_.forward(x, y, sequences);
    sum_over_ranks(y);
  }

  cache_type make_cache(index_t batch, index_t capacity, inference_dtype storage = inference_dtype::same) const {
    return local_.make_cache(batch, capacity, storage);
  }
  KVCacheShape cache_shape(index_t batch, index_t capacity) const noexcept { return local_.cache_shape(batch, capacity); }
  void prefill(cview<T, 3> x, cache_type& cache, TensorView<T, 3> y, sequence_offsets sequences = {}) const {
    local_.prefill(x, cache, y, sequences);
    sum_over_ranks(y);
  }
  void decode(cview<T, 3> x, cache_type& cache, TensorView<T, 3> y) const {
    local_.decode(x, cache, y);
    sum_over_ranks(y);
  }

  // dy [B, N, C] (every rank the same) -> dx [B, N, C] (assign, every rank the
  // same); this rank's gradients accumulate, the whole parameters' by the sum
  // over ranks of this call's parts.
  void backward(cview<T, 3> x, cview<T, 3> dy, const saved_type& s, TensorView<T, 3> dx) {
    auto shared = whole_parameters();
    auto& memory = local_.policy().memory();
    index_t total = 0;
    for (const auto& p : shared) total += p.size();
    Tensor<T, 1> before({total}, memory), added({total}, memory);
    move_gradients(shared, before.data(), /*into_buffer=*/true);
    for (const auto& p : shared) p.zero_grad();
    try {
      local_.backward(x, dy, s, dx);
    } catch (...) {  // bad input: nothing was written but the gradients set aside
      move_gradients(shared, before.data(), /*into_buffer=*/false);
      throw;
    }
    sum_over_ranks(dx);
    if (total == 0) return;
    move_gradients(shared, added.data(), /*into_buffer=*/true);
    comm_->all_reduce_sum(added.view());
    add_into(local_.policy(), before.const_view(), added.view());
    move_gradients(shared, added.data(), /*into_buffer=*/false);
  }

  // The whole module's names; parameter_ref::shard marks the split ones.
  std::vector<parameter_ref<T>> parameters(const std::string& prefix = "") {
    auto all = local_.parameters();
    for (auto& p : all) {
      if (const auto along = traits::split_of(p.name); along != parameter_shard::split::none && comm_->size() > 1)
        p.shard = {along, comm_->rank(), comm_->size()};
      p.name = prefix + p.name;
    }
    return all;
  }
  // The values a whole module draws from rng, this rank's part of them (the
  // whole module exists for the duration of the call).
  void reset_parameters(random_stream& rng) {
    Module whole = traits::whole(args_);
    whole.reset_parameters(rng);
    copy_parts(whole, *this);
  }
  const policy_type& policy() const noexcept { return local_.policy(); }

 private:
  TensorParallel(Comm& comm, arguments args)
      : comm_(&comm), args_(std::move(args)), local_(checked_part(comm, args_)) {
    require(comm.memory().space() == local_.policy().memory().space(), traits::name, "comm",
            std::string("a communicator of ") + to_string(local_.policy().memory().space()) + " memory, as the policy's",
            std::string(to_string(comm.memory().space())) + " memory");
    random_stream rng(0);  // the whole module's default initialisation
    reset_parameters(rng);
  }
  static Module checked_part(Comm& comm, const arguments& args) {
    detail::require_same_on_every_rank(comm, traits::name, "config", traits::fingerprint(args));
    return traits::part(args, comm.size());
  }
  void sum_over_ranks(TensorView<T, 3> y) const { comm_->all_reduce_sum(y.template reshape<1>({y.size()})); }
  // The parameters the traits never split (their gradients are partial sums).
  std::vector<parameter_ref<T>> whole_parameters() {
    std::vector<parameter_ref<T>> shared;
    for (auto& p : local_.parameters())
      if (traits::split_of(p.name) == parameter_shard::split::none) shared.push_back(std::move(p));
    return shared;
  }
  // The gradients of params, one after another, into buffer (or back from it).
  static void move_gradients(const std::vector<parameter_ref<T>>& params, T* buffer, bool into_buffer) {
    for (const auto& p : params) {
      if (into_buffer)
        difftx::detail::copy_elements(buffer, *p.memory, p.grad, *p.memory, p.size());
      else
        difftx::detail::copy_elements(p.grad, *p.memory, buffer, *p.memory, p.size());
      buffer += p.size();
    }
  }

  Comm* comm_;
  arguments args_;
  Module local_;
};

// This rank's values (or gradients: source = p.grad) of p, whole: gathered
// from every rank where p is split (collective), a copy where it is not.
template <class T, communicator Comm>
std::vector<T> whole_parameter(const parameter_ref<T>& p, const T* source, Comm& comm) {
  std::vector<T> whole(static_cast<std::size_t>(p.is_shard() ? p.size() * p.shard.ranks : p.size()));
  if (!p.is_shard()) {
    difftx::detail::copy_elements(whole.data(), host_memory(), source, *p.memory, p.size());
    return whole;
  }
  require(p.shard.ranks == comm.size(), "whole_parameter", p.name, "a part of " + std::to_string(comm.size()) + " (comm's ranks)",
          "a part of " + std::to_string(p.shard.ranks));
  Tensor<T, 1> part({p.size()}, comm.memory()), gathered({p.size() * p.shard.ranks}, comm.memory());
  difftx::detail::copy_elements(part.data(), comm.memory(), source, *p.memory, p.size());
  comm.all_gather(part.const_view(), gathered.view());
  detail::wait_for(comm);
  std::vector<T> rank_major(whole.size());
  difftx::detail::copy_elements(rank_major.data(), host_memory(), gathered.data(), comm.memory(), gathered.size());
  join_shards(p, rank_major.data(), whole.data());
  return whole;
}

// clip_grad_norm (optim/adamw.hpp) for a tensor-parallel model: the norm of
// the whole model's gradients, the split parameters' parts summed over the
// ranks (one all-reduce) and the whole ones, equal everywhere, counted once.
// Collective; every rank clips by the same factor and gets the same norm.
template <Scalar T, communicator Comm>
double clip_grad_norm(const std::vector<parameter_ref<T>>& parameters, double max_norm, Comm& comm) {
  constexpr std::string_view where = "parallel::clip_grad_norm";
  std::vector<parameter_ref<T>> parts, wholes;
  for (const auto& p : parameters) (p.is_shard() ? parts : wholes).push_back(p);
  Tensor<double, 1> sum({1}, comm.memory());
  const double mine = difftx::detail::gradient_sum_of_squares(parts, where);
  difftx::detail::copy_elements(sum.data(), comm.memory(), &mine, host_memory(), 1);
  comm.all_reduce_sum(sum.view());
  detail::wait_for(comm);
  double total = 0;
  difftx::detail::copy_elements(&total, host_memory(), sum.data(), comm.memory(), 1);
  const double norm = std::sqrt(total + difftx::detail::gradient_sum_of_squares(wholes, where));
  difftx::detail::clip_to_norm(parameters, norm, max_norm);
  return norm;
}

// The Differential Transformer layer with its attention and SwiGLU split over
// Comm's ranks: construct with (DecoderLayerConfig, comm, policy).
template <class Comm, Scalar T, index_t D, class Policy = policy::reference>
  requires supported_by<Policy, T>
using TensorParallelDecoderLayer =
    BasicDecoderLayer<TensorParallel<MultiHead<T, D, Policy>, Comm>, TensorParallel<SwiGLU<T, Policy>, Comm>>;

// The same around differential attention V2.
template <class Comm, Scalar T, index_t D, class Policy = policy::reference>
  requires supported_by<Policy, T>
using TensorParallelDecoderLayerV2 =
    BasicDecoderLayer<TensorParallel<MultiHeadV2<T, D, Policy>, Comm>, TensorParallel<SwiGLU<T, Policy>, Comm>>;

}  // namespace difftx::parallel
