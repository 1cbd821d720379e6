// The difftx tool's top level, shared by main.cpp and the fuzz target
// fuzz/fuzz_run.cpp (which calls `difftx run` in-process): parse the command
// line with the commands registered on app and map what the command throws to
// the exit code, printing one line for every failure:
//   0 ok; 1 a command's own failure (check) or an internal error; 2 usage error;
//   3 bad input (input_error) or more memory than can be allocated.
#pragma once

#include <CLI/CLI.hpp>

namespace difftx::cli {

// Parses argv (argv[0] the program) with app and runs the command it names;
// returns the exit code. Messages go to std::cerr (--help to std::cout).
int run_app(CLI::App& app, int argc, const char* const* argv);

}  // namespace difftx::cli
