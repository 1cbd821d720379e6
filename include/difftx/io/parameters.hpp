// A module's parameters and gradients to and from files, under the names of
// the spec (the module's parameters() names, with an optional prefix).
#pragma once

#include <algorithm>
#include <concepts>
#include <string>
#include <string_view>
#include <vector>

#include "difftx/io/tensor_file.hpp"
#include "difftx/io/tensor_ref.hpp"
#include "difftx/modules/parameter.hpp"

namespace difftx::io {

// What load_parameters reads from: at(name, where) gives the tensor called
// name (throwing input_error naming `where` when there is none) and label()
// names the file in errors. mapped_safetensors is one.
template <class Source>
concept tensor_source = requires(const Source& source, const std::string& name, std::string_view where) {
  { source.at(name, where) } -> std::same_as<tensor_ref>;
  { source.label() } -> std::convertible_to<std::string_view>;
};

// Sets every parameter of module from source[prefix + name], decoded straight
// into the module's number type (a copy where the file's dtype is that type's
// own, e.g. BF16 into a bfloat16 module). Every name, dtype and shape is
// checked before any parameter is written, so a bad file changes nothing:
// input_error("load_parameters", prefix + name, ...) for a missing tensor,
// one in a dtype difftx does not decode (I64, U8, ...) or a wrong shape.
// Parameters in device memory are uploaded one tensor at a time from a host
// buffer as large as the largest of them.
template <class Module, tensor_source Source>
void load_parameters(Module& module, const Source& source, const std::string& prefix = "") {
  using T = typename Module::value_type;
  constexpr std::string_view where = "load_parameters";
  const std::string label(source.label());
  auto params = module.parameters();
  std::vector<tensor_ref> tensors;
  index_t largest_on_device = 0;
  for (const auto& p : params) {
    const auto t = source.at(prefix + p.name, where);
    t.require_decodable(where, prefix + p.name, label);
    require(std::ranges::equal(t.shape, p.shape), where, prefix + p.name,
            "shape " + shape_string(p.shape) + " in " + label, "shape " + shape_string(t.shape));
    if (p.space() != memory_space::host) largest_on_device = std::max(largest_on_device, p.size());
    tensors.push_back(t);
  }
  std::vector<T> staging(static_cast<std::size_t>(largest_on_device));
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].space() == memory_space::host) {
      tensors[i].decode_into(params[i].value);
      continue;
    }
    tensors[i].decode_into(staging.data());
    params[i].memory->upload(params[i].value, staging.data(), static_cast<std::size_t>(params[i].size()) * sizeof(T));
  }
}

// The same from a tensor_file (read_safetensors), `label` naming the file.
template <class Module>
void load_parameters(Module& module, const tensor_file& file, const std::string& label,
                     const std::string& prefix = "") {
  struct labelled_file {  // a tensor_file as a tensor_source
    const tensor_file& file;
    const std::string& file_label;
    tensor_ref at(const std::string& name, std::string_view where) const { return file.at(name, where, file_label).ref(); }
    const std::string& label() const noexcept { return file_label; }
  };
  load_parameters(module, labelled_file{file, label}, prefix);
}

namespace detail {
template <class T>
std::vector<double> host_values(const parameter_ref<T>& p, T* source) {
  std::vector<T> host(static_cast<std::size_t>(p.size()));
  if (p.space() == memory_space::host)
    std::copy_n(source, p.size(), host.begin());
  else
    p.memory->download(host.data(), source, host.size() * sizeof(T));
  return to_doubles(host.data(), host.size());
}
}  // namespace detail

// file[prefix + name] = each parameter's value, stored as `type`.
template <class Module>
void store_parameters(tensor_file& file, Module& module, dtype type, const std::string& prefix = "") {
  for (const auto& p : module.parameters())
    file.tensors[prefix + p.name] = stored_tensor::from_values(type, p.shape, detail::host_values(p, p.value));
}

// file[prefix + name] = each parameter's gradient, stored as `type`.
template <class Module>
void store_gradients(tensor_file& file, Module& module, dtype type, const std::string& prefix = "") {
  for (const auto& p : module.parameters())
    file.tensors[prefix + p.name] = stored_tensor::from_values(type, p.shape, detail::host_values(p, p.grad));
}

}  // namespace difftx::io
