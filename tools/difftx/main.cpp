// difftx: Differential Transformer layers on the command line. This file only
// registers the subcommands and maps errors to exit codes:
//   0 ok, 1 a command's own failure (check), 2 usage error, 3 bad input.
#include <exception>
#include <iostream>
#include <string>

#include <difftx/core/error.hpp>

#include "commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"difftx: Differential Transformer layers (modules, weights, checks, timings, a training demo)", "difftx"};
  app.require_subcommand(1);
  app.footer(difftx::cli::exit_codes_help);
  difftx::cli::add_run_command(app);
  difftx::cli::add_check_command(app);
  difftx::cli::add_bench_command(app);
  difftx::cli::add_retrieval_command(app);

  auto command = [&app] {  // "difftx run", for the messages
    std::string name = "difftx";
    for (const auto* sub : app.get_subcommands()) name += " " + sub->get_name();
    return name;
  };
  try {
    app.parse(argc, argv);
    return 0;
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::RuntimeError& e) {  // the command printed why
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    // CLI11 reports a mistyped command as a missing one; name it instead.
    std::string message = e.what();
    const auto extras = app.remaining();
    if (app.get_subcommands().empty() && !extras.empty() && extras.front().rfind('-', 0) != 0) {
      message = "unknown command '" + extras.front() + "' (commands:";
      for (const auto* sub : app.get_subcommands([](const CLI::App*) { return true; })) message += " " + sub->get_name();
      message += ")";
    }
    std::cerr << command() << ": " << message << " (see " << command() << " --help)\n";
    return 2;
  } catch (const difftx::input_error& e) {  // "difftx::<where>: argument '<file: tensor>': expected ..., got ..."
    std::cerr << e.what() << "\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << command() << ": internal error: " << e.what() << "\n";
    return 1;
  }
}
