// A Hugging Face DiffLlama folder from C++: load the weights, encode a prompt
// with the folder's tokenizer, sample new tokens until end of sequence, print
// their text. What `difftx generate --text` does, without its streaming.
//
//   build/release/examples/generate_text MODEL_DIR "The capital of France is"
#include <iostream>
#include <string>
#include <vector>

#include <difftx/generation/generate.hpp>
#include <difftx/io/diffllama.hpp>
#include <difftx/policy/simd.hpp>
#include <difftx/tokenizer/open.hpp>

int main(int argc, char** argv) try {
  const std::string folder = argc > 1 ? argv[1] : ".";
  const std::string text = argc > 2 ? argv[2] : "Hello";
  // [generate-snippet]
  auto model = difftx::io::load_diffllama<float, difftx::policy::simd>(folder);  // config.json + safetensors
  auto tok = difftx::tokenizer::open_tokenizer(folder);  // tokenizer.json, else tokenizer.model
  std::vector<difftx::token_t> prompt = tok->encode(text);
  if (!tok->adds_bos() && tok->bos_id()) prompt.insert(prompt.begin(), *tok->bos_id());  // SentencePiece: BOS by hand
  difftx::generation_options o{.max_new_tokens = 32,
                               .sampling = {.temperature = 0.7, .top_p = 0.9, .seed = 1}};
  if (tok->eos_id()) o.stop_tokens = {*tok->eos_id()};
  std::vector<difftx::token_t> tokens = difftx::generate(model, prompt, o);  // ends with EOS if it stopped there
  std::cout << text << tok->decode(tokens, /*skip_special_tokens=*/true) << "\n";
  // [generate-snippet]
  std::cout << tokens.size() << " new tokens\n";
  return tokens.empty() ? 1 : 0;
} catch (const difftx::input_error& e) {
  std::cerr << e.what() << "\n";
  return 3;
}
