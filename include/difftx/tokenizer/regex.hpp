// Regular expressions of tokenizer.json (Split, Replace, ByteLevel's GPT-2
// pattern) through PCRE2: UTF-8 with Unicode properties (\p{L}, and \s and \w
// as Unicode defines them), JIT-compiled where the library has a JIT, and
// bounded: a match that takes more than match_limit steps, or more memory
// than heap_limit_kib, ends with input_error instead of running on (a
// backtracking pattern such as (a+)+$ on a long run of a's).
//
// tokenizers matches with Oniguruma; the patterns these files use (Llama-3's,
// GPT-2's, Qwen's) mean the same in both.
#pragma once

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "difftx/core/error.hpp"
#include "difftx/tokenizer/json_section.hpp"
#include "difftx/tokenizer/utf8.hpp"

namespace difftx::tokenizer {

class regex {
 public:
  static constexpr std::uint32_t match_limit = 10'000'000;
  static constexpr std::uint32_t heap_limit_kib = 64 * 1024;
  static constexpr std::size_t jit_stack_bytes = std::size_t{8} << 20;

  // pattern from the key `label` names ("tokenizer.json: pre_tokenizer.pattern.Regex"):
  // a pattern PCRE2 cannot compile is refused with its message and offset.
  regex(std::string_view pattern, std::string label) : label_(std::move(label)) {
    int code = 0;
    PCRE2_SIZE offset = 0;
    code_.reset(pcre2_compile_8(reinterpret_cast<PCRE2_SPTR8>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                &code, &offset, nullptr));
    if (!code_)
      throw input_error("read_tokenizer", label_, "a regular expression PCRE2 compiles",
                        message(code) + " at offset " + std::to_string(offset));
    std::uint32_t has_jit = 0;
    pcre2_config_8(PCRE2_CONFIG_JIT, &has_jit);
    // Without a JIT (or if it fails), pcre2_match interprets the pattern.
    jit_ = has_jit && pcre2_jit_compile_8(code_.get(), PCRE2_JIT_COMPLETE) == 0;
  }
  regex(const regex&) = delete;
  regex& operator=(const regex&) = delete;

  const std::string& label() const noexcept { return label_; }
  // Whether PCRE2 compiled the pattern to machine code (else it interprets it).
  bool jit() const noexcept { return jit_; }

  // Calls f(begin, end) for each match in text (valid UTF-8), left to right, as
  // Oniguruma's find_iter does: an empty match right where the previous one
  // ended is skipped, and the search goes on a character later.
  template <class F>
  void for_each_match(std::string_view text, F&& f) const {
    const auto s = lease();
    std::size_t start = 0;
    std::optional<std::size_t> last_end;
    while (start <= text.size()) {
      const int rc = pcre2_match_8(code_.get(), reinterpret_cast<PCRE2_SPTR8>(text.data()), text.size(), start,
                                   PCRE2_NO_UTF_CHECK, s.get()->data, s.get()->context);
      if (rc == PCRE2_ERROR_NOMATCH) return;
      if (rc < 0)
        throw input_error("tokenizer::encode", label_, "a text the regular expression matches within PCRE2's limits",
                          message(rc) + ", searching from byte " + std::to_string(start) + " of a " +
                              std::to_string(text.size()) + "-byte piece");
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer_8(s.get()->data);
      const std::size_t begin = ovector[0], end = ovector[1];
      if (begin > end)  // \K in a lookahead can do this
        throw input_error("tokenizer::encode", label_, "matches that end after they begin",
                          "one from byte " + std::to_string(begin) + " to " + std::to_string(end));
      if (begin == end && last_end == end) {
        start = end < text.size() ? end + utf8::char_length(text[end]) : end + 1;
        continue;
      }
      f(begin, end);
      last_end = end;
      start = end;
    }
  }

 private:
  struct code_free {
    void operator()(pcre2_code_8* c) const noexcept { pcre2_code_free_8(c); }
  };
  // What one match needs besides the pattern, reused across calls (one per thread at a time).
  struct scratch {
    pcre2_match_data_8* data = nullptr;
    pcre2_match_context_8* context = nullptr;
    pcre2_jit_stack_8* stack = nullptr;
    explicit scratch(const pcre2_code_8* code) {
      data = pcre2_match_data_create_from_pattern_8(code, nullptr);
      context = pcre2_match_context_create_8(nullptr);
      if (!data || !context) throw std::bad_alloc();
      pcre2_set_match_limit_8(context, match_limit);
      pcre2_set_depth_limit_8(context, match_limit);
      pcre2_set_heap_limit_8(context, heap_limit_kib);
      stack = pcre2_jit_stack_create_8(32 * 1024, jit_stack_bytes, nullptr);
      if (stack) pcre2_jit_stack_assign_8(context, nullptr, stack);
    }
    ~scratch() {
      pcre2_match_data_free_8(data);
      pcre2_match_context_free_8(context);
      pcre2_jit_stack_free_8(stack);
    }
    scratch(const scratch&) = delete;
    scratch& operator=(const scratch&) = delete;
  };
  struct pool {
    std::mutex mutex;
    std::vector<std::unique_ptr<scratch>> free;
  };
  // A scratch taken from the pool, given back when it goes.
  class lease_t {
   public:
    lease_t(pool& p, std::unique_ptr<scratch> s) : pool_(&p), scratch_(std::move(s)) {}
    ~lease_t() {
      const std::lock_guard lock(pool_->mutex);
      pool_->free.push_back(std::move(scratch_));
    }
    lease_t(const lease_t&) = delete;
    lease_t& operator=(const lease_t&) = delete;
    scratch* get() const noexcept { return scratch_.get(); }

   private:
    pool* pool_;
    std::unique_ptr<scratch> scratch_;
  };

  lease_t lease() const {
    {
      const std::lock_guard lock(pool_->mutex);
      if (!pool_->free.empty()) {
        auto s = std::move(pool_->free.back());
        pool_->free.pop_back();
        return lease_t(*pool_, std::move(s));
      }
    }
    return lease_t(*pool_, std::make_unique<scratch>(code_.get()));
  }

  static std::string message(int code) {
    PCRE2_UCHAR8 buffer[256];
    const int n = pcre2_get_error_message_8(code, buffer, sizeof buffer);
    return n > 0 ? std::string(reinterpret_cast<const char*>(buffer), static_cast<std::size_t>(n))
                 : "PCRE2 error " + std::to_string(code);
  }

  std::string label_;
  std::unique_ptr<pcre2_code_8, code_free> code_;
  bool jit_ = false;
  std::unique_ptr<pool> pool_ = std::make_unique<pool>();
};

// pattern as a regular expression that matches it literally (Split's and Replace's {"String": ...}).
inline std::string quoted_pattern(std::string_view pattern) {
  std::string out = "\\Q";
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern.substr(i, 2) == "\\E") {
      out += "\\E\\\\E\\Q";
      ++i;
    } else {
      out += pattern[i];
    }
  }
  return out + "\\E";
}

// A "pattern" key of tokenizer.json: {"String": literal} or {"Regex": pattern}.
inline std::unique_ptr<regex> pattern_of(const detail::json_section& s) {
  s.require_object();
  if (s.value().size() == 1) {
    if (const auto literal = s.find("String")) return std::make_unique<regex>(quoted_pattern(literal->string()), literal->label());
    if (const auto pattern = s.find("Regex")) return std::make_unique<regex>(pattern->string(), pattern->label());
  }
  s.fail("{\"String\": ...} or {\"Regex\": ...}");
}

// text with every match of pattern replaced by content (tokenizers' Replace).
inline std::string replace_all(const regex& pattern, std::string_view text, std::string_view content) {
  std::string out;
  out.reserve(text.size());
  std::size_t previous = 0;
  pattern.for_each_match(text, [&](std::size_t begin, std::size_t end) {
    out.append(text.substr(previous, begin - previous)).append(content);
    previous = end;
  });
  return out.append(text.substr(previous));
}

}  // namespace difftx::tokenizer
