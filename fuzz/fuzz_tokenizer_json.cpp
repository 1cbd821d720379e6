// libFuzzer target: difftx::tokenizer::hf_tokenizer on a tokenizer.json and a
// text, both from the input:
//
//   TOKENIZER_JSON ["\n%%\n" TEXT]
//
// split at the first separator; without one the text is a fixed mix of
// scripts, digits, whitespace and special tokens. input_error from reading
// the file or encoding the text is the documented answer: fine. A finding:
// anything else (another exception, a sanitizer report), or, for a file it
// accepts: encode accepting text that is not UTF-8 or refusing text that is
// (other than for a regular expression's match limits), an id from encode
// that has no token, decode refusing encode's ids, or decode giving text that
// is not UTF-8.
#include <cstddef>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <difftx/tokenizer/hf_tokenizer.hpp>

#include "fuzz_checks.hpp"

namespace {

[[noreturn]] void finding(const char* what) { difftx::fuzz::finding("fuzz_tokenizer_json", what); }

constexpr std::string_view separator = "\n%%\n";
constexpr std::string_view default_text =
    "Hello wörld, it's 2024: 12345 ids!\n\n\t Привет 你好 😀👍🏽 <|begin_of_text|><s> x</s> <unk>\r\n  end ";

void check_ids(const difftx::tokenizer::hf_tokenizer& tok, const std::vector<difftx::token_t>& ids) {
  for (const auto id : ids)
    if (id < 0 || id >= tok.vocab_size() || !tok.token_of(id)) finding("encode gave an id that has no token");
  for (const bool skip : {false, true}) {
    std::string text;
    try {
      text = tok.decode(ids, skip);
    } catch (const difftx::input_error& e) {
      std::cerr << e.what() << "\n";
      finding("decode refused the ids encode gave");
    }
    if (difftx::tokenizer::utf8::first_invalid(text) != std::string::npos) finding("decode gave text that is not UTF-8");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const auto cut = input.find(separator);
  const auto json = input.substr(0, cut);
  const auto text = cut == std::string_view::npos ? default_text : input.substr(cut + separator.size());
  std::optional<difftx::tokenizer::hf_tokenizer> tok;
  try {
    tok.emplace(json);
  } catch (const difftx::input_error&) {
    return 0;
  }
  const bool valid = difftx::tokenizer::utf8::first_invalid(text) == std::string::npos;
  for (const bool special : {true, false}) {
    std::vector<difftx::token_t> ids;
    try {
      ids = tok->encode(text, special);
    } catch (const difftx::input_error& e) {
      const std::string message = e.what();
      if (valid && message.find("PCRE2's limits") == std::string::npos) {
        std::cerr << message << "\n";
        finding("encode refused valid UTF-8");
      }
      return 0;
    }
    if (!valid) finding("encode accepted text that is not UTF-8");
    check_ids(*tok, ids);
  }
  return 0;
}
