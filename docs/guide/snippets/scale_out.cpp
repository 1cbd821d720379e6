// docs/guide/scale-out.md's code: a DecoderLayer split over MPI ranks
// (tensor parallelism: each rank its heads and hidden units, loaded from and
// saved to one whole checkpoint), and a data-parallel step's gradient average.
// Runs on any number of ranks that divides 6; CTest runs it as one process.
//
//   mpirun -np 2 build/release/examples/snippet_scale_out
#include <mpi.h>

#include <iostream>

#include <difftx/difftx.hpp>
#include <difftx/io/mapped_safetensors.hpp>
#include <difftx/io/safetensors.hpp>
#include <difftx/parallel/checkpoint.hpp>  // saving, with difftx::io
#include <difftx/parallel/data_parallel.hpp>
#include <difftx/parallel/mpi.hpp>
#include <difftx/parallel/tensor_parallel.hpp>
#include <difftx/policy/simd.hpp>

using namespace difftx;

int run() {
  parallel::mpi_communicator comm;  // every rank
  const DecoderLayerConfig config{{.d_model = 96, .heads = 6}};
  if (comm.rank() == 0) {  // a whole checkpoint to start from
    DecoderLayer<float, 8> whole(config);
    io::tensor_file out;
    io::store_parameters(out, whole, io::dtype::f32);
    io::write_safetensors("model.safetensors", out);
  }
  comm.barrier();
  Tensor<float, 3> x({2, 16, 96}), y(x.shape()), dy(x.shape()), dx(x.shape());  // the same on every rank
  // [tensor-parallel-snippet]
  using Layer = parallel::TensorParallelDecoderLayer<parallel::mpi_communicator, float, 8, policy::simd>;
  Layer layer(config, comm);                                       // 2 ranks: rank r holds heads [3r, 3r + 3)
  io::load_parameters(layer, io::mapped_safetensors("model.safetensors"));   // each rank its part
  Layer::saved_type saved;
  layer.forward(x, y, saved);                                      // y whole on every rank
  layer.backward(x, dy, saved, dx);
  io::tensor_file file;
  io::store_parameters(file, layer, io::dtype::bf16, comm);        // collective: the whole tensors
  if (comm.rank() == 0) io::write_safetensors("trained.safetensors", file);
  // [tensor-parallel-snippet]

  DecoderLayer<float, 8, policy::simd> model(config);  // a replica: the same on every rank
  Tensor<float, 3> x_mine({1, 16, 96}), out(x_mine.shape()), dout_mine(x_mine.shape()), dx_mine(x_mine.shape());
  decltype(model)::saved_type model_saved;
  AdamW<float> optimiser(model.parameters(), {});
  // [data-parallel-snippet]
  parallel::GradientAverager<float, parallel::mpi_communicator> average(model.parameters(), comm);
  // each step, on this rank's B/p sequences with the loss's mean over them:
  zero_grad(model);
  model.forward(x_mine, out, model_saved);
  model.backward(x_mine, dout_mine, model_saved, dx_mine);
  average.average();                                               // every gradient: its mean over the ranks
  clip_grad_norm(model.parameters(), 1.0);                         // the same on every rank
  optimiser.step();
  // [data-parallel-snippet]
  if (comm.rank() == 0) std::cout << comm.size() << " ranks: " << file.tensors.size() << " tensors saved\n";
  return 0;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 1;
  try {
    rc = run();
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
  }
  MPI_Finalize();
  return rc;
}
