// The whole language-model loop by hand: build a LanguageModel of decoder
// layers (each with its layer index), initialise it, save it (the file
// records the architecture), load it back into a second model, run a prompt
// through the KV cache and decode greedily, then run two prompts of different
// lengths as one packed batch.
//
//   build/release/examples/language_model [file.safetensors]
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include <difftx/difftx.hpp>
#include <difftx/io/mapped_safetensors.hpp>
#include <difftx/io/parameters.hpp>
#include <difftx/io/safetensors.hpp>
#include <difftx/policy/simd.hpp>

using namespace difftx;
using Layer = DecoderLayer<float, 64, policy::simd>;  // 4 differential heads of 2 x 64 at C = 512
using Model = LanguageModel<Layer>;

// Layer i gets layer index i: lambda_init = 0.8 - 0.6 exp(-0.3 i) depends on it.
Model make_model() {
  std::vector<Layer> layers;
  for (index_t i = 0; i < 4; ++i)
    layers.emplace_back(DecoderLayerConfig{{.d_model = 512, .heads = 4, .kv_heads = 2, .layer_index = i}, 1408});
  return Model({.vocab_size = 1000, .d_model = 512}, std::move(layers));
}

// The largest logit of position n of batch row b.
token_t argmax(const Tensor<float, 3>& logits, index_t b, index_t n) {
  const float* row = logits.data() + (b * logits.extent(1) + n) * logits.extent(2);
  return static_cast<token_t>(std::max_element(row, row + logits.extent(2)) - row);
}

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "language_model.safetensors";

  // 1. Build and initialise (every parameter from one stream, so layers differ), then save.
  Model trained = make_model();
  random_stream rng(7);
  trained.reset_parameters(rng);
  io::tensor_file file;
  io::store_parameters(file, trained, io::dtype::bf16);  // weights as bfloat16, architecture in __metadata__
  io::write_safetensors(path, file);
  std::cout << "saved " << file.tensors.size() << " tensors; layer 3's index in the file: "
            << file.metadata.at("layers.3.attn.layer_index") << "\n";

  // 2. Load into a model built the same way (a model built otherwise is refused, naming the key).
  Model model = make_model();
  io::load_parameters(model, io::mapped_safetensors(path));

  // 3. A prompt in one prefill, then greedy decoding one token at a time.
  const std::vector<token_t> prompt{1, 17, 256, 42, 9};
  Tensor<token_t, 2> tokens({1, static_cast<index_t>(prompt.size())});
  std::copy(prompt.begin(), prompt.end(), tokens.data());
  auto cache = model.make_cache(/*batch*/ 1, /*capacity*/ 64);
  Tensor<float, 3> logits(model.output_shape(tokens.shape()));
  model.prefill(tokens, cache, logits);
  std::vector<token_t> generated{argmax(logits, 0, tokens.extent(1) - 1)};
  while (generated.size() < 8) {
    Tensor<token_t, 2> next({1, 1});
    next(0, 0) = generated.back();
    Tensor<float, 3> step(model.output_shape(next.shape()));
    model.decode(next, cache, step);
    generated.push_back(argmax(step, 0, 0));
  }
  std::cout << "greedy:";
  for (const auto t : generated) std::cout << " " << t;
  std::cout << "\n";

  // 4. Two prompts of 5 and 3 tokens as one packed batch: each attends only to itself.
  const std::vector<index_t> cu_seqlens{0, 5, 8};
  Tensor<token_t, 2> packed({1, 8});
  const token_t ids[] = {1, 17, 256, 42, 9, 1, 500, 3};
  std::copy(std::begin(ids), std::end(ids), packed.data());
  Tensor<float, 3> packed_logits(model.output_shape(packed.shape()));
  model.forward(packed, packed_logits, cu_seqlens);
  std::cout << "packed: next after prompt 1 " << argmax(packed_logits, 0, 4) << " (as greedy above: "
            << generated.front() << "), after prompt 2 " << argmax(packed_logits, 0, 7) << "\n";
  return argmax(packed_logits, 0, 4) == generated.front() ? 0 : 1;
}
