// The one exception type difftx throws for bad input.
//
// Every public entry (module forward/backward, ops, file I/O, gradcheck) checks
// its arguments before it writes anything, and on a mismatch throws input_error
// naming where it happened, which argument, what was expected and what came.
// Outputs, gradients and parameters are left exactly as they were.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace difftx {

class input_error : public std::invalid_argument {
 public:
  // where: the module or function ("MultiHead::forward", "read_safetensors");
  // argument: the argument or tensor name; expected / got: what was wanted and
  // what was found, in words or as shapes.
  input_error(std::string where, std::string argument, std::string expected, std::string got)
      : std::invalid_argument(format(where, argument, expected, got)),
        where_(std::move(where)),
        argument_(std::move(argument)),
        expected_(std::move(expected)),
        got_(std::move(got)) {}

  const std::string& where() const noexcept { return where_; }
  const std::string& argument() const noexcept { return argument_; }
  const std::string& expected() const noexcept { return expected_; }
  const std::string& got() const noexcept { return got_; }

 private:
  static std::string format(const std::string& where, const std::string& argument,
                            const std::string& expected, const std::string& got) {
    return "difftx::" + where + ": argument '" + argument + "': expected " + expected + ", got " + got;
  }
  std::string where_, argument_, expected_, got_;
};

}  // namespace difftx
