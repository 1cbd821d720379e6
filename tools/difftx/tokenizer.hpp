// Text in and out of `difftx generate --text` and `difftx tokenize`: the
// tokenizer beside the weights, through difftx::tokenizer (tokenizer.json;
// tokenizer.model where the build links SentencePiece, Debian:
// libsentencepiece-dev). Without one this build can read, --text is a usage
// error saying which, and token ids (--prompt) still work.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <difftx/tokenizer/text_tokenizer.hpp>

namespace difftx::cli {

using tokenizer::text_tokenizer;

// The tokenizer in folder; a CLI::ValidationError for `option` when there is
// none this build can read (neither file, or only tokenizer.model and no
// SentencePiece in this build), input_error when the file is malformed or
// holds what difftx does not implement.
std::unique_ptr<text_tokenizer> open_tokenizer(const std::filesystem::path& folder, const std::string& option);

// The folder where --model's tokenizer lies: the folder itself, or a file's folder.
std::filesystem::path tokenizer_folder(const std::filesystem::path& model);

// The prompt generate feeds the model for text, and tokenize prints: the
// tokenizer's ids with its special tokens, beginning with BOS once. If the
// tokenizer's post-processor puts BOS first (tokenizer.json's template), that
// is it; else the bos_token_id of the model folder's config.json, else the
// tokenizer's own BOS (SentencePiece's), is put first; else none.
std::vector<token_t> prompt_ids(const std::filesystem::path& model, const text_tokenizer& tokenizer, std::string_view text);

// ids as "1,2,3", as generate and tokenize print them.
std::string joined_ids(const std::vector<token_t>& ids);

}  // namespace difftx::cli
