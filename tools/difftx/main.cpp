// difftx: Differential Transformer layers on the command line. This file only
// registers the subcommands; run_app (app.cpp) parses the command line and
// maps errors to exit codes:
//   0 ok, 1 a command's own failure (check), 2 usage error, 3 bad input.
#include "app.hpp"
#include "commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"difftx: Differential Transformer layers (modules, weights, checks, timings, a training demo, generation, checkpoints, tokenizers)", "difftx"};
  app.require_subcommand(1);
  app.footer(difftx::cli::exit_codes_help);
  difftx::cli::add_run_command(app);
  difftx::cli::add_check_command(app);
  difftx::cli::add_bench_command(app);
  difftx::cli::add_retrieval_command(app);
  difftx::cli::add_generate_command(app);
  difftx::cli::add_convert_command(app);
  difftx::cli::add_tokenize_command(app);
  return difftx::cli::run_app(app, argc, argv);
}
