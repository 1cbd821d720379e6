// The tokenizer beside a checkpoint's weights: tokenizer.json (Hugging Face
// tokenizers, always readable) if the folder has one, else tokenizer.model
// (SentencePiece: only where difftx::sentencepiece is linked, which defines
// DIFFTX_SENTENCEPIECE).
//
//   const auto tok = difftx::tokenizer::open_tokenizer("Llama-3.2-1B/");
//   auto ids = tok->encode("Hello");
#pragma once

#include <filesystem>
#include <memory>
#include <optional>

#include "difftx/core/error.hpp"
#include "difftx/tokenizer/hf_tokenizer.hpp"
#include "difftx/tokenizer/text_tokenizer.hpp"

#if defined(DIFFTX_SENTENCEPIECE)
#include "difftx/tokenizer/sentencepiece.hpp"
#endif

namespace difftx::tokenizer {

// Whether this program reads tokenizer.model (it links difftx::sentencepiece).
#if defined(DIFFTX_SENTENCEPIECE)
inline constexpr bool reads_sentencepiece = true;
#else
inline constexpr bool reads_sentencepiece = false;
#endif

// folder/tokenizer.json if it exists, else folder/tokenizer.model if that does, else nullopt.
inline std::optional<std::filesystem::path> find_tokenizer_file(const std::filesystem::path& folder) {
  std::error_code ec;
  for (const auto* name : {"tokenizer.json", "tokenizer.model"})
    if (std::filesystem::exists(folder / name, ec)) return folder / name;
  return std::nullopt;
}

// The tokenizer find_tokenizer_file names, read; input_error when there is
// none, it is malformed, or it is a tokenizer.model and this program does not
// read SentencePiece.
inline std::unique_ptr<text_tokenizer> open_tokenizer(const std::filesystem::path& folder) {
  const auto file = find_tokenizer_file(folder);
  if (!file) throw input_error("open_tokenizer", folder.string(), "a folder with tokenizer.json or tokenizer.model", "neither");
  if (file->filename() == "tokenizer.json") return std::make_unique<hf_tokenizer>(hf_tokenizer::from_file(*file));
#if defined(DIFFTX_SENTENCEPIECE)
  return std::make_unique<sentencepiece_tokenizer>(*file);
#else
  throw input_error("open_tokenizer", file->string(), "a program linked with difftx::sentencepiece for a SentencePiece model",
                    "one without SentencePiece");
#endif
}

}  // namespace difftx::tokenizer
