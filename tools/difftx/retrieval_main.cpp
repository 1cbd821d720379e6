// Temporary stand-alone main for `difftx retrieval` while the shared tool
// (tools/difftx/main.cpp with commands.hpp) lands: it registers only the
// retrieval command and maps errors to the tool's exit codes (2 usage, 3 bad
// input, 1 anything else). Replace by the shared main when merging.
#include <exception>
#include <iostream>

#include <CLI/CLI.hpp>

#include <difftx/core/error.hpp>

namespace difftx::cli {
void add_retrieval_command(CLI::App& app);  // cmd_retrieval.cpp
}

int main(int argc, char** argv) {
  CLI::App app{"difftx: Differential Transformer layers (retrieval demo only in this build)", "difftx"};
  app.require_subcommand(1);
  difftx::cli::add_retrieval_command(app);
  try {
    app.parse(argc, argv);
    return 0;
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "difftx retrieval: " << e.what() << " (see difftx retrieval --help)\n";
    return 2;
  } catch (const difftx::input_error& e) {
    std::cerr << "difftx retrieval: " << e.what() << "\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "difftx retrieval: internal error: " << e.what() << "\n";
    return 1;
  }
}
