// difftx._ext: the compiled half of the PyTorch extension. Python
// (difftx/torch.py) validates every argument, allocates the outputs and
// passes contiguous, detached tensors; each entry here checks their number
// types, device and contiguity once more (TypeError, ValueError), picks the
// number type and device, and runs kernels<T, Device> (kernels.hpp) on the
// tensors' memory without the GIL.
#include <cstdint>
#include <string>
#include <vector>

#include <difftx/core/scalar_traits.hpp>  // Eigen::half, Eigen::bfloat16
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/vector.h>

#include "handles.hpp"
#include "kernels.hpp"

namespace nb = nanobind;
using namespace difftx_python;

namespace {

using array = nb::ndarray<>;

enum class number_type { float32, float64, float16, bfloat16 };

const char* name_of(number_type t) {
  switch (t) {
    case number_type::float32: return "float32";
    case number_type::float64: return "float64";
    case number_type::float16: return "float16";
    case number_type::bfloat16: return "bfloat16";
  }
  return "?";
}

[[noreturn]] void fail_type(const std::string& message) { throw nb::type_error(message.c_str()); }
[[noreturn]] void fail_value(const std::string& message) { throw nb::value_error(message.c_str()); }

number_type number_type_of(const array& a, const char* name) {
  const auto d = a.dtype();
  using code = nb::dlpack::dtype_code;
  if (d.lanes == 1 && d.code == static_cast<std::uint8_t>(code::Float) && d.bits == 32) return number_type::float32;
  if (d.lanes == 1 && d.code == static_cast<std::uint8_t>(code::Float) && d.bits == 64) return number_type::float64;
  if (d.lanes == 1 && d.code == static_cast<std::uint8_t>(code::Float) && d.bits == 16) return number_type::float16;
  if (d.lanes == 1 && d.code == static_cast<std::uint8_t>(code::Bfloat) && d.bits == 16) return number_type::bfloat16;
  fail_type(std::string(name) + ": expected float32, float64, float16 or bfloat16");
}
// lambda, lse and the RoPE tables are in the accumulation type of the call's type.
number_type accumulation_of(number_type t) { return t == number_type::float64 ? t : number_type::float32; }

// One call's number type and device, from its first tensor; every other
// tensor must be on that device and of the type asked of it.
class call {
 public:
  call(const array& first, const char* name) : type_(number_type_of(first, name)) {
    const int kind = first.device_type();
    if (kind != nb::device::cpu::value && kind != nb::device::cuda::value)
      fail_value(std::string(name) + ": expected a CPU or CUDA tensor");
    on_cuda_ = kind == nb::device::cuda::value;
    device_ = on_cuda_ ? first.device_id() : -1;
  }

  // a as a tensor_ref, once checked; accumulation: of the accumulation type.
  tensor_ref ref(const array& a, const char* name, bool accumulation = false) const {
    const number_type wanted = accumulation ? accumulation_of(type_) : type_, got = number_type_of(a, name);
    if (got != wanted) fail_type(std::string(name) + ": expected " + name_of(wanted) + ", got " + name_of(got));
    const bool same_device = a.device_type() == (on_cuda_ ? nb::device::cuda::value : nb::device::cpu::value) &&
                             (!on_cuda_ || a.device_id() == device_);
    if (!same_device) fail_value(std::string(name) + ": expected the device of the call's first tensor");
    tensor_ref r{a.data(), {}};
    std::int64_t stride = 1;
    for (std::size_t i = a.ndim(); i-- > 0;) {
      if (a.shape(i) != 1 && a.stride(i) != stride) fail_value(std::string(name) + ": expected a contiguous tensor");
      stride *= static_cast<std::int64_t>(a.shape(i));
    }
    for (std::size_t i = 0; i < a.ndim(); ++i) r.shape.push_back(static_cast<std::int64_t>(a.shape(i)));
    return r;
  }
  std::vector<tensor_ref> refs(const std::vector<array>& arrays, const char* name) const {
    std::vector<tensor_ref> out;
    for (const auto& a : arrays) out.push_back(ref(a, name));
    return out;
  }
  execution where(int threads, std::uintptr_t stream) const { return {threads, device_, stream}; }

  // f(kernels<T, Device>{}) for this call's type and device, without the GIL.
  template <class F>
  void run(F&& f) const {
    if (!on_cuda_) return run_on<cpu>(f);
#if defined(DIFFTX_PYTHON_CUDA)
    run_on<cuda>(f);
#else
    fail_value("difftx was built without CUDA, so it takes CPU tensors only (docs/guide/pytorch.md: building with CUDA)");
#endif
  }

 private:
  template <class Device, class F>
  void run_on(F& f) const {
    const nb::gil_scoped_release unlocked;
    switch (type_) {
      case number_type::float32: return f(kernels<float, Device>{});
      case number_type::float64: return f(kernels<double, Device>{});
      case number_type::float16: return f(kernels<Eigen::half, Device>{});
      case number_type::bfloat16: return f(kernels<Eigen::bfloat16, Device>{});
    }
  }

  number_type type_;
  bool on_cuda_ = false;
  int device_ = -1;
};

// An attention call's tensors and its backward's, checked.
attention_tensors attention_refs(const call& c, const array& q, const array& k, const array& v, const array& lambda,
                                 const array& o, const array& o2, const array& lse) {
  return {c.ref(q, "q"), c.ref(k, "k"),   c.ref(v, "v"),         c.ref(lambda, "lambda", true),
          c.ref(o, "o"), c.ref(o2, "o2"), c.ref(lse, "lse", true)};
}
attention_gradients gradient_refs(const call& c, const array& d_o, const array& dq, const array& dk, const array& dv,
                                  const array& dlambda) {
  return {c.ref(d_o, "do"), c.ref(dq, "dq"), c.ref(dk, "dk"), c.ref(dv, "dv"), c.ref(dlambda, "dlambda", true)};
}

using host_integers = nb::ndarray<const std::int64_t, nb::ndim<1>, nb::device::cpu, nb::c_contig>;
std::vector<std::int64_t> values_of(const host_integers& a) { return {a.data(), a.data() + a.shape(0)}; }

}  // namespace

NB_MODULE(_ext, m) {
  m.doc() = "difftx's compiled entries for difftx.torch (internal: use difftx.torch)";
#if defined(DIFFTX_PYTHON_CUDA)
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif

  m.def("attention_forward", [](array q, array k, array v, array lambda, bool causal, array o, array o2, array lse,
                                int threads, std::uintptr_t stream) {
    const call c(q, "q");
    const auto t = attention_refs(c, q, k, v, lambda, o, o2, lse);
    c.run([&](auto kernel) { kernel.attention_forward(c.where(threads, stream), t, causal); });
  });

  m.def("attention_backward", [](array q, array k, array v, array lambda, bool causal, array o, array o2, array lse,
                                 array d_o, array dq, array dk, array dv, array dlambda, int threads,
                                 std::uintptr_t stream) {
    const call c(q, "q");
    const auto t = attention_refs(c, q, k, v, lambda, o, o2, lse);
    const auto g = gradient_refs(c, d_o, dq, dk, dv, dlambda);
    c.run([&](auto kernel) { kernel.attention_backward(c.where(threads, stream), t, g, causal); });
  });

  m.def("attention_varlen_forward", [](array q, array k, array v, array lambda, host_integers cu_q,
                                       host_integers cu_k, bool causal, array o, array o2, array lse, int threads,
                                       std::uintptr_t stream) {
    const call c(q, "q");
    const auto t = attention_refs(c, q, k, v, lambda, o, o2, lse);
    const sequence_offsets offsets{values_of(cu_q), values_of(cu_k)};
    c.run([&](auto kernel) { kernel.attention_varlen_forward(c.where(threads, stream), t, offsets, causal); });
  });

  m.def("attention_varlen_backward", [](array q, array k, array v, array lambda, host_integers cu_q,
                                        host_integers cu_k, bool causal, array o, array o2, array lse, array d_o,
                                        array dq, array dk, array dv, array dlambda, int threads,
                                        std::uintptr_t stream) {
    const call c(q, "q");
    const auto t = attention_refs(c, q, k, v, lambda, o, o2, lse);
    const auto g = gradient_refs(c, d_o, dq, dk, dv, dlambda);
    const sequence_offsets offsets{values_of(cu_q), values_of(cu_k)};
    c.run([&](auto kernel) { kernel.attention_varlen_backward(c.where(threads, stream), t, g, offsets, causal); });
  });

  m.def("multihead_forward", [](array x, std::vector<array> parameters, array cos, array sin, array y,
                                std::int64_t embed_dim, std::int64_t heads, std::int64_t kv_heads,
                                std::int64_t head_dim, std::int64_t layer_index, double subln_eps, bool causal,
                                int threads, std::uintptr_t stream) {
    const call c(x, "x");
    const tensor_ref xr = c.ref(x, "x"), cr = c.ref(cos, "cos", true), sr = c.ref(sin, "sin", true),
                     yr = c.ref(y, "y");
    const auto pr = c.refs(parameters, "parameters");
    const multihead_config config{embed_dim, heads, kv_heads, head_dim, layer_index, subln_eps, causal};
    std::unique_ptr<saved_state> state;
    c.run([&](auto kernel) { state = kernel.multihead_forward(c.where(threads, stream), config, xr, pr, cr, sr, yr); });
    return handles::export_state(std::move(state));
  });

  m.def("multihead_backward", [](array handle, array x, array dy, array cos, array sin, array dx,
                                 std::vector<array> gradients, int threads, std::uintptr_t stream) {
    saved_state* state = handles::find(handle.data());
    if (!state) fail_value("handle: expected the handle a live multihead forward returned");
    const call c(x, "x");
    const tensor_ref xr = c.ref(x, "x"), dyr = c.ref(dy, "dy"), cr = c.ref(cos, "cos", true),
                     sr = c.ref(sin, "sin", true), dxr = c.ref(dx, "dx");
    const auto gr = c.refs(gradients, "gradients");
    bool matched = false;
    c.run([&](auto kernel) {
      matched = kernel.multihead_backward(c.where(threads, stream), *state, xr, dyr, cr, sr, dxr, gr);
    });
    if (!matched) fail_value("handle: expected the handle of a forward of x's number type and device");
  });
}
