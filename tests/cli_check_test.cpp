// difftx check: every module on every policy built and every number type passes.
#include <doctest/doctest.h>

#include <string>

#include "support/cli_fixtures.hpp"

using namespace cli_fixtures;  // difftx, the fixtures, test_support's tool runners

TEST_CASE("cli: check passes on every policy built") {
  const auto r = difftx_cli("check");
  INFO(r.out << r.err);
  CHECK(r.code == 0);
  for (const char* module : {"rmsnorm", "swiglu", "multihead", "attention", "decoder_layer", "decoder_stack",
                             "multihead_v2 ", "multihead_v2 baseline", "decoder_layer_v2"})
    CHECK(r.out.find("| " + std::string(module)) != std::string::npos);
  CHECK(r.out.find("checks pass") != std::string::npos);
  CHECK(r.out.find("FAIL") == std::string::npos);
}
