// Running the built difftx tool (DIFFTX_CLI, set by tests/CMakeLists.txt) as a
// user runs it, for the suites that test it: its exit code and both streams,
// and the checks every command's errors share (one line, naming the parts).
#pragma once

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>

#include <doctest/doctest.h>

#include "support/temp_folder.hpp"

namespace test_support {

struct outcome {
  int code;
  std::string out, err;
};

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs a shell command line, capturing both streams.
inline outcome shell_command(const std::string& line) {
  static const temp_folder logs;
  const auto out = logs / "stdout", err = logs / "stderr";
  const std::string command = "(" + line + ") >'" + out.string() + "' 2>'" + err.string() + "'";
  const int status = std::system(command.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(out), read_text(err)};
}

// Runs `difftx <args>`, capturing both streams.
inline outcome difftx_cli(const std::string& args) { return shell_command(std::string(DIFFTX_CLI) + " " + args); }

// The path quoted for the shell.
inline std::string q(const std::filesystem::path& path) { return std::string(1, '\'').append(path.string()).append(1, '\''); }

// The message is one line and contains every part.
inline void check_message(const std::string& err, std::initializer_list<std::string> parts) {
  INFO("stderr: " << err);
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  for (const auto& part : parts) CHECK(err.find(part) != std::string::npos);
}

inline void expect_usage_error(const std::string& args, std::initializer_list<std::string> parts) {
  INFO("difftx " << args);
  const auto r = difftx_cli(args);
  CHECK(r.code == 2);
  check_message(r.err, parts);
}

}  // namespace test_support
