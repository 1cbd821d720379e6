// run_app: the exception-to-exit-code mapping of the difftx tool (app.hpp).
#include "app.hpp"

#include <exception>
#include <iostream>
#include <new>
#include <string>

#include <difftx/core/error.hpp>

namespace difftx::cli {

int run_app(CLI::App& app, int argc, const char* const* argv) {
  auto command = [&app] {  // "difftx run", for the messages
    std::string name = app.get_name();
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
  } catch (const std::bad_alloc&) {  // a shape the file allows but this machine cannot hold
    std::cerr << command() << ": needs more memory than can be allocated\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << command() << ": internal error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace difftx::cli
