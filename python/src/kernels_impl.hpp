// The definitions of kernels.hpp's entries: each is difftx's op or module
// called on views of the caller's memory, nothing copied. A device's session
// (device_traits<Device>::session: the policy, and for CUDA the device and the
// ordering against PyTorch's stream) lives for the call. Included, after their
// device's traits, by the units that instantiate a type (cpu_<type>.cpp, cuda_<type>.cu).
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <difftx/difftx.hpp>

#include "kernels.hpp"

namespace difftx_python {

using difftx::accum_t;
using difftx::index_t;
using difftx::shape_t;
using difftx::TensorView;

// A view of t as rank R with t's own shape, or with `shape` (the same element count).
template <class T, std::size_t R, class Device>
TensorView<T, R> view(const tensor_ref& t, const shape_t<R>& shape) {
  index_t count = 1;
  for (auto e : t.shape) count *= e;
  difftx::require(difftx::element_count<R>(shape) == count, "difftx extension", "tensor",
                  [&] { return difftx::shape_string(shape); }, [&] { return difftx::shape_string(t.shape); });
  return {static_cast<T*>(t.data), shape, device_traits<Device>::space};
}
template <class T, std::size_t R, class Device>
TensorView<T, R> view(const tensor_ref& t) {
  shape_t<R> shape{};
  difftx::require(t.shape.size() == R, "difftx extension", "tensor", [] { return std::to_string(R) + " dimensions"; },
                  [&] { return difftx::shape_string(t.shape); });
  for (std::size_t a = 0; a < R; ++a) shape[a] = t.shape[a];
  return view<T, R, Device>(t, shape);
}
// Heads in pairs, FlashAttention's [..., 2H, d] seen as difftx's [..., H, 2, d]
// (head h's two maps are heads 2h and 2h + 1), with `batch` in front.
template <class T, class Device>
TensorView<T, 5> head_pairs(const tensor_ref& t, index_t batch) {
  const auto& s = t.shape;
  const index_t rows = s.size() == 4 ? s[1] : s[0], heads = s[s.size() - 2], d = s.back();
  return view<T, 5, Device>(t, {batch, rows, heads / 2, 2, d});
}
// [B, N, ...] (or [T, ...] packed, as [1, T, ...]) as rank 4.
template <class T, class Device>
TensorView<T, 4> rows_of(const tensor_ref& t) {
  const auto& s = t.shape;
  if (s.size() == 3) return view<T, 4, Device>(t, {1, s[0], s[1], s[2]});
  return view<T, 4, Device>(t);
}

// The attention's operands as the op takes them: [B, rows, ...], or a packed
// batch [T, ...] as one sequence [1, T, ...] (the lse [H, 2, T] as [1, H, 2, T]).
template <class T, class Device>
struct attention_views {
  using A = accum_t<T>;
  TensorView<T, 5> q, k;
  TensorView<T, 4> v, o, o2;
  TensorView<A, 1> lambda;
  TensorView<A, 4> lse;
  explicit attention_views(const attention_tensors& t)
      : q(head_pairs<T, Device>(t.q, batch(t))), k(head_pairs<T, Device>(t.k, batch(t))), v(rows_of<T, Device>(t.v)),
        o(rows_of<T, Device>(t.o)), o2(rows_of<T, Device>(t.o2)), lambda(view<A, 1, Device>(t.lambda)),
        lse(t.lse.shape.size() == 3 ? view<A, 4, Device>(t.lse, {1, t.lse.shape[0], t.lse.shape[1], t.lse.shape[2]})
                                    : view<A, 4, Device>(t.lse)) {}
  static index_t batch(const attention_tensors& t) { return t.q.shape.size() == 4 ? t.q.shape[0] : 1; }
};
template <class T, class Device>
struct gradient_views {
  using A = accum_t<T>;
  TensorView<T, 4> d_o, dv;
  TensorView<T, 5> dq, dk;
  TensorView<A, 1> dlambda;
  gradient_views(const attention_gradients& g, index_t batch)
      : d_o(rows_of<T, Device>(g.d_o)), dv(rows_of<T, Device>(g.dv)), dq(head_pairs<T, Device>(g.dq, batch)),
        dk(head_pairs<T, Device>(g.dk, batch)), dlambda(view<A, 1, Device>(g.dlambda)) {}
};

template <class T, class Device>
void kernels<T, Device>::attention_forward(const execution& e, const attention_tensors& t, bool causal) {
  typename device_traits<Device>::session s(e);
  const attention_views<T, Device> a(t);
  difftx::attention_forward<2>(s.p, a.q, a.k, a.v, a.lambda, causal, a.o, a.o2, a.lse);
}

template <class T, class Device>
void kernels<T, Device>::attention_backward(const execution& e, const attention_tensors& t,
                                            const attention_gradients& g, bool causal) {
  typename device_traits<Device>::session s(e);
  const attention_views<T, Device> a(t);
  const gradient_views<T, Device> d(g, a.q.extent(0));
  difftx::attention_backward<2>(s.p, a.q, a.k, a.v, a.lambda, causal, a.o, a.o2, a.lse, d.d_o, d.dq, d.dk, d.dv,
                                d.dlambda);
}

// f(queries, keys) for each sequence of a packed batch that has queries: its
// query rows and its key rows (modules/sequences.hpp's packed_sequence).
template <class F>
void for_each_sequence_pair(const sequence_offsets& offsets, F&& f) {
  const auto &q = offsets.queries, &k = offsets.keys;
  for (std::size_t s = 0; s + 1 < q.size(); ++s)
    if (q[s + 1] > q[s])
      f(difftx::detail::packed_sequence{q[s], q[s + 1]}, difftx::detail::packed_sequence{k[s], k[s + 1]});
}

template <class T, class Device>
void kernels<T, Device>::attention_varlen_forward(const execution& e, const attention_tensors& t,
                                                  const sequence_offsets& offsets, bool causal) {
  typename device_traits<Device>::session s(e);
  const attention_views<T, Device> a(t);
  for_each_sequence_pair(offsets, [&](const auto& sq, const auto& sk) {
    difftx::attention_forward<2>(s.p, sq.rows(a.q), sk.rows(a.k), sk.rows(a.v), a.lambda, causal, sq.rows(a.o),
                                 sq.rows(a.o2), sq.lse(a.lse));
  });
}

template <class T, class Device>
void kernels<T, Device>::attention_varlen_backward(const execution& e, const attention_tensors& t,
                                                   const attention_gradients& g, const sequence_offsets& offsets,
                                                   bool causal) {
  typename device_traits<Device>::session s(e);
  const attention_views<T, Device> a(t);
  const gradient_views<T, Device> d(g, 1);
  // Each call assigns its dlambda; the batch's is their sum (the caller zeroed it).
  difftx::Tensor<accum_t<T>, 1> part(d.dlambda.shape(), s.p.memory());
  for_each_sequence_pair(offsets, [&](const auto& sq, const auto& sk) {
    difftx::attention_backward<2>(s.p, sq.rows(a.q), sk.rows(a.k), sk.rows(a.v), a.lambda, causal, sq.rows(a.o),
                                  sq.rows(a.o2), sq.lse(a.lse), sq.rows(d.d_o), sq.rows(d.dq), sk.rows(d.dk),
                                  sk.rows(d.dv), part.view());
    difftx::add_into(s.p, part.const_view(), d.dlambda);
  });
}

// A MultiHead and the saved state of its last forward.
template <class Module>
struct module_in_use {
  std::unique_ptr<Module> module;
  typename Module::saved_type saved;
};

// Idle MultiHeads, by configuration, for the forwards to lease: a forward
// copies its weights into one and runs it into its saved state, which keeps
// it until the backward is done (then it comes back here). So building one,
// zeroing its parameters and gradients and allocating its saved state are
// paid once per configuration and live forward, not per call: a forward of
// the shape it last ran writes the same buffers again, as a C++ training loop
// reuses its saved_type. Never destroyed: handles may outlive static destructors.
template <class Module>
class module_pool {
 public:
  using item = module_in_use<Module>;
  struct key {
    multihead_config config;
    int threads, device;
    friend bool operator==(const key&, const key&) = default;
  };
  static module_pool& instance() {
    static auto* pool = new module_pool();
    return *pool;
  }
  template <class Make>
  std::unique_ptr<item> lease(const key& k, Make&& make) {
    {
      std::lock_guard lock(mutex_);
      for (auto it = idle_.begin(); it != idle_.end(); ++it)
        if (it->first == k) {
          auto leased = std::move(it->second);
          idle_.erase(it);
          return leased;
        }
    }
    auto fresh = std::make_unique<item>();
    fresh->module = make();
    return fresh;
  }
  void give_back(const key& k, std::unique_ptr<item> leased) {
    std::lock_guard lock(mutex_);
    idle_.emplace_back(k, std::move(leased));
  }

 private:
  std::mutex mutex_;
  std::vector<std::pair<key, std::unique_ptr<item>>> idle_;
};

template <class T, class Device>
struct multihead_state final : saved_state {
  using module_type = difftx::MultiHead<T, difftx::dynamic, typename device_traits<Device>::policy>;
  using pool_type = module_pool<module_type>;
  typename pool_type::key key;
  std::unique_ptr<typename pool_type::item> leased;
  ~multihead_state() override {
    if (leased) pool_type::instance().give_back(key, std::move(leased));
  }
};

// A forward's or backward's RoPE tables.
template <class T, class Device>
difftx::rope_table<accum_t<T>> table_of(const tensor_ref& cos, const tensor_ref& sin) {
  using A = accum_t<T>;
  return {view<const A, 2, Device>(cos), view<const A, 2, Device>(sin)};
}

// Each of the module's parameters, in multihead_parameter_names' order.
template <class Module>
std::vector<difftx::parameter_ref<typename Module::value_type>> named_parameters(Module& layer) {
  auto all = layer.parameters();
  std::vector<difftx::parameter_ref<typename Module::value_type>> ordered;
  for (const char* name : multihead_parameter_names)
    for (auto& p : all)
      if (p.name == name) ordered.push_back(p);
  return ordered;
}

template <class T, class Device>
std::unique_ptr<saved_state> kernels<T, Device>::multihead_forward(const execution& e, const multihead_config& c,
                                                                   const tensor_ref& x,
                                                                   const std::vector<tensor_ref>& parameters,
                                                                   const tensor_ref& cos, const tensor_ref& sin,
                                                                   const tensor_ref& y) {
  using state_type = multihead_state<T, Device>;
  typename device_traits<Device>::session s(e);
  auto state = std::make_unique<state_type>();
  state->key = {c, e.threads, device_traits<Device>::device_of(e)};
  state->leased = state_type::pool_type::instance().lease(state->key, [&] {
    const difftx::uninitialised_parameters weights_come_next;
    return std::make_unique<typename state_type::module_type>(
        difftx::MultiHeadConfig{.d_model = c.embed_dim, .heads = c.heads, .kv_heads = c.kv_heads,
                                .layer_index = c.layer_index, .causal = c.causal, .head_dim = c.head_dim,
                                .subln_eps = c.subln_eps},
        s.p);
  });
  auto& [layer, saved] = *state->leased;  // not `module`: nvcc warns (3189) at a line starting with it
  const auto targets = named_parameters(*layer);
  difftx::require(targets.size() == parameters.size(), "difftx extension", "parameters",
                  [&] { return std::to_string(targets.size()) + " tensors"; },
                  [&] { return std::to_string(parameters.size()); });
  for (std::size_t i = 0; i < targets.size(); ++i) {
    const auto source = view<const T, 1, Device>(parameters[i], {targets[i].size()});
    targets[i].memory->copy(targets[i].value, source.data(), static_cast<std::size_t>(source.size()) * sizeof(T));
  }
  layer->forward(view<const T, 3, Device>(x), view<T, 3, Device>(y), saved, {}, table_of<T, Device>(cos, sin));
  return state;
}

template <class T, class Device>
bool kernels<T, Device>::multihead_backward(const execution& e, saved_state& state, const tensor_ref& x,
                                            const tensor_ref& dy, const tensor_ref& cos, const tensor_ref& sin,
                                            const tensor_ref& dx, const std::vector<tensor_ref>& gradients) {
  auto* ours = dynamic_cast<multihead_state<T, Device>*>(&state);
  if (!ours) return false;
  typename device_traits<Device>::session s(e);
  auto& [layer_pointer, saved] = *ours->leased;
  auto& layer = *layer_pointer;
  difftx::zero_grad(layer);
  layer.backward(view<const T, 3, Device>(x), view<const T, 3, Device>(dy), saved, view<T, 3, Device>(dx),
                 table_of<T, Device>(cos, sin));
  const auto sources = named_parameters(layer);
  difftx::require(sources.size() == gradients.size(), "difftx extension", "gradients",
                  [&] { return std::to_string(sources.size()) + " tensors"; },
                  [&] { return std::to_string(gradients.size()); });
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const auto target = view<T, 1, Device>(gradients[i], {sources[i].size()});
    sources[i].memory->copy(target.data(), sources[i].grad, static_cast<std::size_t>(target.size()) * sizeof(T));
  }
  return true;
}

}  // namespace difftx_python
