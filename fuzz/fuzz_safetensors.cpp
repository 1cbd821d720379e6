// libFuzzer target: difftx::io::parse_safetensors on the input's bytes (a
// .safetensors file).
//
// input_error is the documented answer to a malformed file: fine. Anything else
// (a sanitizer report, another exception, an abort) is a finding. A file the
// reader accepts must also hold together and follow the format's rules (as
// safetensors.hpp states them): every tensor's data is as long as its shape says
// (counted without overflow) and decodes, the header holds no NUL byte and no
// name twice in one object, and writing the result (write_safetensors_to) and
// reading that gives the same tensors and metadata.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <difftx/io/safetensors.hpp>
#include <nlohmann/json.hpp>

#include "fuzz_checks.hpp"

namespace {

[[noreturn]] void finding(const char* what) { difftx::fuzz::finding("fuzz_safetensors", what); }

// Whether the JSON text (valid: the reader accepted it) names something twice in one object.
bool has_repeated_name(std::string_view text) {
  using json = nlohmann::json;
  std::vector<std::set<std::string>> open;
  bool repeated = false;
  const json::parser_callback_t callback = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) open.emplace_back();
    if (event == json::parse_event_t::object_end && !open.empty()) open.pop_back();
    if (event == json::parse_event_t::key && !open.empty() &&
        !open.back().insert(parsed.get<std::string>()).second)
      repeated = true;
    return true;
  };
  (void)json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/false);
  return repeated;
}

bool same(const difftx::io::tensor_file& a, const difftx::io::tensor_file& b) {
  if (a.metadata != b.metadata || a.tensors.size() != b.tensors.size()) return false;
  for (const auto& [name, t] : a.tensors) {
    const auto it = b.tensors.find(name);
    if (it == b.tensors.end() || it->second.type != t.type || it->second.shape != t.shape ||
        it->second.bytes != t.bytes)
      return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::byte> bytes(size);
  if (size > 0) std::memcpy(bytes.data(), data, size);
  difftx::io::tensor_file file;
  try {
    file = difftx::io::parse_safetensors(bytes, "fuzz.safetensors");
  } catch (const difftx::input_error&) {
    return 0;
  }
  for (const auto& [name, t] : file.tensors) difftx::fuzz::check_tensor("fuzz_safetensors", t);
  std::uint64_t header_size = 0;
  std::memcpy(&header_size, data, 8);  // accepted: at least 8 bytes, the header within them
  const std::string_view header(reinterpret_cast<const char*>(data) + 8, static_cast<std::size_t>(header_size));
  if (header.find('\0') != std::string_view::npos) finding("accepted a header with a NUL byte");
  if (has_repeated_name(header)) finding("accepted a header that gives a name twice in one object");
  std::ostringstream out;
  difftx::io::write_safetensors_to(out, file);
  const std::string text = out.str();
  std::vector<std::byte> again(text.size());
  if (!text.empty()) std::memcpy(again.data(), text.data(), text.size());
  difftx::io::tensor_file back;
  try {
    back = difftx::io::parse_safetensors(again, "fuzz.safetensors (written back)");
  } catch (const difftx::input_error& e) {
    std::cerr << e.what() << "\n";
    finding("cannot read back what it wrote from an accepted file");
  }
  if (!same(file, back)) finding("reads back different tensors or metadata from what it wrote");
  return 0;
}
