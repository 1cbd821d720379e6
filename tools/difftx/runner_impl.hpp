// module_runner<Module>, and detail::make_for_policy, which picks the module
// kind for one policy and number type. Only the units that instantiate the
// runners include this (the generated policy_runners_<policy>_<type>.cpp, see
// policy_runners.hpp; the nvcc-compiled runners_cuda.cu), so the build splits
// by policy and type.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>
#include <variant>
#if defined(_OPENMP)
#include <omp.h>
#endif

#include <difftx/difftx.hpp>
#include <difftx/io/npy.hpp>
#include <difftx/io/parameters.hpp>
#include <difftx/policy/cuda/attention_path.hpp>  // attention_paths_of (host code)

#include "module_configs.hpp"
#include "runner.hpp"

namespace difftx::cli {

// Milliseconds that `work` takes on Policy: the host clock around it, for a
// policy whose calls return when their work is done. An asynchronous policy
// specialises it (runners_cuda.cu: CUDA events on the stream, read only
// after the stop event has completed).
template <class Policy>
struct work_timer {
  static double elapsed_ms(const Policy&, const std::function<void()>& work) {
    const auto start = std::chrono::steady_clock::now();
    work();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  }
};

// The threads a policy's kernels run on: its `threads` (0: OpenMP's default), or 1 for a policy without threads.
template <class Policy>
int policy_threads([[maybe_unused]] const Policy& policy) {
  if constexpr (requires { policy.threads; }) {
#if defined(_OPENMP)
    return policy.threads > 0 ? policy.threads : omp_get_max_threads();
#endif
  }
  return 1;
}

// What a module's or model's kernels run on under policy for T, asked of the
// policy itself (simd's matmul_kernel, bf16_product_used,
// bf16_decoding_product_used, score_tile_kernel, amx_tiles_used); Products:
// the type of the products of many rows (T, or std::int8_t for int8
// weights); logit_bits and qk: the attention's low-bit options. A policy
// without those choices reports "".
template <class T, class Products = T, class Policy>
kernel_report kernel_report_of(const Policy& policy, int logit_bits, inference_dtype qk) {
  kernel_report report;
  constexpr bool bf16 = std::is_same_v<Products, Eigen::bfloat16>;
  if constexpr (requires { policy.template matmul_kernel<Products>(); }) {
    const auto path_name = [](auto path) {
      return path == Policy::bf16_product::dot_instructions ? "vdpbf16ps" : "converting";
    };
    report.products = policy.template matmul_kernel<Products>();
    if (report.products.empty()) report.products = bf16 ? path_name(policy.bf16_product_used()) : "difftx";
    if constexpr (bf16) report.decoding_products = path_name(policy.bf16_decoding_product_used());
  }
  if constexpr (requires { policy.template score_tile_kernel<T>(logit_bits, qk); })
    report.score_tiles = policy.template score_tile_kernel<T>(logit_bits, qk);
  if constexpr (requires { policy.amx_tiles_used(); }) report.amx_tiles = policy.amx_tiles_used();
  return report;
}

// The attention calls the policy's context counted, by path (policy::cuda); "" for other policies.
template <class Policy>
std::string attention_paths_of(const Policy& policy) {
  std::string paths;
  if constexpr (requires { policy.context->attention_calls; })
    for (int path = 0; path < attention_path_count; ++path)
      if (const long long calls = policy.context->attention_calls[static_cast<std::size_t>(path)].load(); calls > 0)
        paths += (paths.empty() ? "" : ", ") + std::string(path_name(static_cast<attention_path>(path))) + " " +
                 std::to_string(calls);
  return paths;
}

template <class Module>
class module_runner final : public runner {
  using T = typename Module::value_type;

 public:
  // build() returns the module of spec, built in place (no move).
  template <class Build>
  module_runner(const module_spec& spec, Build&& build)
      : d_model_(spec.d_model()), has_attention_(spec.kind->has_attention()), logit_bits_(spec.attention.logit_bits),
        qk_(spec.attention.qk_dtype), module_(build()) {}

  // Checks finiteness after loading, in T (so a float16 overflow shows too);
  // on a failure the module keeps the values, as the tool stops anyway.
  void load(const io::tensor_file& weights, const std::string& label) override {
    io::load_parameters(module_, weights, label);
    for (const auto& [name, t] : parameters(io::dtype::f64).tensors) t.require_finite("run", as_type(label + ": " + name));
  }
  io::tensor_file parameters(io::dtype type) override {
    io::tensor_file file;
    io::store_parameters(file, module_, type);
    return file;
  }
  io::tensor_file gradients(io::dtype type) override {
    io::tensor_file file;
    io::store_gradients(file, module_, type);
    return file;
  }
  void zero_grad() override { difftx::zero_grad(module_); }

  void set_input(const io::stored_tensor& x, const std::string& label) override {
    require(x.shape.size() == 3 && x.shape[0] > 0 && x.shape[1] > 0 && x.shape[2] == d_model_, "run", label + ": input",
            "shape [B, N, " + std::to_string(d_model_) + "] with B, N >= 1 (C = d_model of the module)",
            "shape " + shape_string(x.shape));
    x_ = to_module(x, label + ": input", {x.shape[0], x.shape[1], x.shape[2]});
  }
  void set_grad_output(const io::stored_tensor& dy, const std::string& label) override {
    dy_ = to_module(dy, label + ": grad_output", module_.output_shape(x_.shape()));
  }
  // y and dx are allocated here, not with the input, so the caller's stored
  // copy of the file is gone by then (peak memory: input and output, not three copies).
  void forward() override {
    y_.resize(module_.output_shape(x_.shape()), memory());
    module_.forward(x_.view(), y_.view(), saved_);
  }
  void backward() override {
    dx_.resize(x_.shape(), memory());
    module_.backward(x_.view(), dy_.view(), saved_, dx_.view());
  }
  void prepare_decode(inference_dtype weights, inference_dtype cache) override {
    if constexpr (has_cache) {
      const index_t B = x_.extent(0), N = x_.extent(1), C = x_.extent(2);
      if (weights == inference_dtype::int8)
        quantize(module_);
      else
        module_.add_decoding_panels();
      cache_ = module_.make_cache(B, N + 1, cache);
      y_.resize(x_.shape(), memory());
      module_.prefill(x_.view(), cache_, y_.view());
      token_.resize({B, 1, C}, memory());
      step_y_.resize({B, 1, C}, memory());
      for (index_t b = 0; b < B; ++b)
        memory().copy(token_.view()[b].data(), x_.view()[b][N - 1].data(), static_cast<std::size_t>(C) * sizeof(T));
      context_ = N;
    } else {
      throw input_error("bench", "--decode", "a module with attention (" + attention_kind_names() + ")",
                        "a module without a KV cache");
    }
  }
  void decode_step() override {
    if constexpr (has_cache) {
      if constexpr (requires { cache_.truncate(context_); })
        cache_.truncate(context_);
      else
        for (auto& layer_cache : cache_) layer_cache.truncate(context_);
      module_.decode(token_.view(), cache_, step_y_.view());
    }
  }
  void require_finite_output() const override {
    double value = 0;
    const index_t i = detail::first_non_finite_index(y_.data(), y_.size(), y_.memory(), value);
    if (i < 0) return;
    const auto began = first_non_finite(saved_);
    throw input_error("run", "output", "finite values from finite inputs and weights",
                      std::to_string(value) + " at " + position(y_.shape(), i) + " as " +
                          std::string(scalar_traits<T>::name) + "; first non-finite intermediate: " +
                          (began ? began->describe() : "none (the output projection overflows)"));
  }
  void require_finite_gradients() override {
    double value = 0;
    if (const index_t i = detail::first_non_finite_index(dx_.data(), dx_.size(), dx_.memory(), value); i >= 0)
      throw input_error("run", "grad_input", "finite values from finite inputs, weights and dY",
                        std::to_string(value) + " at " + position(dx_.shape(), i) + ": the backward overflows " +
                            std::string(scalar_traits<T>::name));
    for (const auto& p : module_.parameters())
      if (const index_t i = detail::first_non_finite_index(p.grad, p.size(), *p.memory, value); i >= 0)
        throw input_error("run", "gradient of " + p.name, "finite values from finite inputs, weights and dY",
                          std::to_string(value) + " at flat index " + std::to_string(i) +
                              ": the backward overflows " + std::string(scalar_traits<T>::name));
  }
  io::stored_tensor output(io::dtype type) const override { return to_stored(y_, type); }
  void write_output(std::ostream& out, io::dtype type, const std::string& label) const override {
    write_npy(out, y_, type, label);
  }
  void write_grad_input(std::ostream& out, io::dtype type, const std::string& label) const override {
    write_npy(out, dx_, type, label);
  }
  io::stored_tensor grad_input(io::dtype type) const override { return to_stored(dx_, type); }

  double elapsed_ms(const std::function<void()>& work) const override {
    return work_timer<typename Module::policy_type>::elapsed_ms(module_.policy(), work);
  }

  int threads() const override { return policy_threads(module_.policy()); }
  kernel_report kernels() const override {
    auto report = kernel_report_of<T>(module_.policy(), logit_bits_, qk_);
    if (!has_attention_) report.score_tiles.clear();
    return report;
  }
  std::string attention_paths() const override { return attention_paths_of(module_.policy()); }

 private:
  memory_resource& memory() const { return module_.policy().memory(); }
  static std::string as_type(const std::string& name) { return name + " as " + std::string(scalar_traits<T>::name); }
  // "[b, n, c]" for flat index i of shape.
  static std::string position(const shape_t<3>& shape, index_t i) {
    return shape_string(shape_t<3>{i / (shape[1] * shape[2]), i / shape[2] % shape[1], i % shape[2]});
  }

  // A stored tensor of the expected shape as T in the policy's memory; its
  // values must be finite in T (a float32 value can overflow float16).
  Tensor<T, 3> to_module(const io::stored_tensor& t, const std::string& name, const shape_t<3>& shape) const {
    auto host = t.to_tensor<T, 3>("run", name, shape);
    require_finite("run", as_type(name), host.view());
    if (memory().space() == memory_space::host) return host;
    Tensor<T, 3> out(shape, memory());
    memory().upload(out.data(), host.data(), static_cast<std::size_t>(host.size()) * sizeof(T));
    return out;
  }
  static void write_npy(std::ostream& out, const Tensor<T, 3>& t, io::dtype type, const std::string& label) {
    if (t.space() == memory_space::host)
      io::write_npy_to(out, type, t.const_view(), label);
    else
      io::write_npy_to(out, to_stored(t, type), label);
  }
  static io::stored_tensor to_stored(const Tensor<T, 3>& t, io::dtype type) {
    if (t.space() == memory_space::host) return io::stored_tensor::from_view(type, t.const_view());
    Tensor<T, 3> host(t.shape());
    t.memory().download(host.data(), t.data(), static_cast<std::size_t>(t.size()) * sizeof(T));
    return io::stored_tensor::from_view(type, host.const_view());
  }

  static constexpr bool has_cache = requires { typename Module::cache_type; };
  template <class M>
  struct cache_of {
    using type = std::monostate;
  };
  template <class M>
    requires requires { typename M::cache_type; }
  struct cache_of<M> {
    using type = typename M::cache_type;
  };

  index_t d_model_;
  bool has_attention_;
  int logit_bits_;
  inference_dtype qk_;
  Module module_;
  Tensor<T, 3> x_, y_, dy_, dx_;
  typename Module::saved_type saved_;
  typename cache_of<Module>::type cache_;  // decoding only
  Tensor<T, 3> token_, step_y_;            // [B, 1, C] the decoded token and its output
  index_t context_ = 0;
};

namespace detail {

// The policy object every module of a runner gets: each field of o the policy
// has (threads, simd's bf16_products, matmuls and amx_tiles, cuda's attention),
// one enumerator to its own.
template <class Policy>
Policy make_policy(const policy_options& o) {
  Policy policy{};
  if constexpr (requires { policy.attention; }) policy.attention = o.cuda_attention;
  if constexpr (requires { policy.threads; })
    if (o.threads > 0) policy.threads = o.threads;
  if constexpr (requires { policy.bf16_products; }) {
    using path = typename Policy::bf16_product;  // dependent: CUDA builds see no simd header
    switch (o.bf16_product) {
      case bf16_product_choice::automatic: policy.bf16_products = path::automatic; break;
      case bf16_product_choice::converting: policy.bf16_products = path::converting; break;
      case bf16_product_choice::dot_instructions: policy.bf16_products = path::dot_instructions; break;
    }
  }
  if constexpr (requires { policy.matmuls; }) {
    using library = typename Policy::matmul_library;
    switch (o.matmuls) {
      case matmul_choice::automatic: policy.matmuls = library::automatic; break;
      case matmul_choice::difftx: policy.matmuls = library::difftx; break;
      case matmul_choice::onednn: policy.matmuls = library::onednn; break;
    }
  }
  if constexpr (requires { policy.amx_tiles; }) policy.amx_tiles = o.amx_tiles;
  return policy;
}

// The module of table row Row (module_kinds.hpp) at the run-time head size
// (s.attention.head_dim), built from s.
template <std::size_t Row, class T, class Policy>
auto build_module(const module_spec& s, const Policy& policy) {
  constexpr module_kind kind = module_kinds[Row];
  if constexpr (kind.parts == module_parts::norm) {
    return RMSNorm<T, Policy>(s.d_model(), s.eps, 1.0, policy);
  } else if constexpr (kind.parts == module_parts::ffn) {
    return SwiGLU<T, Policy>(s.d_model(), s.ffn_dim, policy);
  } else {
    using Attn = attention_module<kind.attention, T, dynamic, Policy>;
    if constexpr (kind.parts == module_parts::attention) {
      return Attn(attention_config<kind.attention>(s), policy);
    } else if constexpr (kind.parts == module_parts::layer) {
      return BasicDecoderLayer<Attn>(layer_config<kind.attention>(s), policy);
    } else {
      std::vector<BasicDecoderLayer<Attn>> layers;
      for (index_t l = 0; l < s.layers; ++l) layers.emplace_back(layer_config<kind.attention>(s, l), policy);
      return Stack<BasicDecoderLayer<Attn>>(std::move(layers));
    }
  }
}

// The runner of row Row on Policy.
template <std::size_t Row, class T, class Policy>
std::unique_ptr<runner> make_row(const module_spec& s, const policy_options& o) {
  const auto policy = make_policy<Policy>(o);
  using Module = decltype(build_module<Row, T, Policy>(s, policy));
  return std::make_unique<module_runner<Module>>(s, [&] { return build_module<Row, T, Policy>(s, policy); });
}

// The runner of spec's kind on Policy.
template <class T, class Policy>
std::unique_ptr<runner> make_for_policy(const module_spec& s, const policy_options& o) {
  std::unique_ptr<runner> made;
  [&]<std::size_t... Row>(std::index_sequence<Row...>) {
    ((s.kind == &module_kinds[Row] && (made = make_row<Row, T, Policy>(s, o))) || ...);
  }(std::make_index_sequence<std::size(module_kinds)>{});
  require(made != nullptr, "make_runner", "kind", "a module kind of the table (module_kinds.hpp)",
          s.kind ? std::string(s.kind->name) : "none");
  return made;
}

}  // namespace detail

}  // namespace difftx::cli
