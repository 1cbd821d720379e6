// The retrieval demo's differential model (tools/difftx/retrieval/) trained
// data-parallel over MPI: every rank holds the whole model, trains on its
// share of each batch and averages gradients before clipping and AdamW, so
// the replicas stay equal and p ranks train like one process on the whole batch.
//
//   mpirun -np 2 build/release/examples/data_parallel_retrieval [steps] [batch]
//
// Rank 0 prints the loss (the mean over the ranks of each share's mean) and
// finally the model's retrieval accuracy, greedy decoding with the KV cache.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include <difftx/difftx.hpp>
#include <difftx/parallel/data_parallel.hpp>
#include <difftx/parallel/mpi.hpp>
#include <difftx/policy/simd.hpp>

#include "retrieval/experiment.hpp"

using namespace difftx;

int run(int argc, char** argv) {
  parallel::mpi_communicator comm;
  retrieval::task_config task;
  retrieval::model_config model{.d_model = 32, .heads = 2, .layers = 2, .ffn_dim = 64};
  retrieval::train_config train;
  train.steps = argc > 1 ? std::atol(argv[1]) : 400;
  train.batch = argc > 2 ? std::atol(argv[2]) : 16;
  train.warmup = std::min<index_t>(train.warmup, train.steps / 4);
  train.rank = comm.rank();
  train.ranks = comm.size();

  // The head size D = C / 2h (8 here) at run time, as the tool's retrieval command has it.
  retrieval::trainer<DecoderLayer<float, dynamic, policy::simd>> trainer(
      retrieval::make_diff_model(model, retrieval::vocabulary(task).size, policy::simd{}), task, train);
  // Collective: every rank's replica must have the same parameters (input_error otherwise).
  parallel::GradientAverager<float, parallel::mpi_communicator> average(trainer.model().parameters(), comm);

  Tensor<double, 1> loss({1});
  const auto start = std::chrono::steady_clock::now();
  trainer.train(
      [&](const retrieval::step_record& r) {
        loss.data()[0] = r.loss / comm.size();
        comm.all_reduce_sum(loss.view());
        if (comm.rank() == 0 && (r.step % 50 == 0 || r.step == train.steps))
          std::printf("step %5td  loss %.4f  grad norm %.3f  %.1f s\n", r.step, loss.data()[0], r.grad_norm, r.seconds);
      },
      [&] { average.average(); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  if (comm.rank() == 0) {
    index_t correct = 0, total = 0;
    for (const auto& cell : trainer.evaluate({.per_cell = 8, .stats_batch = 8}).cells) {
      correct += cell.correct;
      total += cell.total;
    }
    std::printf("%d ranks x %td sequences per step: %td steps in %.1f s; retrieval accuracy %.3f (%td of %td answers)\n",
                comm.size(), train.batch / comm.size(), train.steps, seconds,
                static_cast<double>(correct) / static_cast<double>(total), correct, total);
  }
  comm.barrier();
  return 0;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 1;
  try {
    status = run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "data_parallel_retrieval: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  MPI_Finalize();
  return status;
}
