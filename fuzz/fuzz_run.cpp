// libFuzzer target: `difftx run` in-process, on a command line and files that
// both come from the fuzz input, so the fuzzer mutates the arguments and the
// weights, input and dY files together.
//
// Input format (tools/make_fuzz_seeds.py writes seeds in it):
//
//   ARGUMENTS "\n%%\n" WEIGHTS "\n%%\n" INPUT "\n%%\n" GRAD_OUTPUT
//
// - The input splits at the first three separators "\n%%\n" into at most four
//   parts; the last part runs to the end of the input. A part that is missing
//   (fewer separators) is a file that does not exist.
// - ARGUMENTS is text split at whitespace and NUL bytes into at most 64 tokens,
//   which follow `difftx run` on the command line (so the fuzzer may drop,
//   repeat or misspell options).
// - WEIGHTS, INPUT and GRAD_OUTPUT are written, byte for byte, as the files
//   `w`, `x` and `dy` in this process's temporary folder ($TMPDIR or /tmp,
//   difftx_fuzz_run.XXXXXX), which is emptied before every input.
// - The value of every path option (--weights, --input, --output, --grad-output,
//   --grad-input, --grad-weights, --model, --tokens; as the next token or
//   after '=') becomes a
//   file in that folder: its characters other than [A-Za-z0-9._-] are dropped,
//   and "", "." and ".." name the folder itself. So "--weights w --input x
//   --output y --grad-output dy --grad-input dx --grad-weights dw" reads the
//   input's files and writes y, dx and dw next to them; nothing outside the
//   folder is read or written.
//
// Fine: exit codes 0 (ok), 2 (usage error) and 3 (bad input: input_error or
// more memory than can be allocated), as run_app maps them (tools/difftx/app.cpp).
// A finding: exit code 1 ("internal error": an unexpected exception), any other
// code, an exception run_app does not catch, a sanitizer report, or exit code 0
// (not from --help) with an output (--output, and with --grad-output: --grad-input, --grad-weights)
// that does not read back or holds a NaN or an infinity (the tool promises exit
// code 3 for a non-finite result). The target then prints the command line and
// what the command printed, and aborts.
//
// DIFFTX_FUZZ_VERBOSE=1 prints, for every input, the command line, the exit
// code and what the command printed, and keeps the temporary folder at exit
// (with the last input's files), to replay an input with the real tool:
//   DIFFTX_FUZZ_VERBOSE=1 build/fuzz/fuzz/fuzz_run crash-...
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include <difftx/io/npy.hpp>
#include <difftx/io/safetensors.hpp>

#include "app.hpp"
#include "commands.hpp"
#include "fuzz_checks.hpp"

namespace fs = std::filesystem;

namespace {

constexpr std::string_view separator = "\n%%\n";
constexpr std::size_t max_tokens = 64;
const char* const file_names[] = {"w", "x", "dy"};  // parts 1, 2, 3

// The options of `difftx run` whose value is a file path (cmd_run.cpp), and
// those that take other text. An option of type TEXT in neither list stops the
// target at start-up, so a new path option cannot escape the folder unnoticed.
const std::set<std::string> path_options{"--weights",     "--input",      "--output",       "--grad-output",
                                         "--grad-input", "--grad-weights", "--model", "--tokens"};
const std::set<std::string> text_options{"--module",       "--dtype",  "--policy",
                                         "--bf16-product", "--matmul", "--cuda-attention"};

bool verbose() {
  static const bool on = [] {
    const char* v = std::getenv("DIFFTX_FUZZ_VERBOSE");
    return v != nullptr && *v != '\0' && std::string_view(v) != "0";
  }();
  return on;
}

// The per-process temporary folder; removed at exit unless verbose.
struct temporary_folder {
  fs::path path;
  temporary_folder() {
    std::string pattern = (fs::temp_directory_path() / "difftx_fuzz_run.XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror("fuzz_run: mkdtemp");
      std::abort();
    }
    path = pattern;
  }
  ~temporary_folder() {
    std::error_code ec;
    if (verbose())
      std::cerr << "fuzz_run: kept " << path.string() << "\n";
    else
      fs::remove_all(path, ec);
  }
  void clear() const {
    for (const auto& entry : fs::directory_iterator(path)) fs::remove_all(entry.path());
  }
};

const temporary_folder& folder() {
  static const temporary_folder f;
  return f;
}

// The app as main.cpp builds it, with only the run command.
std::unique_ptr<CLI::App> make_app() {
  auto app = std::make_unique<CLI::App>("difftx (fuzz_run: only the run command)", "difftx");
  app->require_subcommand(1);
  app->footer(difftx::cli::exit_codes_help);
  difftx::cli::add_run_command(*app);
  return app;
}

// Stops the target if `run` grew a text option that this file does not know.
void check_option_lists() {
  auto app = make_app();
  const auto* run = app->get_subcommand("run");
  for (const auto* option : run->get_options()) {
    for (const auto& name : option->get_lnames()) {
      const std::string flag = "--" + name;
      if (path_options.count(flag) != 0 || text_options.count(flag) != 0) continue;
      if (option->get_type_name().rfind("TEXT", 0) == 0) {
        std::cerr << "fuzz_run: `difftx run` has a text option " << flag
                  << " this target does not know: add it to path_options or text_options in fuzz/fuzz_run.cpp\n";
        std::abort();
      }
    }
  }
}

// Whether CLI11 would read token as an option rather than as the previous
// option's value (CLI11's split_long / split_short; "-<digit>" is a value).
bool option_like(std::string_view token) {
  auto first_char = [](char c) { return c != '-' && c != '!' && c != ' ' && c != '\n'; };
  if (token == "--") return true;
  if (token.size() > 2 && token.substr(0, 2) == "--" && first_char(token[2])) return true;
  return token.size() > 1 && token[0] == '-' && first_char(token[1]) && !(token[1] >= '0' && token[1] <= '9');
}

// A path value as a file in the folder (see the format above).
std::string in_folder(std::string_view value) {
  std::string name;
  for (char c : value)
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-')
      name += c;
  if (name.empty() || name == "." || name == "..") return folder().path.string() + "/";
  return (folder().path / name).string();
}

struct parsed_arguments {
  std::vector<std::string> tokens;
  std::map<std::string, std::string> paths;  // path option -> the file in the folder, as last given
};

parsed_arguments command_line(std::string_view text) {
  parsed_arguments a;
  auto& tokens = a.tokens;
  std::string current;
  auto flush = [&] {
    if (!current.empty() && tokens.size() < max_tokens) tokens.push_back(current);
    current.clear();
  };
  for (char c : text) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' || c == '\0')
      flush();
    else
      current += c;
  }
  flush();
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    auto& t = tokens[i];
    if (const auto eq = t.find('='); eq != std::string::npos && path_options.count(t.substr(0, eq)) != 0) {
      const std::string option = t.substr(0, eq), path = in_folder(std::string_view(t).substr(eq + 1));
      t = option + "=" + path;
      a.paths[option] = path;
    } else if (path_options.count(t) != 0 && i + 1 < tokens.size() && !option_like(tokens[i + 1])) {
      tokens[i + 1] = in_folder(tokens[i + 1]);
      a.paths[t] = tokens[i + 1];
      ++i;
    }
  }
  return a;
}

// After exit code 0: every output the command wrote reads back and is finite
// (a non-finite result is bad input, exit code 3, not a success).
std::string output_problem(const parsed_arguments& a) {
  using difftx::fuzz::all_finite;
  const bool backward = a.paths.count("--grad-output") != 0;
  try {
    if (const auto it = a.paths.find("--output"); it != a.paths.end() && !all_finite(difftx::io::read_npy(it->second)))
      return "--output holds a NaN or an infinity";
    if (const auto it = a.paths.find("--grad-input"); backward && it != a.paths.end() &&
                                                      !all_finite(difftx::io::read_npy(it->second)))
      return "--grad-input holds a NaN or an infinity";
    if (const auto it = a.paths.find("--grad-weights"); backward && it != a.paths.end())
      for (const auto& [name, t] : difftx::io::read_safetensors(it->second).tensors)
        if (!all_finite(t)) return "--grad-weights holds a NaN or an infinity in " + name;
  } catch (const difftx::input_error& e) {
    return std::string("an output does not read back: ") + e.what();
  }
  return "";
}

void write_file(const fs::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::cerr << "fuzz_run: cannot write " << path << "\n";
    std::abort();
  }
}

// Restores std::cout and std::cerr when the call ends, however it ends.
struct captured_output {
  std::ostringstream text;
  std::streambuf* out = std::cout.rdbuf(text.rdbuf());
  std::streambuf* err = std::cerr.rdbuf(text.rdbuf());
  ~captured_output() {
    std::cout.rdbuf(out);
    std::cerr.rdbuf(err);
  }
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  check_option_lists();
  (void)folder();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts;
  std::size_t begin = 0;
  while (parts.size() < 3) {
    const auto end = input.find(separator, begin);
    if (end == std::string_view::npos) break;
    parts.push_back(input.substr(begin, end - begin));
    begin = end + separator.size();
  }
  parts.push_back(input.substr(std::min(begin, input.size())));

  folder().clear();
  for (std::size_t i = 1; i < parts.size(); ++i) write_file(folder().path / file_names[i - 1], parts[i]);

  const auto arguments = command_line(parts[0]);
  std::vector<std::string> args{"difftx", "run"};
  args.insert(args.end(), arguments.tokens.begin(), arguments.tokens.end());
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  std::string shown;
  for (const auto& a : args) shown += (shown.empty() ? "" : " ") + a;

  int code = 0;
  std::string printed;
  const auto app = make_app();
  {
    captured_output capture;
    code = difftx::cli::run_app(*app, static_cast<int>(argv.size()), argv.data());
    printed = capture.text.str();
  }
  // -h or --help anywhere (CLI11 also reads "-hx" as -h): exit code 0 without running.
  const bool help = app->get_help_ptr()->count() > 0 || app->get_subcommand("run")->get_help_ptr()->count() > 0;
  if (printed.empty() || printed.back() != '\n') printed += printed.empty() ? "(nothing)\n" : "\n";
  if (verbose()) std::cerr << "fuzz_run: " << shown << "\n  exit " << code << ", printed: " << printed;
  if (code != 0 && code != 2 && code != 3) {
    std::cerr << "fuzz_run: finding: exit code " << code << " from\n  " << shown << "\n  which printed: " << printed;
    std::abort();
  }
  if (code == 0 && !help) {
    if (const auto problem = output_problem(arguments); !problem.empty()) {
      std::cerr << "fuzz_run: finding: exit code 0, but " << problem << ", from\n  " << shown << "\n";
      std::abort();
    }
  }
  return 0;
}
