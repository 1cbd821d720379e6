// docs/tokenizer.md's code, on the Llama-3 tokenizer fixture (a folder with
// its tokenizer.json, the program's argument). CTest runs it: the two readers
// and the text give the same ids, and decoding gives the text back.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <difftx/tokenizer/open.hpp>   // CMake: difftx::tokenizer (or difftx::sentencepiece)

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: snippet_tokenizer FOLDER (with a tokenizer.json)\n";
    return 2;
  }
  const std::filesystem::path folder = argv[1];
  std::ifstream file(folder / "tokenizer.json");
  std::stringstream contents;
  contents << file.rdbuf();
  const std::string json_text = contents.str();

auto tok = difftx::tokenizer::open_tokenizer(folder);  // tokenizer.json, else tokenizer.model
std::vector<difftx::token_t> ids = tok->encode("Hello world");  // with what the template adds: BOS first
std::vector<difftx::token_t> bare = tok->encode("Hello world", /*add_special_tokens=*/false);
std::string text = tok->decode(ids, /*skip_special_tokens=*/true);
std::optional<difftx::token_t> bos = tok->bos_id(), eot = tok->id_of("<|eot_id|>");
std::optional<std::string> first = tok->token_of(ids.front());  // its vocabulary entry

// or the file directly, or its text:
auto llama3 = difftx::tokenizer::hf_tokenizer::from_file(folder / "tokenizer.json");
difftx::tokenizer::hf_tokenizer from_text(json_text, "my tokenizer.json");

  const bool same = llama3.encode("Hello world") == ids && from_text.encode("Hello world") == ids;
  const bool bos_first = bos && !ids.empty() && ids.front() == *bos && ids.size() == bare.size() + 1;
  std::cout << ids.size() << " ids, " << text << ", <|eot_id|> " << (eot ? std::to_string(*eot) : "none") << ", first "
            << first.value_or("?") << "\n";
  return same && bos_first && text == "Hello world" ? 0 : 1;
}
