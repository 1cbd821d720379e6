// docs/guide/modules.md's code: weights to and from a safetensors file (one
// layer of a bigger checkpoint, by prefix), differential attention V2, and
// the run-time head size. CTest runs it in a scratch folder.
#include <iostream>

#include <difftx/difftx.hpp>
#include <difftx/io/mapped_safetensors.hpp>  // CMake target difftx::io; POSIX mmap
#include <difftx/io/parameters.hpp>
#include <difftx/io/safetensors.hpp>
#include <difftx/policy/simd.hpp>

using namespace difftx;

int main() {
  {  // a file holding layer 3 of a model, as a checkpoint would
    DecoderLayer<float, 16> saved_layer({.attention = {.d_model = 96, .heads = 3, .kv_heads = 1, .layer_index = 3},
                                         .ffn_dim = 256});
    io::tensor_file out;
    io::store_parameters(out, saved_layer, io::dtype::bf16, "layers.3.");
    io::write_safetensors("model.safetensors", out);
  }
  // [load-snippet]
  // Layer 3 of a model with C = 96, 3 differential heads of 2 x 16, 1 key/value group, SwiGLU width 256.
  DecoderLayer<float, 16> layer({.attention = {.d_model = 96, .heads = 3, .kv_heads = 1, .layer_index = 3},
                                 .ffn_dim = 256});
  io::mapped_safetensors file("model.safetensors");  // maps it and checks the header; no tensor is read yet
  io::load_parameters(layer, file, "layers.3.");     // layers.3.attn_norm.weight, layers.3.attn.q_proj.weight, ...
  for (const auto& [name, t] : file.tensors())       // what the file holds: every dtype of the format
    std::cout << name << " " << t.dtype_name << " " << shape_string(t.shape) << "\n";
  // [load-snippet]

  // [v2-snippet]
  MultiHeadV2<float, 16, policy::simd> v2({.d_model = 96, .heads = 6, .kv_heads = 6});  // 12 query heads of 16
  DecoderLayerV2<float, 16, policy::simd> v2_layer({{.d_model = 96, .heads = 6, .kv_heads = 2}});
  MultiHeadV2<float, 16, policy::simd> v2_baseline({.d_model = 96, .heads = 6, .differential = false});
  // [v2-snippet]

  // [dynamic-snippet]
  MultiHead<float, dynamic, policy::simd> mh({.d_model = 240, .heads = 3, .head_dim = 40});  // D from the config
  std::cout << "D = " << mh.head_dim() << "\n";
  // [dynamic-snippet]

  Tensor<float, 3> x({1, 7, 96}), y(x.shape());
  random_stream rng(1);
  fill_normal(x.view(), rng);
  v2.forward(x, y);
  v2_layer.forward(x, y);
  v2_baseline.forward(x, y);
  layer.forward(x, y);
  return 0;
}
