// tokenizer.json's "post_processor": what encode(text, add_special_tokens)
// puts around the text's ids. TemplateProcessing's single template (e.g.
// <|begin_of_text|> $A: BOS first), ByteLevel (offsets only: nothing for ids)
// and Sequence. The pair template is not read (difftx encodes one text).
// Bert and Roberta processors are refused.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <difftx/ops/common.hpp>

#include "difftx/tokenizer/json_section.hpp"

namespace difftx::tokenizer {

class post_processor {
 public:
  virtual ~post_processor() = default;
  // ids of the text, with what add_special_tokens adds.
  virtual void process(std::vector<token_t>& ids, bool add_special_tokens) const = 0;
  // Every id it may add (checked against the vocabulary).
  virtual void added_ids(std::vector<token_t>& out) const = 0;
};

namespace detail {

class template_processor final : public post_processor {
 public:
  explicit template_processor(const json_section& s) {
    const auto single = s.at("single");
    const auto specials = s.find("special_tokens");
    for (std::size_t i = 0; i < single.size(); ++i) {
      const auto item = single[i];
      item.require_object();
      if (const auto sequence = item.find("Sequence"); sequence && item.value().size() == 1) {
        const auto id = sequence->at("id");
        if (id.string() != "A") id.fail("A (a single template has one sequence)");
        items_.push_back({true, {}});
        continue;
      }
      const auto special = item.find("SpecialToken");
      if (!special || item.value().size() != 1) item.fail("{\"Sequence\": {...}} or {\"SpecialToken\": {...}}");
      const auto name = special->at("id");
      const auto entry = specials ? specials->find(name.string()) : std::nullopt;
      if (!entry) name.fail("a key of post_processor.special_tokens");
      const auto ids = entry->at("ids");
      item_t added{false, {}};
      for (std::size_t k = 0; k < ids.size(); ++k) added.ids.push_back(static_cast<token_t>(ids[k].integer(0, max_token_id - 1)));
      items_.push_back(std::move(added));
    }
  }
  void process(std::vector<token_t>& ids, bool add_special_tokens) const override {
    if (!add_special_tokens) return;
    std::vector<token_t> out;
    for (const auto& item : items_) {
      if (item.text) out.insert(out.end(), ids.begin(), ids.end());
      else out.insert(out.end(), item.ids.begin(), item.ids.end());
    }
    ids = std::move(out);
  }
  void added_ids(std::vector<token_t>& out) const override {
    for (const auto& item : items_) out.insert(out.end(), item.ids.begin(), item.ids.end());
  }

 private:
  struct item_t {
    bool text;  // $A
    std::vector<token_t> ids;
  };
  std::vector<item_t> items_;
};

class no_ids_processor final : public post_processor {  // ByteLevel: it trims offsets, which difftx has none of
 public:
  void process(std::vector<token_t>&, bool) const override {}
  void added_ids(std::vector<token_t>&) const override {}
};

}  // namespace detail

using post_processors = std::vector<std::unique_ptr<post_processor>>;

// The post-processors section s describes (a Sequence's, flattened).
inline post_processors make_post_processors(const detail::json_section& s) {
  return detail::parts_of<post_processor>(s, "processors", [](const detail::json_section& part) -> std::unique_ptr<post_processor> {
    const auto& type = part.type();
    if (type == "TemplateProcessing") return std::make_unique<detail::template_processor>(part);
    if (type == "ByteLevel") return std::make_unique<detail::no_ids_processor>();
    part.unsupported("TemplateProcessing, ByteLevel or Sequence");
  });
}

}  // namespace difftx::tokenizer
