// difftx::tokenizer through an installed difftx: a small tokenizer.json (a
// byte-level BPE of two merges, BOS by template) encodes and decodes back.
#include <cstdio>
#include <vector>

#include <difftx/tokenizer/open.hpp>

int main() {
  const char* json = R"({"version": "1.0", "truncation": null, "padding": null,
    "added_tokens": [{"id": 5, "content": "<s>", "special": true, "normalized": false}],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
    "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
      {"Sequence": {"id": "A", "type_id": 0}}], "special_tokens": {"<s>": {"id": "<s>", "ids": [5], "tokens": ["<s>"]}}},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": {"h": 0, "i": 1, "hi": 2, "Ġ": 3, "Ġhi": 4}, "merges": ["h i", "Ġ hi"]}})";
  const difftx::tokenizer::hf_tokenizer tok(json);
  const auto ids = tok.encode("hi hi");
  const bool ok = ids == std::vector<difftx::token_t>{5, 2, 4} && tok.decode(ids, true) == "hi hi";
  std::printf("consumer: difftx::tokenizer %s (SentencePiece %s)\n", ok ? "encodes and decodes" : "FAILED",
              difftx::tokenizer::reads_sentencepiece ? "linked" : "not linked");
  return ok ? 0 : 1;
}
