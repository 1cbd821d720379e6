// A module's parameters and gradients to and from files, under the names of
// the spec (the module's parameters() names, with an optional prefix).
#pragma once

#include <algorithm>
#include <concepts>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "difftx/core/transfer.hpp"
#include "difftx/io/tensor_file.hpp"
#include "difftx/io/tensor_ref.hpp"
#include "difftx/modules/architecture.hpp"
#include "difftx/modules/parameter.hpp"

namespace difftx::io {

// What load_parameters reads from: at(name, where) gives the tensor called
// name (throwing input_error naming `where` when there is none) and label()
// names the file in errors. mapped_safetensors is one. A source may also
// have metadata() (a file's __metadata__: its architecture is checked against
// the module's, modules/architecture.hpp) and release(tensor) (called once a
// tensor is decoded: a mapped file gives its pages back).
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
// buffer as large as the largest of them. A tensor-parallel module
// (parallel/tensor_parallel.hpp) reads the whole checkpoint's names and
// shapes and keeps its rank's rows or columns of each split parameter.
// Throws input_error("load_parameters", key, ...) where the file's metadata
// says another value for a key of the module's architecture (describe(module,
// prefix)). Only a file difftx wrote (architecture_marker) is checked, and
// only the keys it has.
template <class Module>
void require_architecture(const Module& module, const std::map<std::string, std::string>& metadata,
                          std::string_view label, const std::string& prefix) {
  if (!metadata.count(architecture_marker)) return;
  for (const auto& [key, value] : describe(module, prefix))
    if (const auto it = metadata.find(key); it != metadata.end())
      require(same_architecture_value(value, it->second), "load_parameters", key,
              value + " (the module's), as __metadata__ in " + std::string(label) + " records the architecture",
              it->second + ": the file holds another architecture than the module was built with");
}

template <class Module, tensor_source Source>
void load_parameters(Module& module, const Source& source, const std::string& prefix = "") {
  using T = typename Module::value_type;
  constexpr std::string_view where = "load_parameters";
  const std::string label(source.label());
  if constexpr (requires { source.metadata(); }) require_architecture(module, source.metadata(), label, prefix);
  auto params = module.parameters();
  std::vector<tensor_ref> tensors;
  index_t largest_on_device = 0, largest_split = 0;
  for (const auto& p : params) {
    const auto t = source.at(prefix + p.name, where);
    t.require_decodable(where, prefix + p.name, label);
    require(std::ranges::equal(t.shape, p.full_shape()), where, prefix + p.name,
            "shape " + shape_string(p.full_shape()) + " in " + label, "shape " + shape_string(t.shape));
    if (p.space() != memory_space::host) largest_on_device = std::max(largest_on_device, p.size());
    if (p.is_shard()) largest_split = std::max(largest_split, p.size() * p.shard.ranks);
    tensors.push_back(t);
  }
  std::vector<T> staging(static_cast<std::size_t>(largest_on_device)), whole(static_cast<std::size_t>(largest_split));
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    T* target = p.space() == memory_space::host ? p.value : staging.data();
    if (p.is_shard()) {
      tensors[i].decode_into(whole.data());
      take_shard(p, whole.data(), target);
    } else {
      tensors[i].decode_into(target);
    }
    if constexpr (requires { source.release(tensors[i]); }) source.release(tensors[i]);
    if (p.space() != memory_space::host)
      p.memory->upload(p.value, staging.data(), static_cast<std::size_t>(p.size()) * sizeof(T));
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
    const std::map<std::string, std::string>& metadata() const noexcept { return file.metadata; }
  };
  load_parameters(module, labelled_file{file, label}, prefix);
}

namespace detail {

// file[prefix + name] = whole(p) for each parameter p, stored as `type`; every
// tensor is made before the file changes, so a throwing whole() changes nothing.
template <class Module, class Whole>
void store_each(tensor_file& file, Module& module, dtype type, const std::string& prefix, Whole&& whole) {
  std::vector<std::pair<std::string, stored_tensor>> made;
  for (const auto& p : module.parameters())
    made.emplace_back(prefix + p.name, stored_tensor::from_values(type, p.full_shape(), whole(p)));
  for (auto& [name, tensor] : made) file.tensors[name] = std::move(tensor);
}

// A whole parameter's values or gradients (pick) as doubles, for a process that holds it whole.
template <class T, class Pick>
std::vector<double> whole_values(const parameter_ref<T>& p, Pick pick) {
  require(!p.is_shard(), "store_parameters", p.name,
          "a whole parameter (a tensor-parallel module's parts are gathered by the overload taking its communicator, parallel/checkpoint.hpp)",
          "rank " + std::to_string(p.shard.rank) + "'s part of " + std::to_string(p.shard.ranks));
  std::vector<T> host(static_cast<std::size_t>(p.size()));
  difftx::detail::copy_elements(host.data(), host_memory(), pick(p), *p.memory, p.size());
  return to_doubles(host.data(), host.size());
}

}  // namespace detail

// file[prefix + name] = each parameter's value, stored as `type`, and the
// module's architecture (modules/architecture.hpp) into file.metadata.
template <class Module>
void store_parameters(tensor_file& file, Module& module, dtype type, const std::string& prefix = "") {
  detail::store_each(file, module, type, prefix, [](const auto& p) { return detail::whole_values(p, [](const auto& q) { return q.value; }); });
  for (auto& [key, value] : describe(module, prefix)) file.metadata[key] = std::move(value);
  file.metadata[architecture_marker] = architecture_version;
}

// file[prefix + name] = each parameter's gradient, stored as `type`.
template <class Module>
void store_gradients(tensor_file& file, Module& module, dtype type, const std::string& prefix = "") {
  detail::store_each(file, module, type, prefix, [](const auto& p) { return detail::whole_values(p, [](const auto& q) { return q.grad; }); });
}

}  // namespace difftx::io
