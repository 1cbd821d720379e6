// A Hugging Face model folder's weights, read in place: model.safetensors, or
// the shards that model.safetensors.index.json names ({"weight_map": {tensor:
// shard file}}), each mapped (mapped_safetensors): nothing is copied, and only
// the pages of the tensors read come from disk.
//
// Opening checks the whole folder before anything else reads it: the index is
// JSON with a weight_map of file names in the folder (no path leads out of
// it), every shard opens as safetensors, and every tensor the index names is
// in its shard. Errors are input_error("read_checkpoint", "<file>: <key>",
// ...), naming the file and the key or tensor at fault.
//
// It is a tensor_source (io/parameters.hpp): at(name) finds the tensor in its
// shard (errors name that file), release(tensor) gives a decoded tensor's
// pages back.
#pragma once

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "difftx/io/atomic_file.hpp"
#include "difftx/io/mapped_safetensors.hpp"

namespace difftx::io {

// Limits on a checkpoint's JSON files (config.json, the shard index,
// generation_config.json): far above any real one, and low enough that a
// hostile file cannot exhaust memory, or the stack of code that walks the tree.
inline constexpr std::size_t max_json_bytes = std::size_t{64} << 20;
inline constexpr int max_json_depth = 64;

// JSON text parsed whole; input_error(where, label, ...) when it is not JSON or
// nests deeper than max_json_depth (a value given twice is kept once, as JSON parsers do).
inline nlohmann::json parse_json_text(std::string_view text, std::string_view where, const std::string& label) {
  const auto limit_depth = [&](int depth, nlohmann::json::parse_event_t, const nlohmann::json&) {
    require(depth <= max_json_depth, where, label, "JSON nested at most " + std::to_string(max_json_depth) + " deep",
            "a value nested deeper");
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), limit_depth);
  } catch (const nlohmann::json::exception& e) {
    throw input_error(std::string(where), label, "valid JSON", e.what());
  }
}

// A JSON file parsed whole, as parse_json_text; input_error when it cannot be read or passes max_json_bytes.
inline nlohmann::json read_json_file(const std::filesystem::path& path, std::string_view where) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  require(ec || size <= max_json_bytes, where, path.string(),
          "a JSON file of at most " + std::to_string(max_json_bytes >> 20) + " MiB", std::to_string(size) + " bytes");
  const auto bytes = read_file_bytes(path, where);
  return parse_json_text(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), where,
                         path.string());
}

// model.safetensors.index.json's weight_map: (tensor, shard file name) pairs,
// each file a plain name in the folder; input_error naming `label: weight_map...`.
inline std::vector<std::pair<std::string, std::string>> parse_weight_map(const nlohmann::json& index,
                                                                         std::string_view where,
                                                                         const std::string& label) {
  const auto* map = index.is_object() && index.contains("weight_map") ? &index["weight_map"] : nullptr;
  require(map != nullptr && map->is_object(), where, label + ": weight_map",
          "an object mapping each tensor to its shard file", map ? map->type_name() : "no weight_map");
  std::vector<std::pair<std::string, std::string>> entries;
  for (const auto& [name, file] : map->items()) {
    const std::string key = label + ": weight_map." + name;
    require(file.is_string(), where, key, "a shard file name", file.dump());
    const auto& file_name = file.get_ref<const std::string&>();
    const std::filesystem::path shard(file_name);
    require(!file_name.empty() && shard.filename() == shard && file_name != "." && file_name != "..", where, key,
            "a file name in the checkpoint folder", "'" + file_name + "'");
    entries.emplace_back(name, file_name);
  }
  require(!entries.empty(), where, label + ": weight_map", "at least one tensor", "none");
  return entries;
}

class checkpoint_folder {
 public:
  static constexpr std::string_view single_file = "model.safetensors", index_file = "model.safetensors.index.json";

  explicit checkpoint_folder(const std::filesystem::path& folder) : label_(folder.string()) {
    namespace fs = std::filesystem;
    constexpr std::string_view where = "read_checkpoint";
    std::error_code ec;
    require(fs::is_directory(folder, ec), where, label_, "a checkpoint folder",
            fs::exists(folder, ec) ? "not a folder" : "no such folder");
    const auto index_path = folder / index_file;
    if (!fs::exists(index_path, ec)) {
      require(fs::exists(folder / single_file, ec), where, label_,
              std::string(single_file) + " or " + std::string(index_file) + " (a Hugging Face safetensors checkpoint)",
              "neither" + std::string(fs::exists(folder / "pytorch_model.bin", ec)
                                          ? " (pytorch_model.bin: save the model with safe_serialization=True)"
                                          : ""));
      files_.emplace_back(folder / single_file);
      weights_file_ = files_.back().label();
      for (const auto& [name, entry] : files_.back().tensors()) file_of_[name] = 0;
      return;
    }
    const std::string index_label = weights_file_ = index_path.string();
    std::map<std::string, std::size_t> shard_of_file;
    for (const auto& [name, file_name] : parse_weight_map(read_json_file(index_path, where), where, index_label)) {
      const std::string key = index_label + ": weight_map." + name;
      const fs::path shard(file_name);
      auto [it, added] = shard_of_file.emplace(file_name, files_.size());
      if (added) {
        require(fs::is_regular_file(folder / shard, ec), where, key, "the shard file " + (folder / shard).string(),
                fs::exists(folder / shard, ec) ? "not a regular file" : "no such file");
        files_.emplace_back(folder / shard);
      }
      const auto& holder = files_[it->second];
      require(holder.contains(name), where, holder.label() + ": " + name,
              "the tensor that " + std::string(index_file) + " places in this shard",
              "no such tensor (" + std::to_string(holder.tensors().size()) + " tensors in the file)");
      file_of_[name] = it->second;
    }
  }

  // The folder, as errors name it.
  const std::string& label() const noexcept { return label_; }
  // model.safetensors, or the index of the shards: the file that says which tensors there are.
  const std::string& weights_file() const noexcept { return weights_file_; }
  bool contains(const std::string& name) const { return file_of_.count(name) != 0; }
  // Every tensor's name, sorted.
  std::vector<std::string> names() const {
    std::vector<std::string> all;
    for (const auto& [name, file] : file_of_) all.push_back(name);
    return all;
  }
  // The file that holds tensor `name` (which must be there).
  const std::string& file_of(const std::string& name) const { return files_[file_of_.at(name)].label(); }

  tensor_ref at(const std::string& name, std::string_view where = "read_checkpoint") const {
    const auto it = file_of_.find(name);
    if (it == file_of_.end()) throw detail::missing_tensor(where, name, label_, file_of_.size());
    return files_[it->second].at(name, where);
  }
  void release(const tensor_ref& t) const noexcept {
    for (const auto& file : files_) file.release(t);  // only the file whose mapping holds t's bytes acts
  }

 private:
  std::string label_, weights_file_;
  std::vector<mapped_safetensors> files_;
  std::map<std::string, std::size_t> file_of_;  // tensor -> its file in files_
};

}  // namespace difftx::io
