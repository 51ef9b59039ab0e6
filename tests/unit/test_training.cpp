// Training smoke: a tiny model on a generated shard lowers its loss, and the
// same seed twice gives identical loss columns; with either QK-norm form it
// learns too, and model.qk_norm.lr_mult scales the AdamW step of QK-norm's
// parameters alone.
#include <catch2/catch.hpp>
#include <cmath>
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

qattn::Config tiny_config(const fs::path& d, const std::string& name, const json& qk_norm = false) {
  json j = {{"model", {{"vocab", 257}, {"layers", 2}, {"heads", 2}, {"dim", 32}, {"seq_len", 32}, {"qk_norm", qk_norm}}},
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

TEST_CASE("a tiny model with either QK-norm form learns", "[train][qknorm]") {
  const fs::path d = make_corpus();
  for (const char* form : {"gain", "logit_scale"}) {
    INFO("form " << form);
    const auto cfg = tiny_config(d, std::string("qk_") + form, json({{"form", form}, {"lr_mult", 10}}));
    auto backend = qattn::make_cpu_backend(cfg);
    const auto result = qattn::train(cfg, *backend, qattn::run_directory(cfg));
    CHECK_FALSE(result.diverged);
    const auto rows = loss_columns(fs::path(qattn::run_directory(cfg)) / "metrics.csv");
    REQUIRE(rows.size() == 41);
    const double first = std::stod(rows.front().substr(1));
    const double last = std::stod(rows.back().substr(rows.back().find('|') + 1));
    CHECK(last < first - 2.0);
  }
}

TEST_CASE("model.qk_norm.lr_mult scales the AdamW step of QK-norm's parameters alone", "[train][qknorm]") {
  using qattn::ParamLayout;
  const fs::path d = make_corpus();
  for (const char* form : {"gain", "logit_scale"}) {
    INFO("form " << form);
    // The first AdamW step moves each parameter by lr * g / (|g| + eps): linear in lr.
    std::vector<float> before, after[2];
    for (int i = 0; i < 2; ++i) {
      const double mult = i == 0 ? 1.0 : 7.0;
      const auto cfg = tiny_config(d, "lr_mult", json({{"form", form}, {"lr_mult", mult}}));
      auto backend = qattn::make_cpu_backend(cfg);
      backend->get_params(before);
      std::vector<int32_t> in(4 * 32), tg(4 * 32);
      for (size_t t = 0; t < in.size(); ++t) in[t] = static_cast<int32_t>(t * 7 % 257), tg[t] = static_cast<int32_t>(t * 11 % 257);
      backend->zero_grad();
      backend->forward_backward(in.data(), tg.data(), 4, 32, 1.0f);
      backend->adamw_step({1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f}, 1.0f, 1);
      backend->get_params(after[i]);
    }
    const ParamLayout lay(tiny_config(d, "lr_mult", json({{"form", form}})).model);
    int qk_tensors = 0;
    for (int t = 0; t < qattn::P_COUNT; ++t) {
      INFO("tensor " << ParamLayout::name(t));
      double err = 0, ref = 0;
      size_t differing = 0;
      for (size_t e = lay.offset[t]; e < lay.offset[t] + lay.size[t]; ++e) {
        const double step1 = after[0][e] - before[e], step7 = after[1][e] - before[e];
        err += (step7 - 7 * step1) * (step7 - 7 * step1);
        ref += 49 * step1 * step1;
        differing += after[1][e] != after[0][e];
      }
      if (!ParamLayout::qk_norm_param(t)) {
        CHECK(differing == 0);  // the same lr: bit for bit
      } else if (lay.size[t] > 0) {
        ++qk_tensors;
        CHECK(ref > 0);
        CHECK(std::sqrt(err / ref) < 1e-3);  // fp32 rounding of the parameters (g is about 10)
      }
    }
    CHECK(qk_tensors == (std::string(form) == "gain" ? 2 : 1));
  }
}
