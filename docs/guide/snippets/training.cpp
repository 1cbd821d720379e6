// docs/guide/training.md's code: a language model trained on next-token
// prediction with the hand-derived backward, softmax cross-entropy, gradient
// clipping and AdamW. CTest runs it: the loss must fall on a repeated sequence.
#include <cstdio>
#include <vector>

#include <difftx/difftx.hpp>
#include <difftx/policy/simd.hpp>

using namespace difftx;

int main() {
  using Layer = DecoderLayer<float, 8, policy::simd>;
  std::vector<Layer> layers;
  for (index_t i = 0; i < 2; ++i) layers.emplace_back(DecoderLayerConfig{{.d_model = 32, .heads = 2, .layer_index = i}, 64});
  LanguageModel<Layer> model({.vocab_size = 64, .d_model = 32}, std::move(layers));
  Tensor<token_t, 2> tokens({4, 16}), targets({4, 16});  // targets: the next token; -1 is not scored
  for (index_t b = 0; b < 4; ++b)
    for (index_t n = 0; n < 16; ++n) {
      tokens(b, n) = static_cast<token_t>((3 * n + b) % 64);
      targets(b, n) = n + 1 < 16 ? static_cast<token_t>((3 * (n + 1) + b) % 64) : -1;
    }
  double first = 0, last = 0;
  // [train-snippet]
  CrossEntropyLoss<float, policy::simd> loss;
  AdamW<float> optimiser(model.parameters(), {.lr = {.peak = 1e-2, .warmup_steps = 10, .total_steps = 100},
                                              .beta2 = 0.98, .weight_decay = 0.01});
  Tensor<float, 3> logits(model.output_shape(tokens.shape())), dlogits(logits.shape());
  decltype(model)::saved_type saved;
  decltype(loss)::saved_type loss_saved;
  for (index_t step = 0; step < 100; ++step) {
    zero_grad(model);
    model.forward(tokens, logits, saved);
    const double l = loss.forward(logits, targets, loss_saved);  // the mean over the scored positions
    loss.backward(logits, targets, loss_saved, dlogits);
    model.backward(tokens, dlogits, saved);                      // gradients of every parameter
    clip_grad_norm(model.parameters(), 1.0);
    optimiser.step();
    if (step == 0) first = l;
    last = l;
  }
  // [train-snippet]
  std::printf("loss %.3f -> %.3f\n", first, last);
  return last < 0.5 * first ? 0 : 1;
}
