// The text between added tokens as normalizers and pre-tokenizers pass it on:
// pieces, each becoming one word for the model; and how a pre-tokenizer's
// matches cut a piece (tokenizers' SplitDelimiterBehavior).
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "difftx/tokenizer/json_section.hpp"

namespace difftx::tokenizer {

struct piece {
  std::string text;
  // Whether it begins at the input's first byte (Metaspace's prepend_scheme "first").
  bool at_start = false;
};
using pieces = std::vector<piece>;

// A stretch of a piece: a match of the pattern or the text between matches.
struct stretch {
  std::size_t begin, end;
  bool match;
};

enum class split_behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

inline split_behavior split_behavior_of(const detail::json_section& s) {
  const auto& name = s.string();
  if (name == "Removed") return split_behavior::removed;
  if (name == "Isolated") return split_behavior::isolated;
  if (name == "MergedWithPrevious") return split_behavior::merged_with_previous;
  if (name == "MergedWithNext") return split_behavior::merged_with_next;
  if (name == "Contiguous") return split_behavior::contiguous;
  s.fail("Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous");
}

// Appends to out the pieces `behavior` makes of p from its stretches (which
// cover p.text in order); empty pieces are dropped, as tokenizers drops them.
inline void cut(const piece& p, const std::vector<stretch>& stretches, split_behavior behavior, pieces& out) {
  // The kept ranges; merging extends the last one (or, for merged_with_next, the next one).
  std::vector<stretch> kept;
  kept.reserve(stretches.size());
  bool previous_match = false;
  switch (behavior) {
    case split_behavior::isolated:
      kept = stretches;
      break;
    case split_behavior::removed:
      for (const auto& s : stretches)
        if (!s.match) kept.push_back(s);
      break;
    case split_behavior::contiguous:
      for (const auto& s : stretches) {
        if (s.match == previous_match && !kept.empty()) kept.back().end = s.end;
        else kept.push_back(s);
        previous_match = s.match;
      }
      break;
    case split_behavior::merged_with_previous:
      for (const auto& s : stretches) {
        if (s.match && !previous_match && !kept.empty()) kept.back().end = s.end;
        else kept.push_back(s);
        previous_match = s.match;
      }
      break;
    case split_behavior::merged_with_next:
      for (auto it = stretches.rbegin(); it != stretches.rend(); ++it) {
        if (it->match && !previous_match && !kept.empty()) kept.back().begin = it->begin;
        else kept.push_back(*it);
        previous_match = it->match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
  }
  for (const auto& k : kept)
    if (k.end > k.begin) out.push_back({p.text.substr(k.begin, k.end - k.begin), p.at_start && k.begin == 0});
}

// The stretches of text from its matches (begin, end pairs in order, as for_each_match gives them).
class stretch_builder {
 public:
  explicit stretch_builder(std::size_t size, bool invert = false) : size_(size), invert_(invert) {}
  void add(std::size_t begin, std::size_t end) {
    if (begin > previous_) out_.push_back({previous_, begin, invert_});
    out_.push_back({begin, end, !invert_});
    previous_ = end;
  }
  std::vector<stretch>& finish() {
    if (previous_ < size_) out_.push_back({previous_, size_, invert_});
    return out_;
  }

 private:
  std::size_t size_, previous_ = 0;
  bool invert_;
  std::vector<stretch> out_;
};

}  // namespace difftx::tokenizer
