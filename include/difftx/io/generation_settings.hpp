// What a Hugging Face model folder says about generating with it, as
// transformers' generate reads it: generation_config.json where the folder has
// one (transformers then reads no generation key of config.json), else
// config.json; transformers' defaults for what the file does not say
// (do_sample false, temperature 1, top_k 50, top_p 1, no min_p, repetition
// penalty 1). Llama-3's folders end a reply with any of several ids
// (eos_token_id: a list), which the tokenizer's own EOS does not name.
//
//   auto settings = difftx::io::read_generation_settings("Llama-3.2-1B-Instruct/");
//   difftx::generation_options o{.max_new_tokens = 64, .stop_tokens = settings.eos_token_ids,
//                                .sampling = settings.sampling(/*seed=*/1)};
//
// Errors: input_error("read_generation_settings", "<file>: <key>", ...) for a
// value of the wrong type, an id out of [0, 2^31), or a sampling value
// transformers would refuse (checked where do_sample uses it).
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "difftx/generation/sampling_options.hpp"
#include "difftx/io/checkpoint_folder.hpp"

namespace difftx::io {

struct generation_settings {
  std::vector<token_t> eos_token_ids;  // eos_token_id, one id or a list; empty where the file names none
  std::optional<token_t> bos_token_id;
  bool do_sample = false;  // false: greedy, whatever the values below say
  double temperature = 1.0;
  index_t top_k = 50;
  double top_p = 1.0;
  double min_p = 0.0;  // none
  double repetition_penalty = 1.0;
  std::string file;  // the file these come from

  // What transformers' generate samples with: greedy unless do_sample (the
  // repetition penalty either way), the draws from seed.
  sampling_options sampling(std::uint64_t seed = 0) const {
    sampling_options o{.repetition_penalty = repetition_penalty, .seed = seed};
    if (do_sample) {
      o.temperature = temperature;
      o.top_k = top_k;
      o.top_p = top_p;
      o.min_p = min_p;
    }
    return o;
  }
};

namespace detail {

// j's value at key; null where it is absent.
inline const nlohmann::json& value_at(const nlohmann::json& j, const char* key) {
  static const nlohmann::json null;
  const auto it = j.find(key);
  return it == j.end() ? null : *it;
}

}  // namespace detail

// A generation_config.json (or config.json) as transformers reads it; label (the file) names errors.
inline generation_settings parse_generation_settings(const nlohmann::json& j, const std::string& label) {
  constexpr std::string_view where = "read_generation_settings";
  require(j.is_object(), where, label, "a JSON object", j.type_name());
  const auto fail = [&](const char* key, const std::string& expected, const nlohmann::json& got) {
    throw input_error(std::string(where), label + ": " + key, expected, got.dump());
  };
  const auto id = [&](const char* key, const nlohmann::json& v) {
    if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() >= (1LL << 31))
      fail(key, "a token id or a list of token ids", v);
    return static_cast<token_t>(v.get<long long>());
  };
  const auto number = [&](const char* key, double otherwise) {
    const auto& v = detail::value_at(j, key);
    if (v.is_null()) return otherwise;
    if (!v.is_number() || !std::isfinite(v.get<double>())) fail(key, "a number", v);
    return v.get<double>();
  };

  generation_settings s;
  s.file = label;
  if (const auto& eos = detail::value_at(j, "eos_token_id"); eos.is_array())
    for (const auto& v : eos) s.eos_token_ids.push_back(id("eos_token_id", v));
  else if (!eos.is_null())
    s.eos_token_ids.push_back(id("eos_token_id", eos));
  if (const auto& bos = detail::value_at(j, "bos_token_id"); !bos.is_null()) s.bos_token_id = id("bos_token_id", bos);
  if (const auto& sample = detail::value_at(j, "do_sample"); !sample.is_null()) {
    if (!sample.is_boolean()) fail("do_sample", "true or false", sample);
    s.do_sample = sample.get<bool>();
  }
  s.temperature = number("temperature", 1.0);
  s.top_p = number("top_p", 1.0);
  s.min_p = number("min_p", 0.0);
  s.repetition_penalty = number("repetition_penalty", 1.0);
  if (const auto& k = detail::value_at(j, "top_k"); !k.is_null()) {
    if (!k.is_number_integer() || k.get<long long>() < 0 || k.get<long long>() >= (1LL << 31))
      fail("top_k", "a count >= 0", k);
    s.top_k = k.get<index_t>();
  }
  if (!(s.repetition_penalty > 0))
    fail("repetition_penalty", "a penalty > 0 (1: none)", detail::value_at(j, "repetition_penalty"));
  if (s.do_sample) {  // what transformers' warpers refuse
    if (!(s.temperature > 0))
      fail("temperature", "a temperature > 0 (do_sample is true)", detail::value_at(j, "temperature"));
    if (!(s.top_p > 0 && s.top_p <= 1)) fail("top_p", "a probability in (0, 1]", detail::value_at(j, "top_p"));
    if (!(s.min_p >= 0 && s.min_p <= 1)) fail("min_p", "a fraction in [0, 1]", detail::value_at(j, "min_p"));
  }
  return s;
}

// folder/generation_config.json if it exists, else folder/config.json; input_error where it has neither.
inline generation_settings read_generation_settings(const std::filesystem::path& folder) {
  std::error_code ec;
  for (const char* name : {"generation_config.json", "config.json"})
    if (const auto path = folder / name; std::filesystem::exists(path, ec))
      return parse_generation_settings(read_json_file(path, "read_generation_settings"), path.string());
  throw input_error("read_generation_settings", folder.string(), "a folder with generation_config.json or config.json",
                    std::filesystem::is_directory(folder, ec) ? "neither" : "no such folder");
}

}  // namespace difftx::io
