// difftx retrieval --arch: V2 beside DIFF and the Transformer on the same data,
// in one report; the order of the list does not matter, its contents do.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/cli_fixtures.hpp"

using namespace cli_fixtures;  // difftx, the fixtures, test_support's tool runners

TEST_CASE("cli: retrieval --arch diff,v2,baseline trains and reports three models, the same with one or two jobs") {
  test_support::temp_folder folder;
  const std::string tiny = "retrieval --steps 3 --batch 2 --eval-per-cell 1 --d-model 16 --heads 1 --ffn 16 --context 40 --quiet";
  auto r = difftx_cli(tiny + " --arch baseline,v2,diff --jobs 1 --out " + q(folder / "one"));
  INFO("stdout: " << r.out << "stderr: " << r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("of 12 checks agree") != std::string::npos);
  CHECK(r.out.find("DIFF and DIFF V2 against each other") != std::string::npos);
  r = difftx_cli(tiny + " --arch diff,v2,baseline --jobs 2 --out " + q(folder / "two"));
  REQUIRE(r.code == 0);
  for (const char* file : {"training.csv", "accuracy_by_cell.csv", "by_depth.csv", "attention_profile.csv"}) {
    INFO(file);
    CHECK(read_text(folder / "one" / file) == read_text(folder / "two" / file));
  }
  const auto j = nlohmann::json::parse(read_text(folder / "one" / "report.json"));
  for (const char* model : {"diff", "v2", "baseline"}) {
    INFO(model);
    REQUIRE(j.contains(model));
    for (const char* field : {"accuracy", "attention_to_answer", "attention_noise", "attention_logits", "hidden_states"})
      CHECK(j.at(model).contains(field));
  }
  // V2 against the Transformer it is matched to (2 output heads of 8, 2 key/value heads): 4 query heads, so per
  // layer a q_proj larger by C x C = 256 and a lambda_proj [2, 16] = 32; 2 layers.
  CHECK(j.at("v2").at("parameters").get<index_t>() - j.at("baseline").at("parameters").get<index_t>() == 2 * (256 + 32));
  CHECK(j.at("v2").at("lambda").size() == 2);
  CHECK(j.at("setup").at("architectures") == std::vector<std::string>{"diff", "v2", "baseline"});
  const auto md = read_text(folder / "one" / "report.md");
  CHECK(md.find("| DIFF V2 |") != std::string::npos);
  CHECK(md.find("| " + std::to_string(j.at("v2").at("parameters").get<index_t>()) + " |") != std::string::npos);

  // Two models, either differential one with the baseline; the default stays DIFF and the Transformer.
  r = difftx_cli(tiny + " --arch v2,baseline --out " + q(folder / "v2"));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("of 6 checks agree") != std::string::npos);
  const auto k = nlohmann::json::parse(read_text(folder / "v2" / "report.json"));
  CHECK(k.contains("v2"));
  CHECK_FALSE(k.contains("diff"));
  expect_usage_error(tiny + " --arch diff,v2 --out " + q(folder / "x"), {"--arch", "needs baseline"});
  expect_usage_error(tiny + " --arch baseline --out " + q(folder / "x"), {"--arch", "needs baseline and at least one"});
  expect_usage_error(tiny + " --arch diff,diff,baseline --out " + q(folder / "x"), {"--arch", "diff twice"});
  expect_usage_error(tiny + " --arch diff,v3,baseline --out " + q(folder / "x"), {"--arch", "v3"});
}
