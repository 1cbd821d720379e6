// docs/guide/inference.md's code: a layer's KV cache (prefill, then decode),
// packed batches of different lengths, and low-bit inference (int8 weights,
// an int8 cache, quantized attention logits, int8 Q·Kᵀ). CTest runs it.
#include <iostream>
#include <vector>

#include <difftx/difftx.hpp>
#include <difftx/policy/simd.hpp>

using namespace difftx;

int main() {
  // [cache-snippet]
  DecoderLayer<float, 16, policy::simd> layer({{.d_model = 96, .heads = 3}});
  auto cache = layer.make_cache(/*batch*/ 2, /*capacity*/ 512);  // keys (after RoPE) and values, per sequence
  Tensor<float, 3> prompt({2, 100, 96}), y_prompt(prompt.shape());
  layer.prefill(prompt, cache, y_prompt);                        // the cache restarts with 100 tokens per sequence
  Tensor<float, 3> token({2, 1, 96}), y_token(token.shape());
  layer.decode(token, cache, y_token);                           // token 100 of each sequence, attending to 0..100
  std::cout << cache.length(0) << " of " << cache.capacity() << " tokens, " << cache.bytes_per_token() << " bytes each\n";
  // [cache-snippet]

  // [packed-snippet]
  std::vector<index_t> cu_seqlens{0, 37, 100, 101};              // 3 sequences: 37, 63 and 1 tokens
  Tensor<float, 3> packed({1, 101, 96}), y_packed(packed.shape()), dy(packed.shape()), dx(packed.shape());
  decltype(layer)::saved_type saved;
  layer.forward(packed, y_packed, saved, cu_seqlens);            // training: each sequence attends within itself,
  layer.backward(packed, dy, saved, dx);                         // positions from 0; no padding computed
  auto cache3 = layer.make_cache(3, 512);
  layer.prefill(packed, cache3, y_packed, cu_seqlens);           // three prompts of different lengths
  Tensor<float, 3> next({3, 1, 96}), y_next(next.shape());
  layer.decode(next, cache3, y_next);                            // then all three together
  layer.forward(packed, y_packed, cu_seqlens);                   // no `saved`: inference that keeps no state
  // [packed-snippet]

  // [low-bit-snippet]
  std::vector<DecoderLayer<float, 16, policy::simd>> layers;
  for (index_t i = 0; i < 2; ++i) layers.emplace_back(DecoderLayerConfig{{.d_model = 96, .heads = 3, .layer_index = i}});
  LanguageModel<DecoderLayer<float, 16, policy::simd>> lm({.vocab_size = 500, .d_model = 96}, std::move(layers));
  quantize(lm);                                                  // every projection and the head: int8
  auto cache8 = lm.make_cache(1, 256, inference_dtype::int8);    // keys and values as int8
  Tensor<token_t, 2> ids({1, 5});
  Tensor<float, 3> logits(lm.output_shape(ids.shape()));
  lm.prefill(ids, cache8, logits);                               // then lm.decode(next_id, cache8, step) as before
  DecoderLayer<float, 16, policy::simd> q6({{.d_model = 96, .heads = 3, .logit_bits = 6}});        // logits to 6 bits
  MultiHead<float, 16, policy::simd> fast({.d_model = 96, .heads = 3, .qk_dtype = inference_dtype::int8});  // int8 Q·Kᵀ
  // [low-bit-snippet]
  q6.forward(prompt, y_prompt);
  Tensor<float, 3> y_fast(prompt.shape());
  fast.forward(prompt, y_fast);
  std::cout << "int8 cache of layer 0: " << cache8[0].bytes() << " bytes\n";
  return 0;
}
