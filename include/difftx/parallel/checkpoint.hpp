// Saving a tensor-parallel model (tensor_parallel.hpp) as one whole
// checkpoint: every rank calls it (collective), every rank gets the whole
// file's tensors, and one of them (usually rank 0) writes it. Loading needs
// nothing extra: io::load_parameters gives each rank its part.
//
//   difftx::io::tensor_file file;
//   difftx::io::store_parameters(file, model, difftx::io::dtype::bf16, comm);
//   if (comm.rank() == 0) difftx::io::write_safetensors(path, file);
#pragma once

#include <string>

#include "difftx/io/parameters.hpp"
#include "difftx/parallel/tensor_parallel.hpp"

namespace difftx::io {

// file[prefix + name] = each parameter's whole value, stored as `type`.
template <class Module, parallel::communicator Comm>
void store_parameters(tensor_file& file, Module& module, dtype type, Comm& comm, const std::string& prefix = "") {
  detail::store_each(file, module, type, prefix, [&](const auto& p) {
    const auto whole = parallel::whole_parameter(p, p.value, comm);
    return to_doubles(whole.data(), whole.size());
  });
}

// file[prefix + name] = each parameter's whole gradient, stored as `type`.
template <class Module, parallel::communicator Comm>
void store_gradients(tensor_file& file, Module& module, dtype type, Comm& comm, const std::string& prefix = "") {
  detail::store_each(file, module, type, prefix, [&](const auto& p) {
    const auto whole = parallel::whole_parameter(p, p.grad, comm);
    return to_doubles(whole.data(), whole.size());
  });
}

}  // namespace difftx::io
