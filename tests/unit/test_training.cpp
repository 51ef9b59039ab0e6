// Training smoke: a tiny model on a generated shard lowers its loss, and the
// same seed twice gives identical loss columns.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "qattn/backend.hpp"
#include "qattn/data.hpp"
#include "qattn/trainer.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A repeating, learnable sequence: "abcab..." patterns with some variety.
fs::path make_corpus() {
  const fs::path d = fs::temp_directory_path() / ("qattn_train_" + std::to_string(::getpid()));
  fs::remove_all(d);  // a stale run of a reused pid would otherwise resume
  fs::create_directories(d);
  std::vector<uint16_t> t;
  for (int i = 0; t.size() < 20000; ++i)
    for (char c : std::string("the cat sat on the mat. ") + std::to_string(i % 7)) t.push_back(static_cast<uint8_t>(c));
  qattn::write_shard((d / "s_val_000000.bin").string(), t.data(), 4000);
  qattn::write_shard((d / "s_train_000001.bin").string(), t.data() + 4000, t.size() - 4000);
  return d;
}

std::vector<std::string> loss_columns(const fs::path& csv) {
  std::ifstream f(csv);
  std::string line;
  std::vector<std::string> out;
  std::getline(f, line);  // header
  while (std::getline(f, line)) {
    std::stringstream ss(line);
    std::string step, tokens, lr, train, val;
    std::getline(ss, step, ','), std::getline(ss, tokens, ','), std::getline(ss, lr, ',');
    std::getline(ss, train, ','), std::getline(ss, val, ',');
    out.push_back(train + "|" + val);
  }
  return out;
}

qattn::Config tiny_config(const fs::path& d, const std::string& name) {
  json j = {{"model", {{"vocab", 257}, {"layers", 2}, {"heads", 2}, {"dim", 32}, {"seq_len", 32}}},
            {"data", {{"train", (d / "s_train_*.bin").string()}, {"val", (d / "s_val_*.bin").string()}}},
            {"train", {{"tokens_per_step", 256}, {"micro_batch", 4}, {"steps", 40}, {"lr", 1e-2}, {"warmup", 5}, {"device", "cpu"}}},
            {"eval", {{"every", 20}, {"batches", 2}}},
            {"log", {{"out", d.string()}, {"name", name}, {"every", 100}}}};
  return qattn::config_from_json(j);
}

}  // namespace

TEST_CASE("a tiny model learns and training is deterministic", "[train]") {
  const fs::path d = make_corpus();
  std::vector<std::string> runs[2];
  for (int r = 0; r < 2; ++r) {
    const auto cfg = tiny_config(d, "run" + std::to_string(r));
    auto backend = qattn::make_cpu_backend(cfg);
    const auto result = qattn::train(cfg, *backend, qattn::run_directory(cfg));
    CHECK_FALSE(result.diverged);
    CHECK(result.steps_done == 40);
    runs[r] = loss_columns(fs::path(qattn::run_directory(cfg)) / "metrics.csv");
  }
  REQUIRE(runs[0].size() == 41);
  CHECK(runs[0] == runs[1]);
  const double first = std::stod(runs[0].front().substr(1));        // step 0: "|val"
  const double last = std::stod(runs[0].back().substr(runs[0].back().find('|') + 1));
  CHECK(last < first - 2.0);
  CHECK(fs::exists(fs::path(d) / "run0" / "config.json"));
  CHECK(fs::exists(fs::path(d) / "run0" / "events.log"));
}
