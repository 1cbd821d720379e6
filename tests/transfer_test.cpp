// Moving tensors and parameters between memories (core/transfer.hpp,
// modules/copy_parameters.hpp), and gradcheck on a module whose memory is a
// device's. No GPU is needed: a fake device stands in for one.
//  - fake_device_memory reports memory_space::device and keeps every byte
//    XOR-ed with a key, so code that reads "device" memory through a host
//    pointer instead of downloading it reads garbage and fails the checks.
//  - policy fake_device runs MultiHead's ops as a device policy must look from
//    outside: the reference kernels on host copies of the device tensors, the
//    outputs uploaded back.
// Also policy::cuda's plan cache (policy/cuda/plan_cache.hpp), its choice
// of attention kernels (policy/cuda/attention_path.hpp) and the index
// arithmetic of cuDNN's ragged layout (policy/cuda/ragged_layout.hpp), host
// code that needs no GPU either.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include <difftx/difftx.hpp>
#include <difftx/modules/copy_parameters.hpp>
#include <difftx/policy/cuda/attention_path.hpp>
#include <difftx/policy/cuda/plan_cache.hpp>
#include <difftx/policy/cuda/ragged_layout.hpp>

#include "support/helpers.hpp"

using namespace difftx;
using test_support::expect_input_error;
using test_support::random_tensor;
using test_support::randomise_parameters;

namespace {

class fake_device_memory final : public memory_resource {
 public:
  explicit fake_device_memory(unsigned char key) : key_(key) {}
  void* allocate(std::size_t bytes) override { return host_memory().allocate(bytes); }
  void deallocate(void* p, std::size_t bytes) noexcept override { host_memory().deallocate(p, bytes); }
  void copy(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  void zero(void* p, std::size_t bytes) override { std::memset(p, key_, bytes); }  // encoded zeros
  void upload(void* dst, const void* src, std::size_t bytes) override { transcode(dst, src, bytes); }
  void download(void* dst, const void* src, std::size_t bytes) override { transcode(dst, src, bytes); }
  memory_space space() const noexcept override { return memory_space::device; }

 private:
  void transcode(void* dst, const void* src, std::size_t bytes) const {
    auto* d = static_cast<unsigned char*>(dst);
    const auto* s = static_cast<const unsigned char*>(src);
    for (std::size_t i = 0; i < bytes; ++i) d[i] = s[i] ^ key_;
  }
  unsigned char key_;
};

fake_device_memory& fake_memory() {
  static fake_device_memory memory(0xa5);
  return memory;
}

struct fake_device {
  static constexpr const char* name = "fake_device";
  template <class T>
  static constexpr bool supports = Scalar<T> && std::is_trivially_copyable_v<T>;
  memory_resource& memory() const noexcept { return fake_memory(); }
};

// A kernel argument as the reference kernel takes it: a device view becomes a
// host copy, uploaded back afterwards unless read-only; the rest passes as is.
template <class Arg>
class on_host_arg {
 public:
  explicit on_host_arg(Arg arg) : arg_(arg) {}
  Arg get() const { return arg_; }

 private:
  Arg arg_;
};

template <class T, std::size_t R>
class on_host_arg<TensorView<T, R>> {
 public:
  explicit on_host_arg(TensorView<T, R> view) : device_(view), staged_(view.space() == memory_space::device) {
    if (staged_) host_ = to_host(view, fake_memory());
  }
  on_host_arg(const on_host_arg&) = delete;
  on_host_arg& operator=(const on_host_arg&) = delete;
  ~on_host_arg() {
    if constexpr (!std::is_const_v<T>)
      if (staged_) fake_memory().upload(device_.data(), host_.data(), static_cast<std::size_t>(host_.size()) * sizeof(T));
  }
  TensorView<T, R> get() { return staged_ ? TensorView<T, R>(host_.view()) : device_; }

 private:
  TensorView<T, R> device_;
  bool staged_;
  Tensor<std::remove_const_t<T>, R> host_;
};

template <class Kernel, class... Args>
void on_host(Kernel kernel, Args... args) {
  std::tuple<on_host_arg<Args>...> staged(args...);
  std::apply([&](auto&... a) { kernel(a.get()...); }, staged);
}

// MultiHead's ops on fake_device (signatures as in policy/reference/*.hpp).
template <Scalar T>
void linear_forward(const fake_device&, cview<T, 2> x, cview<T, 2> w, TensorView<T, 2> y) {
  on_host([](auto... a) { linear_forward(policy::reference{}, a...); }, x, w, y);
}
template <Scalar T>
void linear_backward(const fake_device&, cview<T, 2> x, cview<T, 2> w, cview<T, 2> dy, TensorView<T, 2> dx,
                     TensorView<T, 2> dw, write_mode dx_mode) {
  on_host([](auto... a) { linear_backward(policy::reference{}, a...); }, x, w, dy, dx, dw, dx_mode);
}
template <Scalar T>
void rope_forward(const fake_device&, TensorView<T, 4> x, index_t offset, double theta, const rope_scaling& scaling) {
  on_host([](auto... a) { rope_forward(policy::reference{}, a...); }, x, offset, theta, scaling);
}
template <Scalar T>
void rope_backward(const fake_device&, TensorView<T, 4> dx, index_t offset, double theta, const rope_scaling& scaling) {
  on_host([](auto... a) { rope_backward(policy::reference{}, a...); }, dx, offset, theta, scaling);
}
// A caller's rope_table lives on the device too: its cos and sin are staged with x.
template <Scalar T>
void rope_forward(const fake_device&, TensorView<T, 4> x, index_t offset, const rope_table<accum_t<T>>& table) {
  on_host([offset](auto xh, auto cos, auto sin) { rope_forward(policy::reference{}, xh, offset, rope_table<accum_t<T>>{cos, sin}); },
          x, table.cos, table.sin);
}
template <Scalar T>
void rope_backward(const fake_device&, TensorView<T, 4> dx, index_t offset, const rope_table<accum_t<T>>& table) {
  on_host([offset](auto dxh, auto cos, auto sin) { rope_backward(policy::reference{}, dxh, offset, rope_table<accum_t<T>>{cos, sin}); },
          dx, table.cos, table.sin);
}
template <int Maps, Scalar T>
void attention_forward(const fake_device&, cview<T, 5> q, cview<T, 5> k, cview<T, 4> v, cview<accum_t<T>, 1> lambda,
                       bool causal, TensorView<T, 4> o, TensorView<T, 4> o2, TensorView<accum_t<T>, 4> lse) {
  on_host([](auto... a) { attention_forward<Maps>(policy::reference{}, a...); }, q, k, v, lambda, causal, o, o2, lse);
}
template <int Maps, Scalar T>
void attention_backward(const fake_device&, cview<T, 5> q, cview<T, 5> k, cview<T, 4> v, cview<accum_t<T>, 1> lambda,
                        bool causal, cview<T, 4> o, cview<T, 4> o2, cview<accum_t<T>, 4> lse, cview<T, 4> d_o,
                        TensorView<T, 5> dq, TensorView<T, 5> dk, TensorView<T, 4> dv,
                        TensorView<accum_t<T>, 1> dlambda) {
  on_host([](auto... a) { attention_backward<Maps>(policy::reference{}, a...); }, q, k, v, lambda, causal, o, o2, lse,
          d_o, dq, dk, dv, dlambda);
}
template <Scalar T>
void diff_lambda_forward(const fake_device&, TensorView<const T, 1> lq1, cview<T, 1> lk1, cview<T, 1> lq2,
                         cview<T, 1> lk2, double lambda_init, TensorView<accum_t<T>, 1> lambda) {
  on_host([](auto... a) { diff_lambda_forward(policy::reference{}, a...); }, lq1, lk1, lq2, lk2, lambda_init, lambda);
}
template <Scalar T>
void diff_lambda_backward(const fake_device&, TensorView<const T, 1> lq1, cview<T, 1> lk1, cview<T, 1> lq2,
                          cview<T, 1> lk2, cview<accum_t<T>, 1> dlambda, TensorView<T, 1> dlq1, TensorView<T, 1> dlk1,
                          TensorView<T, 1> dlq2, TensorView<T, 1> dlk2) {
  on_host([](auto... a) { diff_lambda_backward(policy::reference{}, a...); }, lq1, lk1, lq2, lk2, dlambda, dlq1, dlk1,
          dlq2, dlk2);
}
template <Scalar T>
void rmsnorm_forward(const fake_device&, cview<T, 2> x, cview<T, 1> w, double eps, double scale, TensorView<T, 2> y,
                     TensorView<accum_t<T>, 1> rstd) {
  on_host([](auto... a) { rmsnorm_forward(policy::reference{}, a...); }, x, w, eps, scale, y, rstd);
}
template <Scalar T>
void rmsnorm_backward(const fake_device&, cview<T, 2> x, cview<T, 1> w, cview<accum_t<T>, 1> rstd, double scale,
                      cview<T, 2> dy, TensorView<T, 2> dx, TensorView<T, 1> dw) {
  on_host([](auto... a) { rmsnorm_backward(policy::reference{}, a...); }, x, w, rstd, scale, dy, dx, dw);
}

const MultiHeadConfig small_config{.d_model = 12, .heads = 2, .kv_heads = 1, .layer_index = 2};

template <class T, std::size_t R>
bool same_bits(const Tensor<T, R>& a, const Tensor<T, R>& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(T)) == 0;
}

// Every parameter value (or gradient) of a host module, in order.
template <class Module>
std::vector<double> flat_values(Module& module, bool gradients = false) {
  std::vector<double> all;
  for (const auto& p : module.parameters())
    for (index_t i = 0; i < p.size(); ++i)
      all.push_back(scalar_traits<typename Module::value_type>::to_double(gradients ? p.grad[i] : p.value[i]));
  return all;
}

// Doubles whose bits a sloppy copy would change: signed zero, a subnormal, infinity, NaN.
Tensor<double, 3> awkward_tensor() {
  auto t = random_tensor<double, 3>({2, 3, 5}, 1);
  t(0, 0, 0) = -0.0;
  t(0, 0, 1) = std::numeric_limits<double>::denorm_min();
  t(0, 0, 2) = -std::numeric_limits<double>::infinity();
  t(0, 0, 3) = std::numeric_limits<double>::quiet_NaN();
  return t;
}

}  // namespace

// host_memory_resource (core/memory.hpp) keeps freed blocks of at least
// reuse_threshold bytes for the next allocation of the same size, within its
// limit, the oldest freed leaving first; small blocks go straight back; a
// Tensor built on a kept block is zero all the same. Under AddressSanitizer
// nothing is kept.
TEST_CASE("host memory: freed blocks are reused by size, within the limit") {
  host_memory_resource memory;
  const std::size_t big = 4 * host_memory_resource::reuse_threshold, other = big - 64;
  const bool reuses = host_memory_resource::reuses_freed_blocks;
  void* first = memory.allocate(big);
  memory.deallocate(first, big);
  CHECK(memory.kept_bytes() == (reuses ? big : 0));
  void* another = memory.allocate(other);  // another size does not take it
  CHECK(memory.kept_bytes() == (reuses ? big : 0));
  void* again = memory.allocate(big);
  if (reuses) CHECK(again == first);
  CHECK(memory.kept_bytes() == 0);
  memory.deallocate(again, big);

  void* small = memory.allocate(1024);
  memory.deallocate(small, 1024);
  memory.deallocate(nullptr, big);
  CHECK(memory.kept_bytes() == (reuses ? big : 0));

  memory.deallocate(another, other);
  memory.set_cache_limit(0);
  CHECK(memory.kept_bytes() == 0);

  // Room for two big blocks: freeing a third block gives back the oldest.
  memory.set_cache_limit(2 * big);
  void* oldest = memory.allocate(big);
  void* newer = memory.allocate(big);
  void* last = memory.allocate(other);
  memory.deallocate(oldest, big);
  memory.deallocate(newer, big);
  CHECK(memory.kept_bytes() == (reuses ? 2 * big : 0));
  memory.deallocate(last, other);  // oldest leaves
  CHECK(memory.kept_bytes() == (reuses ? big + other : 0));
  void* reused = memory.allocate(big);
  if (reuses) CHECK(reused == newer);
  CHECK(memory.kept_bytes() == (reuses ? other : 0));
  memory.deallocate(reused, big);
  memory.set_cache_limit(0);
  CHECK(memory.kept_bytes() == 0);
  memory.set_cache_limit(host_memory_resource::default_cache_limit);

  const index_t n = static_cast<index_t>(big / sizeof(float));
  const float* used_block = nullptr;
  {
    Tensor<float, 1> used({n}, memory);
    std::fill_n(used.data(), n, 7.0f);
    used_block = used.data();
  }
  const Tensor<float, 1> fresh({n}, memory);
  if (reuses) CHECK(fresh.data() == used_block);
  CHECK(std::all_of(fresh.data(), fresh.data() + n, [](float x) { return x == 0.0f; }));
  if (!reuses) MESSAGE("AddressSanitizer build: freed blocks are not kept");
}

TEST_CASE("to_memory and to_host: round trips through a device are bit-exact") {
  const auto host = awkward_tensor();
  const auto device = to_memory(host, fake_memory());
  CHECK(device.space() == memory_space::device);
  CHECK(&device.memory() == &fake_memory());
  CHECK(device.shape() == host.shape());
  // The device holds other bytes than the host: reading it directly would be wrong.
  CHECK(std::memcmp(device.data(), host.data(), static_cast<std::size_t>(host.size()) * sizeof(double)) != 0);

  const auto back = to_host(device);
  CHECK(back.space() == memory_space::host);
  CHECK(same_bits(back, host));

  SUBCASE("device to the same device: a copy there") {
    const auto copy = to_memory(device, fake_memory());
    CHECK(copy.data() != device.data());
    CHECK(&copy.memory() == &fake_memory());
    CHECK(same_bits(to_host(copy), host));
  }
  SUBCASE("device to another device, through the host") {
    fake_device_memory other(0x3c);
    const auto there = to_memory(device, other);
    CHECK(&there.memory() == &other);
    CHECK(std::memcmp(there.data(), device.data(), static_cast<std::size_t>(host.size()) * sizeof(double)) != 0);
    CHECK(same_bits(to_host(there), host));
  }
  SUBCASE("host to host: a copy") {
    const auto copy = to_memory(host, host_memory());
    CHECK(copy.data() != host.data());
    CHECK(same_bits(copy, host));
  }
  SUBCASE("views, with the memory they live in") {
    CHECK(same_bits(to_memory(host.view(), fake_memory()), device));
    CHECK(same_bits(to_host(device.view(), fake_memory()), host));
    CHECK(same_bits(to_memory(device.view(), fake_memory(), host_memory()), host));
    const Tensor<double, 2> empty({0, 4});
    const auto empty_back = to_host(to_memory(empty, fake_memory()));
    CHECK(empty_back.shape() == shape_t<2>{0, 4});
  }
}

TEST_CASE("to_memory: a device view without its resource, or with a host one, is refused") {
  const auto device = to_memory(awkward_tensor(), fake_memory());
  expect_input_error([&] { (void)to_memory(device.view(), host_memory()); }, "to_memory", "src", "host memory",
                     "device memory");
  expect_input_error([&] { (void)to_host(device.view(), host_memory()); }, "to_memory", "src", "host memory",
                     "device memory");
  const auto host = awkward_tensor();
  expect_input_error([&] { (void)to_memory(host.view(), fake_memory(), host_memory()); }, "to_memory", "src",
                     "device memory", "host memory");
}

TEST_CASE("copy_parameters: host to device and back, bit for bit") {
  MultiHead<double, 4> host(small_config), back(small_config);
  MultiHead<double, 4, fake_device> device(small_config);
  randomise_parameters(host, 3);
  const auto expected = flat_values(host);
  REQUIRE(flat_values(back) != expected);  // the copy has something to do

  copy_parameters(host, device);
  copy_parameters(device, back);
  CHECK(flat_values(back) == expected);
  for (const auto& p : device.parameters()) CHECK(p.space() == memory_space::device);
}

TEST_CASE("copy_parameters: other number types convert through double") {
  MultiHead<double, 4> wide(small_config);
  MultiHead<float, 4> narrow(small_config);
  MultiHead<float, 4, fake_device> narrow_device(small_config);
  randomise_parameters(wide, 4);
  copy_parameters(wide, narrow_device);  // converted on the host, then uploaded
  copy_parameters(narrow_device, narrow);
  const auto from = flat_values(wide), to = flat_values(narrow);
  REQUIRE(from.size() == to.size());
  bool rounded = true, changed = false;
  for (std::size_t i = 0; i < from.size(); ++i) {
    rounded = rounded && to[i] == static_cast<double>(static_cast<float>(from[i]));
    changed = changed || to[i] != from[i];
  }
  CHECK(rounded);
  CHECK(changed);  // the values were rounded, not copied as bytes
}

TEST_CASE("copy_parameters: mismatched modules throw and leave the destination as it was") {
  SUBCASE("a parameter of another shape, after many that match") {
    DecoderLayer<double, 4> from({small_config, 24}), to({small_config, 32});
    randomise_parameters(from, 5);
    const auto before = flat_values(to);
    expect_input_error([&] { copy_parameters(from, to); }, "copy_parameters", "ffn.gate_proj.weight",
                       "shape [24, 12]", "shape [32, 12]");
    CHECK(flat_values(to) == before);
  }
  SUBCASE("another parameter name") {
    MultiHead<double, 4> from(small_config);
    DecoderLayer<double, 4> to({small_config, 24});
    const auto before = flat_values(to);
    expect_input_error([&] { copy_parameters(from, to); }, "copy_parameters", "to", "'q_proj.weight'",
                       "'attn_norm.weight'");
    CHECK(flat_values(to) == before);
  }
  SUBCASE("fewer parameters (the baseline attention has no lambdas or subln)") {
    MultiHead<double, 4> from(small_config);
    Attention<double, 4> to({.d_model = 12, .heads = 4, .kv_heads = 2});
    randomise_parameters(from, 6);
    const auto before = flat_values(to);
    expect_input_error([&] { copy_parameters(from, to); }, "copy_parameters", "to", "9 parameters", "4");
    CHECK(flat_values(to) == before);
  }
  SUBCASE("gradients: other heads") {
    MultiHead<double, 4> from(small_config);
    MultiHead<double, 4, fake_device> to({.d_model = 12, .heads = 4, .kv_heads = 1, .layer_index = 2});
    expect_input_error([&] { copy_gradients(from, to); }, "copy_gradients", "q_proj.weight", "shape [16, 12]",
                       "shape [32, 12]");
  }
}

TEST_CASE("gradcheck through device memory: the same result as on the host, parameters restored") {
  MultiHead<double, 4> host(small_config), from_device(small_config);
  MultiHead<double, 4, fake_device> device(small_config);
  randomise_parameters(host, 7);
  copy_parameters(host, device);
  const auto x = random_tensor<double, 3>({2, 3, 12}, 8);

  const auto on_host = testing::gradcheck(host, x.view());
  INFO(on_host.report());
  REQUIRE(on_host.passed());

  // x given in host memory, and x already on the device.
  for (const bool x_on_device : {false, true}) {
    CAPTURE(x_on_device);
    const auto x_device = to_memory(x, fake_memory());
    const auto on_device = testing::gradcheck(device, x_on_device ? x_device.view() : x.view());
    INFO(on_device.report());
    CHECK(on_device.passed());
    REQUIRE(on_device.tensors.size() == on_host.tensors.size());
    for (std::size_t i = 0; i < on_host.tensors.size(); ++i) {
      const auto &a = on_device.tensors[i], &b = on_host.tensors[i];
      CAPTURE(b.name);
      CHECK(a.name == b.name);
      CHECK(a.checked == b.checked);
      CHECK(a.worst_error == b.worst_error);  // the same kernels on the same numbers
      CHECK(a.analytic == b.analytic);
      CHECK(a.numeric == b.numeric);
    }
    // Every perturbed value is back, and the gradients left are the host's.
    copy_parameters(device, from_device);
    CHECK(flat_values(from_device) == flat_values(host));
    copy_gradients(device, from_device);
    CHECK(flat_values(from_device, true) == flat_values(host, true));
  }
}

// The reference repo's rel_pos lives where the module does: a rope_table in
// device memory rotates exactly as the same table on the host.
TEST_CASE("MultiHead with a caller's rope_table in device memory: the host's results bit for bit") {
  MultiHead<double, 4> host(small_config), from_device(small_config);
  MultiHead<double, 4, fake_device> device(small_config);
  randomise_parameters(host, 11);
  copy_parameters(host, device);
  const auto x = random_tensor<double, 3>({2, 3, 12}, 12), dy = random_tensor<double, 3>({2, 3, 12}, 13);
  const auto cos = random_tensor<double, 2>({5, 2}, 14), sin = random_tensor<double, 2>({5, 2}, 15);
  const auto cos_device = to_memory(cos, fake_memory()), sin_device = to_memory(sin, fake_memory());
  const auto x_device = to_memory(x, fake_memory()), dy_device = to_memory(dy, fake_memory());

  Tensor<double, 3> y({2, 3, 12}), dx({2, 3, 12});
  MultiHead<double, 4>::saved_type saved;
  host.forward(x.view(), y.view(), saved, {}, {cos.const_view(), sin.const_view()});
  host.backward(x.view(), dy.view(), saved, dx.view(), {cos.const_view(), sin.const_view()});

  Tensor<double, 3> y_device({2, 3, 12}, fake_memory()), dx_device({2, 3, 12}, fake_memory());
  MultiHead<double, 4, fake_device>::saved_type saved_device;
  const MultiHead<double, 4, fake_device>::rope_table_type table_device{cos_device.const_view(), sin_device.const_view()};
  device.forward(x_device.view(), y_device.view(), saved_device, {}, table_device);
  device.backward(x_device.view(), dy_device.view(), saved_device, dx_device.view(), table_device);

  CHECK(same_bits(to_host(y_device.view(), fake_memory()), y));
  CHECK(same_bits(to_host(dx_device.view(), fake_memory()), dx));
  copy_gradients(device, from_device);
  CHECK(flat_values(from_device, true) == flat_values(host, true));
}

TEST_CASE("gradcheck: x in a device memory the module does not use is refused") {
  MultiHead<double, 4> host(small_config);
  const auto x_device = to_memory(random_tensor<double, 3>({1, 2, 12}, 9), fake_memory());
  expect_input_error([&] { (void)testing::gradcheck(host, x_device.view()); }, "gradcheck", "x",
                     "host memory or the module's", "device memory");
}

// One build per key however many threads ask at once; past its capacity the
// cache starts again, and a plan already handed out stays valid.
TEST_CASE("policy::cuda's plan cache builds each plan once and stays bounded") {
  cuda_detail::plan_cache<int, std::string> cache(3);
  std::atomic<int> builds = 0;
  auto builder = [&builds](int key) {
    return [&builds, key] {
      ++builds;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a window for a second builder
      return std::make_shared<const std::string>("plan " + std::to_string(key));
    };
  };
  std::vector<std::shared_ptr<const std::string>> got(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) threads.emplace_back([&, t] { got[t] = cache.get(t % 2, builder(t % 2)); });
  for (auto& t : threads) t.join();
  for (int t = 0; t < 8; ++t) {
    CHECK(*got[t] == "plan " + std::to_string(t % 2));
    CHECK(got[t] == got[t % 2]);  // every thread holds the one plan kept for its key
  }
  CHECK(cache.size() == 2);
  const int built = builds;
  CHECK(cache.get(1, builder(1)) == got[1]);
  CHECK(builds == built);  // asked again: not rebuilt

  const auto third = cache.get(2, builder(2));
  CHECK(cache.size() == 3);
  cache.get(3, builder(3));  // past the capacity: the cache starts again with this one
  CHECK(cache.size() == 1);
  CHECK(*third == "plan 2");  // still valid in its holder's hands
  CHECK(cache.get(2, builder(2)) != third);  // rebuilt on the next ask
}

// cuDNN's attention only when asked for, in float16/bfloat16, on sm_80 or
// newer, widths in whole 16-byte rows and every tensor 16-byte aligned; asked
// for in a build without it, an input_error before anything runs.
TEST_CASE("policy::cuda's attention goes to cuDNN only where it applies") {
  using policy::cuda_attention;
  alignas(16) static const char buffer[64] = {};
  const void *aligned = buffer, *offset = buffer + 8;
  CHECK(cuda_detail::cudnn_applies(cuda_attention::cudnn, true, 9, 128, 256, {aligned, aligned}));
  CHECK(cuda_detail::cudnn_applies(cuda_attention::cudnn, true, 8, 64, 128, {aligned}));
  CHECK_FALSE(cuda_detail::cudnn_applies(cuda_attention::difftx, true, 9, 128, 256, {aligned}));  // not asked for
  CHECK_FALSE(cuda_detail::cudnn_applies(cuda_attention::cudnn, false, 9, 128, 256, {aligned}));  // float32/float64
  CHECK_FALSE(cuda_detail::cudnn_applies(cuda_attention::cudnn, true, 7, 128, 256, {aligned}));   // before Ampere
  CHECK_FALSE(cuda_detail::cudnn_applies(cuda_attention::cudnn, true, 9, 12, 24, {aligned}));     // 24-byte rows
  CHECK_FALSE(cuda_detail::cudnn_applies(cuda_attention::cudnn, true, 9, 64, 128, {aligned, offset}));
  CHECK(cuda_detail::own_attention_path(true, 128) == attention_path::tensor_cores);
  CHECK(cuda_detail::own_attention_path(true, 32) == attention_path::cuda_cores);
  CHECK(cuda_detail::own_attention_path(false, 64) == attention_path::cuda_cores);
  CHECK(path_name(attention_path::cudnn) == "cudnn");

  CHECK_NOTHROW(cuda_detail::require_attention_available("attention_forward", cuda_attention::difftx, false));
  CHECK_NOTHROW(cuda_detail::require_attention_available("attention_forward", cuda_attention::cudnn, true));
  expect_input_error(
      [] { cuda_detail::require_attention_available("attention_forward", cuda_attention::cudnn, false); },
      "attention_forward", "policy.attention", "built without cuDNN", "cuda_attention::cudnn");
}

// A packed batch's statistics in cuDNN's ragged layout map one to one onto
// lse [1, H, Maps, total] as the per-sequence calls hold it: every (map,
// head, row) lands on the element that packed_sequence::lse's view of its
// sequence (modules/sequences.hpp) names, and so on each element once.
TEST_CASE("policy::cuda's ragged layout: rows to sequences, statistics to lse's per-sequence blocks") {
  const std::vector<std::int64_t> rows{0, 37, 38, 150, 213};  // lengths 37, 1, 112, 63
  const int sequences = static_cast<int>(rows.size()) - 1, H = 3, maps = 2;
  const std::int64_t total = rows.back();
  Tensor<int, 4> lse({1, H, maps, total});
  std::vector<int> seen(static_cast<std::size_t>(lse.size()), 0);
  for (int b = 0; b < sequences; ++b) {
    const auto block = detail::packed_sequence{rows[b], rows[b + 1]}.lse(lse.view());
    for (std::int64_t t = rows[b]; t < rows[b + 1]; ++t) {
      CHECK(cuda_detail::sequence_of_row(rows.data(), sequences, t) == b);
      for (int h = 0; h < H; ++h)
        for (int m = 0; m < maps; ++m) {
          const std::int64_t index = cuda_detail::packed_lse_index(rows.data(), sequences, H, maps, h, m, t);
          CHECK(lse.data() + index == &block(0, h, m, t - rows[b]));
          ++seen[static_cast<std::size_t>(index)];
        }
    }
  }
  CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));

  using cuda_detail::ragged_bucket;
  CHECK(ragged_bucket(1) == 64);
  CHECK(ragged_bucket(64) == 64);
  CHECK(ragged_bucket(65) == 128);
  CHECK(ragged_bucket(4096) == 4096);
  CHECK(ragged_bucket(4097) == 8192);
  // Offset rows of 16 bytes' multiple: an even count of int64, at least sequences + 1.
  for (std::int64_t count : {1, 2, 4, 70, 71}) {
    const std::int64_t stride = cuda_detail::ragged_offsets_stride(count);
    CHECK(stride % 2 == 0);
    CHECK(stride >= count + 1);
    CHECK(stride <= count + 2);
  }
  // Row widths of q [.., H, Maps, d], k [.., G, Maps, d], v [.., G, dv], o [.., H, dv], stats [.., H].
  using cuda_detail::ragged_row_elements;
  CHECK(ragged_row_elements(cuda_detail::ragged_q, 12, 4, 2, 128, 256) == 12 * 2 * 128);
  CHECK(ragged_row_elements(cuda_detail::ragged_k, 12, 4, 2, 128, 256) == 4 * 2 * 128);
  CHECK(ragged_row_elements(cuda_detail::ragged_v, 12, 4, 2, 128, 256) == 4 * 256);
  CHECK(ragged_row_elements(cuda_detail::ragged_o, 12, 4, 2, 128, 256) == 12 * 256);
  CHECK(ragged_row_elements(cuda_detail::ragged_stats, 12, 4, 2, 128, 256) == 12);
  CHECK(ragged_row_elements(cuda_detail::ragged_rows, 12, 4, 2, 128, 256) == 1);
}
