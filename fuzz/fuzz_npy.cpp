// libFuzzer target: difftx::io::parse_npy on the input's bytes (an .npy file).
//
// input_error is the documented answer to a malformed file: fine. Anything else
// (a sanitizer report, another exception, an abort) is a finding. A file the
// reader accepts must also hold together: its data is as long as its shape
// says (counted without overflow), every element decodes, and writing it back
// (write_npy_to) and reading that gives the same tensor.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <difftx/io/npy.hpp>

#include "fuzz_checks.hpp"

namespace {
[[noreturn]] void finding(const char* what) { difftx::fuzz::finding("fuzz_npy", what); }
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::byte> bytes(size);
  if (size > 0) std::memcpy(bytes.data(), data, size);
  difftx::io::stored_tensor t;
  try {
    t = difftx::io::parse_npy(std::move(bytes), "fuzz.npy");
  } catch (const difftx::input_error&) {
    return 0;
  }
  difftx::fuzz::check_tensor("fuzz_npy", t);

  std::ostringstream out;
  try {
    difftx::io::write_npy_to(out, t, "fuzz.npy (written back)");
  } catch (const difftx::input_error&) {
    return 0;  // e.g. a rank whose header does not fit .npy 1.0: the writer says so
  }
  const std::string text = out.str();
  std::vector<std::byte> again(text.size());
  std::memcpy(again.data(), text.data(), text.size());
  difftx::io::stored_tensor back;
  try {
    back = difftx::io::parse_npy(std::move(again), "fuzz.npy (written back)");
  } catch (const difftx::input_error& e) {
    std::cerr << e.what() << "\n";
    finding("cannot read back what it wrote from an accepted file");
  }
  if (back.type != t.type || back.shape != t.shape || back.bytes != t.bytes)
    finding("reads back a different tensor from what it wrote");
  return 0;
}
