// A Hugging Face DiffLlama folder from C++: load the weights, read what the
// folder says about generating (its end-of-sequence ids: Llama-3 folders name
// several), encode a prompt with the folder's tokenizer, generate until end
// of sequence, and stream the text as it comes. What `difftx generate --text`
// does.
//
//   build/release/examples/generate_text MODEL_DIR "The capital of France is"
#include <iostream>
#include <string>
#include <vector>

#include <difftx/generation/generate.hpp>
#include <difftx/io/diffllama.hpp>
#include <difftx/io/generation_settings.hpp>
#include <difftx/policy/simd.hpp>
#include <difftx/tokenizer/incremental_detokenizer.hpp>
#include <difftx/tokenizer/open.hpp>

int main(int argc, char** argv) try {
  const std::string folder = argc > 1 ? argv[1] : ".";
  const std::string text = argc > 2 ? argv[2] : "Hello";
  // [generate-snippet]
  auto model = difftx::io::load_diffllama<float, difftx::policy::simd>(folder);  // config.json + safetensors
  auto tok = difftx::tokenizer::open_tokenizer(folder);  // tokenizer.json, else tokenizer.model
  auto settings = difftx::io::read_generation_settings(folder);  // generation_config.json, else config.json
  std::vector<difftx::token_t> prompt = tok->encode(text);
  if (!tok->adds_bos() && settings.bos_token_id) prompt.insert(prompt.begin(), *settings.bos_token_id);  // SentencePiece
  difftx::generation_options o{.max_new_tokens = 32,
                               .stop_tokens = settings.eos_token_ids,  // Llama-3: <|end_of_text|>, <|eot_id|>, ...
                               .sampling = settings.sampling(/*seed=*/1)};  // or {.temperature = 0.7, .top_p = 0.9}
  difftx::tokenizer::incremental_detokenizer stream(*tok, /*skip_special_tokens=*/true);
  std::cout << text;
  std::vector<difftx::token_t> tokens = difftx::generate(model, prompt, o, [&](difftx::token_t t) {
    std::cout << stream.push(t) << std::flush;  // each token's text once, whole characters only
  });
  std::cout << stream.finish() << "\n";  // tokens ends with an EOS id if it stopped there
  // [generate-snippet]
  std::cout << tokens.size() << " new tokens\n";
  return tokens.empty() ? 1 : 0;
} catch (const difftx::input_error& e) {
  std::cerr << e.what() << "\n";
  return 3;
}
