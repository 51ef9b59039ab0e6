// Bad input through the command line as a user gives it: every answer names
// the file, key or argument and what is allowed, carries no raw library or OS
// exception text, exits with a documented code, and leaves nothing behind.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "qattn/checkpoint.hpp"
#include "run_helpers.hpp"

using namespace qattn::test;
using nlohmann::json;

namespace {

// A tiny corpus and config in d: d/cfg.json trains 4 steps into d/runs/tiny.
fs::path tiny_setup(const fs::path& d) {
  make_corpus(d);
  return write_json(d / "cfg.json", tiny_config(d, "tiny", 4));
}

void check_clean(const Outcome& r) {
  INFO(r.output);
  CHECK(raw_library_text(r.output).empty());
}

}  // namespace

TEST_CASE("export to an existing folder or a missing one fails with the reason and leaves no temporary",
          "[cli][errors]") {
  const auto d = scratch_dir("cli_export");
  const auto cfg = tiny_setup(d);
  REQUIRE(exit_code(run_qattn({"train", cfg.string()}, {}, d / "train.log")) == 0);
  const std::string run = (d / "runs" / "tiny").string();
  fs::create_directories(d / "out" / "taken");
  const auto before = listing(d / "out");

  auto r = qattn_outcome({"export", "--checkpoint", run, "--out", (d / "out" / "taken").string()}, d / "log");
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Catch::Contains("taken: is a directory"));
  check_clean(r);
  CHECK(listing(d / "out") == before);

  r = qattn_outcome({"export", "--checkpoint", run, "--out", (d / "out" / "no" / "m.bin").string()}, d / "log");
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Catch::Contains("m.bin: cannot create a file in") &&
                           Catch::Contains("No such file or directory"));
  check_clean(r);
  CHECK(listing(d / "out") == before);
}

TEST_CASE("a directory as config, 1e400 and duplicate keys are refused naming the file and key", "[cli][errors]") {
  const auto d = scratch_dir("cli_config");
  const auto cfg = tiny_setup(d);

  auto r = qattn_outcome({"validate", d.string()}, d / "log");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains(d.string() + ": is a directory"));
  check_clean(r);

  r = qattn_outcome({"validate", cfg.string(), "--set", "train.lr=1e400"}, d / "log");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains("--set train.lr=1e400: 1e400 is out of range"));
  check_clean(r);

  std::string text = read_text(cfg);
  const auto lr = text.find("\"lr\": 0.01");
  REQUIRE(lr != std::string::npos);
  std::ofstream(d / "big.json") << text.substr(0, lr) + "\"lr\": 1e400" + text.substr(lr + 10);
  r = qattn_outcome({"validate", (d / "big.json").string()}, d / "log");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains("big.json: train.lr: 1e400 is out of range"));
  check_clean(r);

  // The library keeps the last of two equal keys; qattn refuses both, naming the key.
  std::ofstream(d / "twice.json") << text.substr(0, lr) + "\"lr\": 0.5, " + text.substr(lr);
  r = qattn_outcome({"validate", (d / "twice.json").string()}, d / "log");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains("twice.json: train.lr: given twice"));
  check_clean(r);
  std::ofstream(d / "sweep.json") << R"({"name": "s", "base": "cfg.json", "name": "t"})";
  r = qattn_outcome({"sweep", (d / "sweep.json").string(), "--dry-run"}, d / "log");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains("sweep.json: name: given twice"));
}
