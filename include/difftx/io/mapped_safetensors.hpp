// A safetensors file read in place: the file is mapped read-only
// (file_mapping), its header read and checked by read_safetensors_layout (the
// checks and errors of read_safetensors), and each tensor's bytes are a span
// into the mapping. Nothing is copied, and only the pages of the tensors that
// are read come from disk: load_parameters(module, file, "layers.3.") decodes
// one layer's tensors of a whole checkpoint straight into the module.
//
// Every dtype of the format is listed (I64, U8, BOOL, F8_E4M3, ...), with its
// bytes; load_parameters decodes F64, F32, F16 and BF16 and throws
// input_error naming the tensor and its dtype when asked for another. The
// file must not change while it is open (see file_mapping.hpp).
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <string_view>

#include "difftx/io/file_mapping.hpp"
#include "difftx/io/safetensors_layout.hpp"
#include "difftx/io/tensor_ref.hpp"

namespace difftx::io {

class mapped_safetensors {
 public:
  // Maps the file and checks its header: input_error("mapped_safetensors",
  // ...) as read_safetensors throws for a missing, unreadable or malformed file.
  explicit mapped_safetensors(const std::filesystem::path& path)
      : label_(path.string()),
        mapping_(path, "mapped_safetensors"),
        layout_(read_safetensors_layout(mapping_.bytes(), label_, "mapped_safetensors")) {}

  // The path, as errors name the file.
  const std::string& label() const noexcept { return label_; }
  const std::map<std::string, std::string>& metadata() const noexcept { return layout_.metadata; }
  // Every tensor by name: dtype (as spelled and as decoded), shape, where its bytes lie.
  const std::map<std::string, safetensors_entry>& tensors() const noexcept { return layout_.tensors; }
  bool contains(const std::string& name) const { return layout_.tensors.count(name) != 0; }

  // The tensor called name, its bytes a span into the mapping (valid while
  // this object lives); input_error naming `where` if the file has none.
  tensor_ref at(const std::string& name, std::string_view where = "mapped_safetensors") const {
    const auto it = layout_.tensors.find(name);
    if (it == layout_.tensors.end()) throw detail::missing_tensor(where, name, label_, layout_.tensors.size());
    return it->second.ref(mapping_.bytes());
  }
  // Gives a decoded tensor's pages back (file_mapping::release); its bytes
  // stay readable.
  void release(const tensor_ref& t) const noexcept { mapping_.release(t.bytes); }

 private:
  std::string label_;
  file_mapping mapping_;
  safetensors_layout layout_;
};

}  // namespace difftx::io
