// File I/O: safetensors and .npy round trips in every dtype and rank; the
// files tools/make_fixtures.py wrote with numpy and torch, read and matched;
// every malformed-file class rejected with the documented input_error; and
// writers that fail leave neither a file nor a temporary behind.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include <difftx/difftx.hpp>
#include <difftx/io/mapped_safetensors.hpp>
#include <difftx/io/npy.hpp>
#include <difftx/io/parameters.hpp>
#include <difftx/io/safetensors.hpp>

#include "support/helpers.hpp"
#include "support/temp_folder.hpp"

using namespace difftx;
using test_support::expect_input_error;

namespace {

const std::filesystem::path data_dir = DIFFTX_TEST_DATA;
constexpr io::dtype all_types[] = {io::dtype::f64, io::dtype::f32, io::dtype::f16, io::dtype::bf16};

// n normal values, rounded to t so a file of type t holds them exactly.
std::vector<double> values_in(io::dtype t, std::size_t n, std::uint64_t seed) {
  random_stream rng(seed);
  std::vector<double> v(n);
  for (auto& e : v) e = rng.normal();
  return io::stored_tensor::from_values(t, {static_cast<index_t>(n)}, v).values();
}

std::vector<std::byte> bytes_of(const std::string& s) {
  std::vector<std::byte> b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

void write_bytes(const std::filesystem::path& path, const std::vector<std::byte>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file: u64 header size (the real one unless given), header, data_size zero bytes.
std::vector<std::byte> safetensors_bytes(const std::string& header, std::size_t data_size, std::uint64_t header_size = 0) {
  const std::uint64_t n = header_size ? header_size : header.size();
  std::string s(8, '\0');
  std::memcpy(s.data(), &n, 8);
  return bytes_of(s + header + std::string(data_size, '\0'));
}

// An .npy file: magic, version, header length, the dict padded with spaces and '\n', data_size zero bytes.
std::vector<std::byte> npy_bytes(const std::string& dict, std::size_t data_size, int major = 1, int minor = 0) {
  std::string header = dict;
  const std::size_t preamble = major == 1 ? 10 : 12;
  header.append(63 - (preamble + header.size()) % 64, ' ');
  header += '\n';
  std::string s = "\x93NUMPY";
  s += static_cast<char>(major);
  s += static_cast<char>(minor);
  const std::uint32_t n = static_cast<std::uint32_t>(header.size());
  s.append(reinterpret_cast<const char*>(&n), preamble - 8);
  return bytes_of(s + header + std::string(data_size, '\0'));
}

// A safetensors file's bytes with one more tensor: its entry added to the
// header, its bytes after the data (how a checkpoint holds I64 tensors, which
// a tensor_file cannot write).
std::vector<std::byte> with_tensor(const std::vector<std::byte>& file, const std::string& name, const std::string& dtype,
                                   const std::vector<index_t>& shape, const std::vector<std::byte>& data) {
  std::uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  const auto* text = reinterpret_cast<const char*>(file.data()) + 8;
  auto header = nlohmann::json::parse(text, text + n);
  const std::uint64_t data_size = file.size() - 8 - n;
  header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {data_size, data_size + data.size()}}};
  auto out = safetensors_bytes(header.dump(), 0);
  out.insert(out.end(), file.begin() + static_cast<std::ptrdiff_t>(8 + n), file.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// count little-endian int64 values 0, 1, ... (position ids, say).
std::vector<std::byte> int64_bytes(std::size_t count) {
  std::vector<std::byte> out(count * 8);
  for (std::size_t i = 0; i < count; ++i) {
    const auto v = static_cast<std::int64_t>(i);
    std::memcpy(out.data() + i * 8, &v, 8);
  }
  return out;
}

template <class Module>
std::vector<double> parameter_values(Module& m) {
  std::vector<double> all;
  for (const auto& p : m.parameters())
    for (index_t i = 0; i < p.size(); ++i) all.push_back(scalar_traits<typename Module::value_type>::to_double(p.value[i]));
  return all;
}

}  // namespace

TEST_CASE("safetensors: every dtype, with metadata, an empty and a rank-0 tensor, round-trips through a file") {
  test_support::temp_folder folder;
  io::tensor_file f;
  f.metadata = {{"module", "decoder_layer"}, {"d_model", "16"}};
  std::uint64_t seed = 1;
  for (auto t : all_types)
    f.tensors["w." + std::string(io::dtype_name(t))] = io::stored_tensor::from_values(t, {2, 3}, values_in(t, 6, seed++));
  f.tensors["scalar"] = io::stored_tensor::from_values(io::dtype::f64, {}, {0.25});
  f.tensors["empty"] = io::stored_tensor::from_values(io::dtype::f32, {0, 4}, {});
  io::write_safetensors(folder / "w.safetensors", f);
  CHECK(folder.files() == std::vector<std::string>{"w.safetensors"});

  const auto back = io::read_safetensors(folder / "w.safetensors");
  CHECK(back.metadata == f.metadata);
  REQUIRE(back.tensors.size() == f.tensors.size());
  for (const auto& [name, t] : f.tensors) {
    INFO(name);
    const auto& b = back.at(name, "test", "w.safetensors");
    CHECK(b.type == t.type);
    CHECK(b.shape == t.shape);
    CHECK(b.bytes == t.bytes);
  }
}

TEST_CASE(".npy: float32 and float64 of every rank round-trip, with numpy's header layout") {
  test_support::temp_folder folder;
  const std::vector<std::vector<index_t>> shapes{{}, {5}, {2, 3}, {2, 3, 4}, {1, 2, 1, 3, 2}, {0, 3}};
  for (auto t : {io::dtype::f64, io::dtype::f32})
    for (const auto& shape : shapes) {
      const io::stored_tensor original{t, shape, {}};
      const auto values = values_in(t, static_cast<std::size_t>(original.size()), 7);
      const auto stored = io::stored_tensor::from_values(t, shape, values);
      const auto path = folder / "a.npy";
      io::write_npy(path, stored);
      const auto back = io::read_npy(path);
      INFO(io::dtype_name(t) << " " << shape_string(shape));
      CHECK(back.type == t);
      CHECK(back.shape == shape);
      CHECK(back.values() == values);
      // numpy.save's layout: version 1.0, data aligned to 64 bytes, "(n,)" for one dimension.
      const auto bytes = io::read_file_bytes(path, "test");
      std::uint16_t header_size;
      std::memcpy(&header_size, bytes.data() + 8, 2);
      CHECK((10 + header_size) % 64 == 0);
      const std::string header(reinterpret_cast<const char*>(bytes.data()) + 10, header_size);
      if (shape.size() == 1) CHECK(header.find("'shape': (5,)") != std::string::npos);
      if (shape.empty()) CHECK(header.find("'shape': ()") != std::string::npos);
      CHECK(header.back() == '\n');
    }
  CHECK(folder.files() == std::vector<std::string>{"a.npy"});
}

TEST_CASE("module weights and gradients round-trip under the spec's names in every dtype") {
  test_support::temp_folder folder;
  DecoderLayer<double, 4> layer({{.d_model = 16, .heads = 2, .kv_heads = 1}, 24});
  test_support::randomise_parameters(layer, 3);
  auto x = test_support::random_tensor<double, 3>({1, 4, 16}, 4);
  Tensor<double, 3> y(x.shape()), dx(x.shape());
  DecoderLayer<double, 4>::saved_type saved;
  layer.forward(x.view(), y.view(), saved);
  layer.backward(x.view(), y.view(), saved, dx.view());

  for (auto t : all_types) {
    INFO(io::dtype_name(t));
    io::tensor_file weights, grads;
    io::store_parameters(weights, layer, t);
    io::store_gradients(grads, layer, t);
    io::write_safetensors(folder / "w.safetensors", weights);
    io::write_safetensors(folder / "dw.safetensors", grads);
    const auto weights_back = io::read_safetensors(folder / "w.safetensors");
    const auto grads_back = io::read_safetensors(folder / "dw.safetensors");

    DecoderLayer<double, 4> loaded({{.d_model = 16, .heads = 2, .kv_heads = 1}, 24});
    io::load_parameters(loaded, weights_back, "w.safetensors");
    for (const auto& p : layer.parameters()) {
      INFO(p.name);
      const auto rounded = io::stored_tensor::from_values(t, p.shape, std::vector<double>(p.value, p.value + p.size()));
      const auto rounded_grad = io::stored_tensor::from_values(t, p.shape, std::vector<double>(p.grad, p.grad + p.size()));
      CHECK(weights_back.at(p.name, "test", "w").bytes == rounded.bytes);
      CHECK(grads_back.at(p.name, "test", "dw").bytes == rounded_grad.bytes);
      CHECK(grads_back.at(p.name, "test", "dw").shape == p.shape);
    }
    CHECK(grads_back.tensors.size() == layer.parameters().size());
    auto loaded_params = loaded.parameters();
    for (std::size_t i = 0; i < loaded_params.size(); ++i) {
      const auto& p = loaded_params[i];
      CHECK(std::vector<double>(p.value, p.value + p.size()) == weights_back.at(p.name, "test", "w").values());
    }
  }
}

TEST_CASE("PyTorch fixtures: the .npy files numpy wrote match the safetensors fixture") {
  const auto f = io::read_safetensors(data_dir / "decoder_layer.safetensors");
  for (const char* name : {"input", "grad_output", "output", "grad_input"}) {
    INFO(name);
    const auto& expected = f.at(name, "test", "decoder_layer");
    const auto f64 = io::read_npy(data_dir / "npy" / ("decoder_layer." + std::string(name) + ".f64.npy"));
    CHECK(f64.type == io::dtype::f64);
    CHECK(f64.shape == expected.shape);
    CHECK(f64.bytes == expected.bytes);
    const auto f32 = io::read_npy(data_dir / "npy" / ("decoder_layer." + std::string(name) + ".f32.npy"));
    CHECK(f32.type == io::dtype::f32);
    CHECK(f32.shape == expected.shape);
    CHECK(f32.bytes == io::stored_tensor::from_values(io::dtype::f32, expected.shape, expected.values()).bytes);
  }
  const auto attn = io::read_safetensors(data_dir / "diff_attn_causal.safetensors");
  const auto q = io::read_npy(data_dir / "npy" / "diff_attn_causal.input.q.f64.npy");
  CHECK(q.shape.size() == 5);
  CHECK(q.shape == attn.at("input.q", "test", "diff_attn_causal").shape);
  CHECK(q.bytes == attn.at("input.q", "test", "diff_attn_causal").bytes);
  const auto lambda = io::read_npy(data_dir / "npy" / "diff_attn_causal.lambda.f64.npy");
  CHECK(lambda.shape.empty());
  CHECK(lambda.values() == std::vector<double>{std::stod(attn.meta("lambda", "test", "diff_attn_causal"))});
}

TEST_CASE("PyTorch fixtures: F32, F16 and BF16 weights torch converted match ours and load into a module") {
  const auto f64 = io::read_safetensors(data_dir / "decoder_layer.safetensors");
  DecoderLayer<float, 4> layer({{.d_model = 16, .heads = 2, .kv_heads = 1, .layer_index = 2}, 24});
  for (auto [t, suffix] : {std::pair{io::dtype::f32, "f32"}, {io::dtype::f16, "f16"}, {io::dtype::bf16, "bf16"}}) {
    INFO(suffix);
    const auto typed = io::read_safetensors(data_dir / ("decoder_layer.weights." + std::string(suffix) + ".safetensors"));
    CHECK(typed.metadata == f64.metadata);
    CHECK(typed.tensors.size() == layer.parameters().size());
    for (const auto& [name, stored] : typed.tensors) {
      INFO(name);
      CHECK(stored.type == t);
      const auto& reference = f64.at(name, "test", "decoder_layer");
      CHECK(stored.shape == reference.shape);
      CHECK(stored.bytes == io::stored_tensor::from_values(t, reference.shape, reference.values()).bytes);
    }
    io::load_parameters(layer, typed, suffix);
    for (const auto& p : layer.parameters())
      for (index_t i = 0; i < p.size(); ++i) REQUIRE(p.value[i] == static_cast<float>(typed.at(p.name, "test", suffix).values()[static_cast<std::size_t>(i)]));
    DecoderLayer<float, 4> mapped({{.d_model = 16, .heads = 2, .kv_heads = 1, .layer_index = 2}, 24});
    io::load_parameters(mapped, io::mapped_safetensors(data_dir / ("decoder_layer.weights." + std::string(suffix) + ".safetensors")));
    CHECK(parameter_values(mapped) == parameter_values(layer));
  }
}

namespace {

// The malformed-file cases, run through one reader: read(bytes) reads a file
// holding bytes and returns how many tensors it lists; `label` is how its
// errors name that file.
void check_malformed_safetensors(const std::string& reader, const std::string& label,
                                 const std::function<std::size_t(const std::vector<std::byte>&)>& read) {
  auto parse = [&](const std::vector<std::byte>& bytes) { return [=, &read] { read(bytes); }; };
  SUBCASE("an empty file, and one shorter than the header size") {
    expect_input_error(parse({}), reader, label + ": header", "an 8-byte header size", "0 bytes in all");
    expect_input_error(parse(bytes_of("abcd")), reader, label + ": header", "an 8-byte header size", "4 bytes");
  }
  SUBCASE("header size past the end") {
    expect_input_error(parse(safetensors_bytes("{}", 10, 1000)), reader, label + ": header",
                       "a header size within the file (12 bytes after it)", "1000");
  }
  SUBCASE("truncated header") {
    expect_input_error(parse(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_off)", 8)), reader,
                       label + ": header", "valid JSON", "parse error");
  }
  SUBCASE("offsets out of range") {
    expect_input_error(parse(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4)),
                       reader, label + ": w", "data_offsets within the 4 data bytes", "[0,8]");
    expect_input_error(parse(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8)),
                       reader, label + ": w", "data_offsets within", "[8,0]");
  }
  SUBCASE("overlapping tensors") {
    expect_input_error(parse(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                               R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                               12)),
                       reader, label + ": b", "not overlapping", "offset 4");
  }
  SUBCASE("data not covered by any tensor") {
    expect_input_error(parse(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12)),
                       reader, label + ": data", "8 data bytes", "12");
  }
  SUBCASE("a dtype the format does not have") {
    expect_input_error(parse(safetensors_bytes(R"({"w":{"dtype":"I33","shape":[2],"data_offsets":[0,8]}})", 8)),
                       reader, label + ": w", "a dtype of the format (BOOL, U8, I8,", "\"I33\"");
    expect_input_error(parse(safetensors_bytes(R"({"w":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", 8)),
                       reader, label + ": w", "a dtype of the format", "4");
  }
  SUBCASE("every dtype of the format is listed, and sizes are checked in its width") {
    CHECK(read(safetensors_bytes(R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
                                 R"("mask":{"dtype":"BOOL","shape":[3],"data_offsets":[16,19]},)"
                                 R"("q":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[19,20]},)"
                                 R"("f4":{"dtype":"F4","shape":[2,3],"data_offsets":[20,23]},)"
                                 R"("w":{"dtype":"F32","shape":[1],"data_offsets":[23,27]}})",
                                 27)) == 5);
    expect_input_error(parse(safetensors_bytes(R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,8]}})", 8)),
                       reader, label + ": ids", "16 bytes for shape [2] of I64", "8 bytes");
    expect_input_error(parse(safetensors_bytes(R"({"f4":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2)),
                       reader, label + ": f4", "whole bytes for shape [3] of F4", "12 bits");
  }
  SUBCASE("shape and size disagree") {
    expect_input_error(parse(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)),
                       reader, label + ": w", "12 bytes for shape [3] of F32", "8 bytes");
  }
  SUBCASE("an element count past 2^48 (a product that would wrap in 64 bits)") {
    expect_input_error(parse(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[53695721,687084323673,8],"data_offsets":[0,32]}})", 32)),
                       reader, label + ": w", "an element count of at most", "53695721 · 687084323673");
  }
  SUBCASE("the format's rules, strictly: each name once, no NUL, exactly three keys per tensor, '{' first") {
    const std::string w = R"("w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
    expect_input_error(parse(safetensors_bytes("{" + w + "," + w + "}", 4)), reader, label + ": w",
                       "each name once in its object", "the name twice");
    expect_input_error(parse(safetensors_bytes(R"({"w":{"dtype":"F32","dtype":"F64","shape":[1],"data_offsets":[0,4]}})", 4)),
                       reader, label + ": dtype", "each name once", "twice");
    expect_input_error(parse(safetensors_bytes(R"({"__metadata__":{"a":"1","a":"2"}})", 0)), reader,
                       label + ": a", "each name once", "twice");
    expect_input_error(parse(safetensors_bytes("{" + w + std::string("}\0junk", 6), 4)), reader,
                       label + ": header", "without NUL bytes", "a NUL byte at header offset " + std::to_string(w.size() + 2));
    expect_input_error(parse(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", 4)),
                       reader, label + ": w", "exactly the keys dtype, shape and data_offsets", "\"x\"");
    expect_input_error(parse(safetensors_bytes(" {" + w + "}", 4)), reader, label + ": header",
                       "starting with '{'", "another first byte");
    CHECK(read(safetensors_bytes("{" + w + "}   ", 4)) == 1);  // padding is fine
  }
  SUBCASE("a name with control bytes is echoed escaped, on one line") {
    const auto bytes = safetensors_bytes(R"({"a\nb\u001b[31m":{"dtype":"I8","shape":[2],"data_offsets":[0,1]}})", 1);
    try {
      read(bytes);
      FAIL("no input_error");
    } catch (const input_error& e) {
      const std::string message = e.what();
      CHECK(message.find('\n') == std::string::npos);
      CHECK(message.find('\x1b') == std::string::npos);
      CHECK(message.find("a\\nb\\x1b[31m") != std::string::npos);
    }
  }
}

}  // namespace

TEST_CASE("malformed safetensors are rejected with the documented error: read into memory") {
  check_malformed_safetensors("read_safetensors", "bad.safetensors", [](const std::vector<std::byte>& bytes) {
    const auto f = io::parse_safetensors(bytes, "bad.safetensors");
    return f.tensors.size() + f.undecodable.size();
  });
}

TEST_CASE("malformed safetensors are rejected with the documented error: mapped") {
  test_support::temp_folder folder;
  const auto path = folder / "bad.safetensors";
  check_malformed_safetensors("mapped_safetensors", path.string(), [&](const std::vector<std::byte>& bytes) {
    write_bytes(path, bytes);
    return io::mapped_safetensors(path).tensors().size();
  });
  SUBCASE("no file, or a folder") {
    expect_input_error([&] { io::mapped_safetensors(folder / "none.safetensors"); }, "mapped_safetensors",
                       (folder / "none.safetensors").string(), "a readable file", "no such file");
    expect_input_error([&] { io::mapped_safetensors(folder.path()); }, "mapped_safetensors", folder.path().string(),
                       "a readable file", "not a regular file");
  }
}

TEST_CASE("missing or misshapen weights: load_parameters from a tensor_file changes nothing") {
  const std::string label = "bad.safetensors";
  RMSNorm<double> norm(2);
  const auto before = parameter_values(norm);
  io::tensor_file f;
  f.tensors["bias"] = io::stored_tensor::from_values(io::dtype::f32, {2}, {1.0, 2.0});
  expect_input_error([&] { io::load_parameters(norm, f, label); }, "load_parameters", "weight",
                     "a tensor named 'weight' in " + label, "no such tensor");
  f.tensors["weight"] = io::stored_tensor::from_values(io::dtype::f32, {3}, {1.0, 2.0, 3.0});
  expect_input_error([&] { io::load_parameters(norm, f, label); }, "load_parameters", "weight", "shape [2] in " + label,
                     "shape [3]");
  CHECK(parameter_values(norm) == before);
}

namespace {

const DecoderLayerConfig small_layer{{.d_model = 16, .heads = 2, .kv_heads = 1}, 24};

// Same bits (long double compares by value: its padding bytes are arbitrary).
template <class T>
bool same_bits(const T& a, const T& b) {
  if constexpr (std::is_same_v<T, long double>)
    return a == b;
  else
    return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// Loads layer 3 of the checkpoint at path into a DecoderLayer<T, 4> through
// the mapping and through read_safetensors; both must hold exactly what
// decode-to-double then from_double gives (the conversion of old).
template <class T>
void check_mapped_load(const std::filesystem::path& path) {
  INFO(scalar_traits<T>::name);
  const io::mapped_safetensors mapped(path);
  const auto file = io::read_safetensors(path);
  DecoderLayer<T, 4> from_map(small_layer), from_file(small_layer);
  io::load_parameters(from_map, mapped, "layers.3.");
  io::load_parameters(from_file, file, path.string(), "layers.3.");
  const auto a = from_map.parameters(), b = from_file.parameters();
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].name);
    const auto values = file.at("layers.3." + a[i].name, "test", "file").values();
    REQUIRE(values.size() == static_cast<std::size_t>(a[i].size()));
    for (std::size_t e = 0; e < values.size(); ++e) {
      const T expected = scalar_traits<T>::from_double(values[e]);
      REQUIRE(same_bits(a[i].value[e], expected));
      REQUIRE(same_bits(b[i].value[e], expected));
    }
  }
}

}  // namespace

TEST_CASE("mapped safetensors: load_parameters equals read_safetensors' load bit for bit, every file dtype into every number type") {
  test_support::temp_folder folder;
  DecoderLayer<double, 4> source(small_layer);
  test_support::randomise_parameters(source, 11);
  for (auto t : all_types) {
    INFO(io::dtype_name(t));
    // A checkpoint: layer 3's weights, another layer's, metadata, and I64 position ids.
    io::tensor_file weights;
    weights.metadata = {{"format", "pt"}};
    io::store_parameters(weights, source, t, "layers.3.");
    io::store_parameters(weights, source, io::dtype::f32, "layers.4.");
    const auto path = folder / "model.safetensors";
    io::write_safetensors(path, weights);
    write_bytes(path, with_tensor(io::read_file_bytes(path, "test"), "position_ids", "I64", {7}, int64_bytes(7)));

    const io::mapped_safetensors mapped(path);
    CHECK(mapped.label() == path.string());
    CHECK(mapped.metadata() == weights.metadata);
    REQUIRE(mapped.tensors().size() == weights.tensors.size() + 1);
    for (const auto& [name, stored] : weights.tensors) {
      INFO(name);
      const auto entry = mapped.at(name);
      CHECK(entry.type == stored.type);
      CHECK(entry.dtype_name == io::safetensors_name(stored.type));
      CHECK(std::ranges::equal(entry.shape, stored.shape));
      CHECK(std::ranges::equal(entry.bytes, stored.bytes));
    }
    const auto ids = mapped.at("position_ids");
    CHECK(ids.dtype_name == "I64");
    CHECK_FALSE(ids.type.has_value());
    CHECK(std::ranges::equal(ids.shape, std::vector<index_t>{7}));
    CHECK(std::ranges::equal(ids.bytes, int64_bytes(7)));
    const auto file = io::read_safetensors(path);
    CHECK(file.undecodable == std::map<std::string, std::string>{{"position_ids", "I64"}});

    check_mapped_load<float>(path);
    check_mapped_load<double>(path);
    check_mapped_load<Eigen::bfloat16>(path);
    check_mapped_load<Eigen::half>(path);
    check_mapped_load<long double>(path);  // no dtype of its own: the from_double fallback
  }
}

TEST_CASE("mapped safetensors: a dtype that is the module's own type is copied, signalling NaN payloads included") {
  // A conversion through float or double would quiet these NaNs (set their top mantissa bit).
  test_support::temp_folder folder;
  auto check = [&]<class T, class Bits>(io::dtype t, Bits nan) {
    INFO(io::dtype_name(t));
    const Bits one = std::bit_cast<Bits>(scalar_traits<T>::from_double(1.0));
    io::tensor_file f;
    f.tensors["weight"] = {t, {2}, std::vector<std::byte>(2 * sizeof(Bits))};
    std::memcpy(f.tensors["weight"].bytes.data(), &one, sizeof(Bits));
    std::memcpy(f.tensors["weight"].bytes.data() + sizeof(Bits), &nan, sizeof(Bits));
    io::write_safetensors(folder / "w.safetensors", f);
    RMSNorm<T> norm(2);
    io::load_parameters(norm, io::mapped_safetensors(folder / "w.safetensors"));
    const auto p = norm.parameters().front();
    CHECK(std::bit_cast<Bits>(p.value[0]) == one);
    CHECK(std::bit_cast<Bits>(p.value[1]) == nan);
  };
  check.template operator()<float, std::uint32_t>(io::dtype::f32, 0x7f800001u);
  check.template operator()<double, std::uint64_t>(io::dtype::f64, 0x7ff0000000000001u);
  check.template operator()<Eigen::half, std::uint16_t>(io::dtype::f16, std::uint16_t{0x7c01});
  check.template operator()<Eigen::bfloat16, std::uint16_t>(io::dtype::bf16, std::uint16_t{0x7f81});
}

TEST_CASE("mapped safetensors: a missing, undecodable or misshapen tensor is named and changes no parameter") {
  test_support::temp_folder folder;
  DecoderLayer<double, 4> source(small_layer);
  test_support::randomise_parameters(source, 12);
  // The last parameter goes wrong, so a load that wrote as it checked would have changed the others.
  const auto last = source.parameters().back();
  io::tensor_file all_but_last;
  io::store_parameters(all_but_last, source, io::dtype::f32, "layers.3.");
  all_but_last.tensors.erase("layers.3." + last.name);
  const auto path = folder / "model.safetensors";
  io::write_safetensors(path, all_but_last);
  const auto good_bytes = io::read_file_bytes(path, "test");

  DecoderLayer<float, 4> target(small_layer);
  test_support::randomise_parameters(target, 13);
  const auto before = parameter_values(target);
  const std::string name = "layers.3." + last.name;
  const std::string label = path.string();
  SUBCASE("missing") {
    const io::mapped_safetensors file(path);
    expect_input_error([&] { io::load_parameters(target, file, "layers.3."); }, "load_parameters", name,
                       "a tensor named '" + name + "' in " + label, "no such tensor");
  }
  SUBCASE("in a dtype difftx does not decode (I64), through either reader") {
    write_bytes(path, with_tensor(good_bytes, name, "I64", last.shape, int64_bytes(static_cast<std::size_t>(last.size()))));
    const io::mapped_safetensors file(path);
    expect_input_error([&] { io::load_parameters(target, file, "layers.3."); }, "load_parameters", name,
                       "a tensor of dtype F64, F32, F16 or BF16 (what difftx decodes) in " + label, "dtype I64");
    expect_input_error([&] { io::load_parameters(target, io::read_safetensors(path), label, "layers.3."); },
                       "load_parameters", name, "F64, F32, F16 or BF16", "dtype I64");
  }
  SUBCASE("misshapen") {
    write_bytes(path, with_tensor(good_bytes, name, "F32", {1}, std::vector<std::byte>(4)));
    const io::mapped_safetensors file(path);
    expect_input_error([&] { io::load_parameters(target, file, "layers.3."); }, "load_parameters", name,
                       "shape " + shape_string(last.shape) + " in " + label, "shape [1]");
  }
  SUBCASE("a name asked of the file itself") {
    const io::mapped_safetensors file(path);
    expect_input_error([&] { file.at("nope"); }, "mapped_safetensors", "nope", "a tensor named 'nope' in " + label,
                       "no such tensor (" + std::to_string(all_but_last.tensors.size()) + " tensors in the file)");
  }
  CHECK(parameter_values(target) == before);
}

namespace {

// Memory that reports itself as a device's and keeps every byte XOR-ed, so a
// load that writes parameters through their pointers instead of uploading
// them reads back garbage.
class scrambled_memory final : public memory_resource {
 public:
  void* allocate(std::size_t bytes) override { return host_memory().allocate(bytes); }
  void deallocate(void* p, std::size_t bytes) noexcept override { host_memory().deallocate(p, bytes); }
  void copy(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  void zero(void* p, std::size_t bytes) override { std::memset(p, 0x5a, bytes); }
  void upload(void* dst, const void* src, std::size_t bytes) override { scramble(dst, src, bytes); }
  void download(void* dst, const void* src, std::size_t bytes) override { scramble(dst, src, bytes); }
  memory_space space() const noexcept override { return memory_space::device; }

 private:
  static void scramble(void* dst, const void* src, std::size_t bytes) {
    for (std::size_t i = 0; i < bytes; ++i)
      static_cast<unsigned char*>(dst)[i] = static_cast<const unsigned char*>(src)[i] ^ 0x5a;
  }
};

// Two parameters of different sizes in that memory: all load_parameters needs of a module.
struct device_module {
  using value_type = Eigen::bfloat16;
  Parameter<Eigen::bfloat16, 2> weight;
  Parameter<Eigen::bfloat16, 1> bias;
  explicit device_module(memory_resource& memory) : weight({3, 4}, memory), bias({4}, memory) {}
  std::vector<parameter_ref<Eigen::bfloat16>> parameters() { return {weight.ref("weight"), bias.ref("bias")}; }
};

}  // namespace

TEST_CASE("mapped safetensors: parameters in device memory are uploaded") {
  test_support::temp_folder folder;
  scrambled_memory memory;
  device_module module(memory);
  io::tensor_file f;
  f.tensors["weight"] = io::stored_tensor::from_values(io::dtype::f32, {3, 4}, values_in(io::dtype::bf16, 12, 21));
  f.tensors["bias"] = io::stored_tensor::from_values(io::dtype::bf16, {4}, values_in(io::dtype::bf16, 4, 22));
  io::write_safetensors(folder / "w.safetensors", f);
  io::load_parameters(module, io::mapped_safetensors(folder / "w.safetensors"));
  for (const auto& p : module.parameters()) {
    INFO(p.name);
    std::vector<Eigen::bfloat16> host(static_cast<std::size_t>(p.size()));
    memory.download(host.data(), p.value, host.size() * sizeof(Eigen::bfloat16));
    const auto expected = f.tensors.at(p.name).values();
    for (std::size_t i = 0; i < host.size(); ++i) CHECK(scalar_traits<Eigen::bfloat16>::to_double(host[i]) == expected[i]);
  }
}

TEST_CASE("malformed .npy files are rejected with the documented error") {
  const std::string label = "bad.npy";
  const std::string f4_23 = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  auto parse = [&](const std::vector<std::byte>& bytes) { return [=] { io::parse_npy(bytes, label); }; };
  SUBCASE("a well-formed file parses, in versions 1.0, 2.0 and 3.0, with keys in any order") {
    for (int major : {1, 2, 3}) CHECK(io::parse_npy(npy_bytes(f4_23, 24, major), label).shape == std::vector<index_t>{2, 3});
    const auto t = io::parse_npy(npy_bytes("{\"shape\": (4,), \"descr\": '<f8', 'fortran_order': False}", 32), label);
    CHECK(t.type == io::dtype::f64);
    CHECK(t.shape == std::vector<index_t>{4});
  }
  SUBCASE("too short, bad magic, unsupported version") {
    expect_input_error(parse(bytes_of("\x93NUMPY")), "read_npy", label + ": preamble", "the 10-byte .npy preamble", "6 bytes");
    auto bytes = npy_bytes(f4_23, 24);
    bytes[5] = std::byte{'X'};
    expect_input_error(parse(bytes), "read_npy", label + ": preamble", "magic", "other bytes");
    expect_input_error(parse(npy_bytes(f4_23, 24, 4)), "read_npy", label + ": version", "1.0, 2.0 or 3.0", "4.0");
    expect_input_error(parse(npy_bytes(f4_23, 24, 1, 1)), "read_npy", label + ": version", "1.0, 2.0 or 3.0", "1.1");
  }
  SUBCASE("header length past the end") {
    auto bytes = npy_bytes(f4_23, 0);
    bytes.resize(40);
    expect_input_error(parse(bytes), "read_npy", label + ": header", "a header length within the file (30 bytes after it)",
                       "118");
  }
  SUBCASE("Fortran order") {
    expect_input_error(parse(npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24)), "read_npy",
                       label + ": fortran_order", "C order", "Fortran order");
  }
  SUBCASE("big-endian and unsupported dtypes") {
    expect_input_error(parse(npy_bytes("{'descr': '>f8', 'fortran_order': False, 'shape': (2,), }", 16)), "read_npy",
                       label + ": descr", "little-endian", "big-endian '>f8'");
    for (const char* descr : {"<i4", "<f2", "|u1", "<c16"})
      expect_input_error(parse(npy_bytes(std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (2,), }", 8)),
                         "read_npy", label + ": descr", "'<f4' (float32) or '<f8' (float64)", descr);
  }
  SUBCASE("an element count past 2^48 (a product that would wrap in 64 bits)") {
    expect_input_error(parse(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (53695721, 687084323673, 8), }", 32)),
                       "read_npy", label + ": shape [53695721, 687084323673, 8]", "an element count of at most",
                       "53695721 · 687084323673");
  }
  SUBCASE("a descr with control bytes is echoed escaped, on one line") {
    const auto bytes = npy_bytes("{'descr': '<f4\x1b[2J\x7f', 'fortran_order': False, 'shape': (1,), }", 4);
    expect_input_error(parse(bytes), "read_npy", label + ": descr", "'<f4' (float32)", "'<f4\x1b[2J\x7f'");
    try {
      io::parse_npy(bytes, label);
    } catch (const input_error& e) {  // the parts stay raw for programs; the message shows the bytes escaped
      CHECK(std::string(e.what()).find("got '<f4\\x1b[2J\\x7f'") != std::string::npos);
    }
  }
  SUBCASE("truncated or overlong data") {
    expect_input_error(parse(npy_bytes(f4_23, 20)), "read_npy", label + ": data", "24 bytes for shape [2, 3] of float32",
                       "20 bytes");
    expect_input_error(parse(npy_bytes(f4_23, 28)), "read_npy", label + ": data", "24 bytes", "28 bytes");
  }
  SUBCASE("the header's grammar, strictly") {
    const std::string header = label + ": header";
    expect_input_error(parse(npy_bytes("{'descr': '<f4', 'fortran_order': False}", 4)), "read_npy", header, "the keys",
                       "no 'shape'");
    expect_input_error(parse(npy_bytes("{'descr': '<f4', 'descr': '<f4', 'shape': (1,)}", 4)), "read_npy", header,
                       "each of 'descr', 'fortran_order' and 'shape' once", "key 'descr'");
    expect_input_error(parse(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", 4)), "read_npy",
                       header, "once", "key 'x'");
    expect_input_error(parse(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (3)}", 12)), "read_npy", header,
                       "'(n,)' for one dimension", "not a tuple");
    expect_input_error(parse(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}", 4)), "read_npy", header,
                       "non-negative integer", "'-'");
    expect_input_error(parse(npy_bytes("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}", 4)), "read_npy", header,
                       "True or False", "'0'");
    expect_input_error(parse(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x", 4)), "read_npy", header,
                       "only spaces and a newline after the dict", "'x'");
    expect_input_error(parse(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)", 4)), "read_npy", header,
                       "',' or '}'", "the end of the header");
    expect_input_error(parse(npy_bytes("{'descr: '<f4'}", 4)), "read_npy", header, "':' after the key", "'<'");
  }
  SUBCASE("from a file: a truncated one names the file") {
    test_support::temp_folder folder;
    auto bytes = npy_bytes(f4_23, 24);
    bytes.resize(bytes.size() - 3);
    write_bytes(folder / "cut.npy", bytes);
    expect_input_error([&] { io::read_npy(folder / "cut.npy"); }, "read_npy", (folder / "cut.npy").string() + ": data",
                       "24 bytes", "21 bytes");
    expect_input_error([&] { io::read_npy(folder / "none.npy"); }, "read_npy", (folder / "none.npy").string(),
                       "a readable file", "no such file");
    expect_input_error([&] { io::read_safetensors(folder.path()); }, "read_safetensors", folder.path().string(),
                       "a readable file", "not a regular file");
  }
}

TEST_CASE("a writer that fails leaves neither a file nor a temporary, and keeps the old file") {
  test_support::temp_folder folder;
  const auto old = io::stored_tensor::from_values(io::dtype::f32, {2}, {1.0, 2.0});
  io::write_npy(folder / "y.npy", old);
  const auto old_bytes = io::read_file_bytes(folder / "y.npy", "test");

  SUBCASE("a dtype .npy cannot hold") {
    expect_input_error([&] { io::write_npy(folder / "y.npy", io::stored_tensor::from_values(io::dtype::bf16, {2}, {1.0, 2.0})); },
                       "write_npy", (folder / "y.npy").string(), "float32 or float64 data", "bfloat16");
  }
  SUBCASE("a folder that does not exist") {
    expect_input_error([&] { io::write_npy(folder / "missing" / "y.npy", old); }, "write_npy",
                       (folder / "missing" / "y.npy").string(), "a path in an existing folder", "no folder");
  }
  SUBCASE("a target that cannot be replaced (a folder)") {
    std::filesystem::create_directory(folder / "taken.safetensors");
    io::tensor_file f;
    f.tensors["w"] = old;
    expect_input_error([&] { io::write_safetensors(folder / "taken.safetensors", f); }, "write_safetensors",
                       (folder / "taken.safetensors").string(), "a file path", "a folder");
    CHECK(std::filesystem::is_directory(folder / "taken.safetensors"));
    std::filesystem::remove(folder / "taken.safetensors");
  }
  SUBCASE("a writer that throws half way") {
    CHECK_THROWS_AS(io::write_atomically(folder / "z.npy", "test",
                                         [](std::ostream& out) {
                                           out << "half";
                                           throw std::runtime_error("disk full");
                                         }),
                    std::runtime_error);
  }
  CHECK(folder.files() == std::vector<std::string>{"y.npy"});
  CHECK(io::read_file_bytes(folder / "y.npy", "test") == old_bytes);
}

TEST_CASE("output_files: all or nothing over several files, one path per output") {
  test_support::temp_folder folder;
  const auto old = io::stored_tensor::from_values(io::dtype::f32, {2}, {1.0, 2.0});
  const auto fresh = io::stored_tensor::from_values(io::dtype::f32, {2}, {3.0, 4.0});
  io::write_npy(folder / "a.npy", old);
  io::write_npy(folder / "b.npy", old);
  const auto old_bytes = io::read_file_bytes(folder / "a.npy", "test");
  auto write = [&](io::output_files& files, std::size_t i, const char* name) {
    files.write(i, [&](std::ostream& out) { io::write_npy_to(out, fresh, name); });
  };

  SUBCASE("a failure after the first file is written leaves both targets as they were and no temporary") {
    {
      io::output_files files;
      const auto a = files.add(folder / "a.npy", "test"), b = files.add(folder / "b.npy", "test");
      CHECK(folder.files().size() == 4);  // the temporaries exist from add() on
      write(files, a, "a.npy");
      CHECK_THROWS_AS(files.write(b, [](std::ostream&) { throw std::runtime_error("disk full"); }), std::runtime_error);
    }  // destroyed without commit
    CHECK(io::read_file_bytes(folder / "a.npy", "test") == old_bytes);
    CHECK(io::read_file_bytes(folder / "b.npy", "test") == old_bytes);
  }
  SUBCASE("commit replaces every target") {
    io::output_files files;
    const auto a = files.add(folder / "a.npy", "test"), b = files.add(folder / "b.npy", "test");
    write(files, a, "a.npy");
    expect_input_error([&] { files.commit(); }, "test", (folder / "b.npy").string(), "a written output", "none written");
    CHECK(io::read_file_bytes(folder / "a.npy", "test") == old_bytes);  // nothing renamed
    write(files, b, "b.npy");
    files.commit();
    CHECK(io::read_npy(folder / "a.npy").values() == fresh.values());
    CHECK(io::read_npy(folder / "b.npy").values() == fresh.values());
  }
  SUBCASE("the same path twice, also spelled differently, is refused") {
    io::output_files files;
    files.add(folder / "a.npy", "first");
    expect_input_error([&] { files.add(folder.path() / "." / "a.npy", "second"); }, "second",
                       (folder.path() / "." / "a.npy").string(), "a path that no other output uses", "another output");
  }
  CHECK(folder.files() == std::vector<std::string>{"a.npy", "b.npy"});
}

TEST_CASE("messages are one printable line: control bytes and invalid UTF-8 escaped, valid UTF-8 kept") {
  const input_error e("where", "name\nwith\ttab\x1b[0m", "2·h·D λ", std::string("\xff\xc2\x85 ok"));
  CHECK(std::string(e.what()) ==
        "difftx::where: argument 'name\\nwith\\ttab\\x1b[0m': expected 2·h·D λ, got \\xff\\xc2\\x85 ok");
  CHECK(e.argument() == "name\nwith\ttab\x1b[0m");  // the parts stay as given, for programs
}

TEST_CASE("Tensor: a shape whose size overflows or cannot be allocated throws input_error, not a crash") {
  expect_input_error([] { Tensor<float, 3>({53695721, 687084323673, 8}); }, "Tensor", "shape", "an element count of at most",
                     "53695721 · 687084323673");
  expect_input_error([] { Tensor<float, 2>({-1, 4}); }, "Tensor", "shape", "non-negative extents", "-1");
  // An allocator that runs out (the system's would too, but sanitizers abort on such requests instead of throwing).
  struct exhausted_memory final : memory_resource {
    void* allocate(std::size_t) override { throw std::bad_alloc(); }
    void deallocate(void*, std::size_t) noexcept override {}
    void copy(void*, const void*, std::size_t) override {}
    void zero(void*, std::size_t) override {}
    void upload(void*, const void*, std::size_t) override {}
    void download(void*, const void*, std::size_t) override {}
    memory_space space() const noexcept override { return memory_space::host; }
  } exhausted;
  expect_input_error([&] { Tensor<float, 2>({1 << 20, 1 << 10}, exhausted); }, "Tensor", "shape",
                     "a tensor that fits in memory", "4294967296 bytes for shape [1048576, 1024], more than can be allocated");
}
