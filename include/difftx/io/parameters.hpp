// A module's parameters and gradients to and from a tensor_file, under the
// names of the spec (the module's parameters() names, with an optional prefix).
#pragma once

#include <string>
#include <vector>

#include "difftx/io/tensor_file.hpp"
#include "difftx/modules/parameter.hpp"

namespace difftx::io {

// Sets every parameter of module from file[prefix + name]. Every name and shape
// is checked before any parameter is written, so a bad file changes nothing.
template <class Module>
void load_parameters(Module& module, const tensor_file& file, const std::string& label,
                     const std::string& prefix = "") {
  using T = typename Module::value_type;
  constexpr std::string_view where = "load_parameters";
  auto params = module.parameters();
  std::vector<const stored_tensor*> sources;
  for (const auto& p : params) {
    const auto& t = file.at(prefix + p.name, where, label);
    require(t.shape == p.shape, where, prefix + p.name, "shape " + shape_string(p.shape) + " in " + label,
            "shape " + shape_string(t.shape));
    sources.push_back(&t);
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto values = sources[i]->values();
    std::vector<T> converted(values.size());
    for (std::size_t e = 0; e < values.size(); ++e) converted[e] = scalar_traits<T>::from_double(values[e]);
    if (params[i].space() == memory_space::host)
      std::copy(converted.begin(), converted.end(), params[i].value);
    else
      params[i].memory->upload(params[i].value, converted.data(), converted.size() * sizeof(T));
  }
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
