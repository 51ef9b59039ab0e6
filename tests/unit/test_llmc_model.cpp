// llm.c model files: header fields, padded vocab, fp32 round trip, bf16
// rounding, QK-norm refusal, size checks, and model.init_from starting a run
// from an exported checkpoint; `qattn export` and `qattn sample` end to end.
#include <catch2/catch.hpp>
#include <cstring>
#include <random>

#include "qattn/checkpoint.hpp"
#include "qattn/llmc_model.hpp"
#include "qattn/model.hpp"
#include "qattn/trainer.hpp"
#include "run_helpers.hpp"

using namespace qattn;
using namespace qattn::test;
using nlohmann::json;

namespace {

ModelConfig small_model() {
  ModelConfig m;
  m.vocab = 300, m.layers = 2, m.heads = 2, m.dim = 16, m.seq_len = 24;
  return m;
}

std::vector<int32_t> header_of(const fs::path& path) {
  std::vector<int32_t> h(256);
  std::ifstream(path, std::ios::binary).read(reinterpret_cast<char*>(h.data()), 1024);
  return h;
}

}  // namespace

TEST_CASE("llm.c model files: header, padding and the fp32 round trip", "[llmc]") {
  const auto d = scratch_dir("llmc_fp32");
  const ModelConfig m = small_model();
  const auto params = random_params(m, 1.0f);
  const fs::path file = d / "model.bin";
  write_llmc_model(file.string(), m, params, kLlmcVersionFp32);

  const auto h = header_of(file);
  CHECK(h[0] == 20240326);
  CHECK(h[1] == 3);
  CHECK(h[2] == 24);   // max_seq_len
  CHECK(h[3] == 300);  // vocab_size
  CHECK(h[4] == 2);    // num_layers
  CHECK(h[5] == 2);    // num_heads
  CHECK(h[6] == 16);   // channels
  CHECK(h[7] == 384);  // padded_vocab_size: a multiple of 128
  CHECK(fs::file_size(file) == 1024 + 4 * (ParamLayout(m).total + (384 - 300) * 16));
  // The padding rows of wte are zero and wpe follows them.
  std::vector<float> wte_and_wpe((384 + 1) * 16);
  std::ifstream f(file, std::ios::binary);
  f.seekg(1024);
  f.read(reinterpret_cast<char*>(wte_and_wpe.data()), static_cast<std::streamsize>(wte_and_wpe.size() * 4));
  CHECK(std::all_of(wte_and_wpe.begin() + 300 * 16, wte_and_wpe.begin() + 384 * 16, [](float x) { return x == 0; }));
  CHECK(wte_and_wpe[384 * 16] == params[ParamLayout(m).offset[P_WPE]]);

  const LlmcModel back = read_llmc_model(file.string());
  CHECK(back.version == 3);
  CHECK(back.padded_vocab == 384);
  CHECK(back.params == params);  // bit for bit

  SECTION("a shorter seq_len takes the first rows of wpe") {
    ModelConfig shorter = m;
    shorter.seq_len = 8;
    const auto p = params_from_llmc_model(file.string(), shorter);
    const ParamLayout a(shorter), b(m);
    CHECK(p.size() == a.total);
    CHECK(std::equal(p.begin() + a.offset[P_WPE], p.begin() + a.offset[P_WPE] + a.size[P_WPE],
                     params.begin() + b.offset[P_WPE]));
    CHECK(std::equal(p.begin() + a.offset[P_LN1W], p.end(), params.begin() + b.offset[P_LN1W]));
  }
  SECTION("a different shape is an error naming the keys") {
    ModelConfig other = m;
    other.dim = 32;
    other.seq_len = 100;
    CHECK_THROWS_WITH(params_from_llmc_model(file.string(), other),
                      Catch::Contains("model.dim = 32 but the file has 16") &&
                          Catch::Contains("model.seq_len = 100 exceeds the file's max_seq_len 24"));
  }
  SECTION("damaged files are refused") {
    fs::resize_file(file, fs::file_size(file) - 2);
    CHECK_THROWS_WITH(read_llmc_model(file.string()), Catch::Contains("the header implies"));
    std::fstream g(file, std::ios::in | std::ios::out | std::ios::binary);
    const int32_t wrong = 1234;
    g.write(reinterpret_cast<const char*>(&wrong), 4);
    g.close();
    CHECK_THROWS_WITH(read_llmc_model(file.string()), Catch::Contains("magic 1234"));
  }
}

TEST_CASE("llm.c bf16 files round to nearest even and round-trip exactly after that", "[llmc]") {
  const auto d = scratch_dir("llmc_bf16");
  const ModelConfig m = small_model();
  auto params = random_params(m, 1.0f);
  params[0] = 1.0f + 1.0f / 256;         // exactly between two bf16 values: rounds to the even 1.0
  params[1] = 1.0f + 3.0f / 256;         // between 1+2/256 and 1+4/256: rounds to the even 1+4/256
  params[2] = -2.5f;                     // exact in bf16
  write_llmc_model((d / "a.bin").string(), m, params, kLlmcVersionBf16);
  const auto h = header_of(d / "a.bin");
  CHECK(h[1] == 5);
  CHECK(fs::file_size(d / "a.bin") == 1024 + 2 * (ParamLayout(m).total + (384 - 300) * 16));
  const LlmcModel back = read_llmc_model((d / "a.bin").string());
  CHECK(back.params[0] == 1.0f);
  CHECK(back.params[1] == 1.0f + 4.0f / 256);
  CHECK(back.params[2] == -2.5f);
  size_t off_by_more_than_half_ulp = 0;
  for (size_t i = 3; i < params.size(); ++i)
    off_by_more_than_half_ulp += std::abs(back.params[i] - params[i]) > std::abs(params[i]) / 256;
  CHECK(off_by_more_than_half_ulp == 0);
  write_llmc_model((d / "b.bin").string(), m, back.params, kLlmcVersionBf16);
  CHECK(read_text(d / "a.bin") == read_text(d / "b.bin"));
}

TEST_CASE("llm.c files refuse QK-norm models", "[llmc]") {
  for (const QkNormForm form : {QkNormForm::gain, QkNormForm::logit_scale}) {
    ModelConfig m = small_model();
    m.qk_norm.form = form;
    const std::string named = std::string("model.qk_norm is on (form \"") + to_string(form) + "\")";
    CHECK_THROWS_WITH(write_llmc_model("/tmp/never.bin", m, std::vector<float>(ParamLayout(m).total), 3),
                      Catch::Contains(named) && Catch::Contains("allowed: GPT-2 configs"));
    CHECK_THROWS_WITH(check_llmc_model("/tmp/never.bin", m),
                      Catch::Contains("model.init_from = /tmp/never.bin") && Catch::Contains(named));
  }
}

TEST_CASE("export a checkpoint, start a run from it with model.init_from, sample from it", "[llmc][cli]") {
  const auto d = scratch_dir("llmc_cli");
  make_corpus(d);
  const auto cfg = write_json(d / "src.json", tiny_config(d, "src", 8));
  REQUIRE(exit_code(run_qattn({"train", cfg.string()}, {}, d / "log.txt")) == 0);
  const fs::path run = d / "runs" / "src";
  REQUIRE(exit_code(run_qattn({"export", "--checkpoint", run.string(), "--out", (d / "m.bin").string()}, {},
                              d / "log.txt")) == 0);
  const Checkpoint ck = load_checkpoint(latest_checkpoint(run.string()));
  CHECK(read_llmc_model((d / "m.bin").string()).params == ck.params);

  // The new run's untrained model is the exported one: its step-0 val loss is
  // the source run's final val loss (same val batches).
  json j = tiny_config(d, "dst", 8);
  j["model"]["init_from"] = (d / "m.bin").string();
  const auto dst = write_json(d / "dst.json", j);
  REQUIRE(exit_code(run_qattn({"train", dst.string()}, {}, d / "log.txt")) == 0);
  const auto src_rows = loss_columns(run / "metrics.csv"), dst_rows = loss_columns(d / "runs" / "dst" / "metrics.csv");
  const auto val_of = [](const std::string& row) {  // step,tokens,lr,train,val,norm,
    std::vector<std::string> f;
    std::stringstream ss(row);
    for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
    return f.at(4);
  };
  CHECK(val_of(dst_rows.front()) == val_of(src_rows.back()));

  const fs::path out = d / "sample.txt";
  REQUIRE(exit_code(run_qattn({"sample", "--checkpoint", run.string(), "--prompt", "the cat", "--tokens", "12",
                               "--seed", "3"}, {}, out)) == 0);
  const std::string text = read_text(out);
  CHECK(text.rfind("the cat", 0) == 0);
  CHECK(text.size() >= 7 + 1);
  fs::remove(out);
  run_qattn({"sample", "--checkpoint", run.string(), "--prompt", "the cat", "--tokens", "12", "--seed", "3"}, {}, out);
  CHECK(read_text(out) == text);  // the seed fixes the sample
}
