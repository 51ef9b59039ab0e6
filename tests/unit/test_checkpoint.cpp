// Checkpoints and resume: the format and its verification, pruning, config
// mismatch errors, bit-exact resume (in process and after SIGKILL mid-write),
// SIGTERM's final checkpoint, and the divergence path.
#include <omp.h>
#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <random>

#include "qattn/backend.hpp"
#include "qattn/checkpoint.hpp"
#include "qattn/stop_request.hpp"
#include "qattn/trainer.hpp"
#include "run_helpers.hpp"

using namespace qattn;
using namespace qattn::test;
using nlohmann::json;

namespace {

Checkpoint random_checkpoint(int64_t step, size_t n) {
  std::mt19937 rng(static_cast<unsigned>(step));
  std::normal_distribution<float> normal;
  Checkpoint ck;
  ck.config = {{"model", {{"dim", 16}}}};
  ck.state.step = step;
  ck.state.adam_t = step - 1;
  ck.state.data_epoch = 2;
  ck.state.data_cursor = 17;
  ck.state.data_seed = 42;
  ck.state.spike_mean = 3.25;
  ck.state.spike_var = 0.1 + 1e-17;
  for (auto* v : {&ck.params, &ck.adam_m, &ck.adam_v})
    for (size_t i = 0; i < n; ++i) v->push_back(normal(rng));
  return ck;
}

// One OpenMP thread for the tiny models: on a loaded 2-core machine, waking a
// second thread after every checkpoint's fsync costs more than the step.
TrainResult train_in_process(const json& j, TrainOptions options = {}) {
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  struct Restore {
    int n;
    ~Restore() { omp_set_num_threads(n); }
  } restore{threads};
  const Config cfg = config_from_json(j);
  auto backend = make_cpu_backend(cfg);
  return train(cfg, *backend, run_directory(cfg), options);
}

// A backend that requests a stop just before its n-th evaluation batch
// (forward_loss call, counted from 1), as a signal arriving mid-evaluation would.
class StopInEvaluation : public Backend {
 public:
  StopInEvaluation(std::unique_ptr<Backend> inner, StopRequest& stop, int n) : inner_(std::move(inner)), stop_(stop), n_(n) {}
  std::string name() const override { return inner_->name(); }
  const ParamLayout& layout() const override { return inner_->layout(); }
  void get_params(std::vector<float>& out) override { inner_->get_params(out); }
  void set_params(const std::vector<float>& in) override { inner_->set_params(in); }
  void get_grads(std::vector<float>& out) override { inner_->get_grads(out); }
  void get_adam_state(std::vector<float>& m, std::vector<float>& v) override { inner_->get_adam_state(m, v); }
  void set_adam_state(const std::vector<float>& m, const std::vector<float>& v) override { inner_->set_adam_state(m, v); }
  void zero_grad() override { inner_->zero_grad(); }
  float forward_backward(const int32_t* in, const int32_t* tg, int B, int T, float scale) override {
    return inner_->forward_backward(in, tg, B, T, scale);
  }
  float forward_loss(const int32_t* in, const int32_t* tg, int B, int T) override {
    const float loss = inner_->forward_loss(in, tg, B, T);
    if (++calls_ == n_ - 1) stop_.request();  // seen before batch n
    return loss;
  }
  float grad_norm() override { return inner_->grad_norm(); }
  void adamw_step(const AdamWHyper& h, float grad_mult, int64_t t) override { inner_->adamw_step(h, grad_mult, t); }
  std::vector<LayerDiag> diagnostics(const int32_t* in, const int32_t* tg, int B, int T) override {
    return inner_->diagnostics(in, tg, B, T);
  }

 private:
  std::unique_ptr<Backend> inner_;
  StopRequest& stop_;
  int n_, calls_ = 0;
};

}  // namespace

TEST_CASE("a checkpoint round-trips and a damaged one never loads", "[checkpoint]") {
  const auto d = scratch_dir("ckpt_format");
  const Checkpoint a = random_checkpoint(7, 1000);
  const std::string dir = save_checkpoint(d.string(), a, 3);
  CHECK(fs::path(dir).filename() == "step_00000007");
  const Checkpoint b = load_checkpoint(dir);
  CHECK(b.config == a.config);
  CHECK(b.params == a.params);
  CHECK(b.adam_m == a.adam_m);
  CHECK(b.adam_v == a.adam_v);
  CHECK(b.state.step == 7);
  CHECK(b.state.adam_t == 6);
  CHECK(b.state.data_epoch == 2);
  CHECK(b.state.data_cursor == 17);
  CHECK(b.state.data_seed == 42);
  CHECK(b.state.spike_var == a.state.spike_var);  // doubles round-trip exactly

  SECTION("a flipped byte fails the checksum") {
    {
      std::fstream f(fs::path(dir) / "adam_v.bin", std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(123);
      f.put('\x5a');
    }
    CHECK_THAT(checkpoint_problem(dir), Catch::Contains("adam_v.bin: checksum"));
    CHECK_THROWS_WITH(load_checkpoint(dir), Catch::Contains("is not valid"));
  }
  SECTION("a truncated file fails the size check") {
    fs::resize_file(fs::path(dir) / "params.bin", 400);
    CHECK_THAT(checkpoint_problem(dir), Catch::Contains("params.bin holds 400 bytes"));
  }
  SECTION("no manifest, no checkpoint; the newest valid one is used instead") {
    save_checkpoint(d.string(), random_checkpoint(9, 1000), 3);
    fs::remove(fs::path(checkpoint_root(d.string())) / "step_00000009" / "manifest.json");
    std::vector<std::string> passed;
    CHECK(latest_checkpoint(d.string(), &passed) == dir);
    REQUIRE(passed.size() == 1);
    CHECK_THAT(passed[0], Catch::Contains("no manifest.json"));
  }
}

TEST_CASE("the manifest's checksum is FNV-1a-64 over 64-bit words, as docs/runs.md defines it", "[checkpoint]") {
  const auto d = scratch_dir("ckpt_checksum");
  Checkpoint ck = random_checkpoint(1, 3);
  ck.params = {1.0f, 2.0f, 3.0f};  // bytes 0000803f 00000040 00004040: one word and a 4-byte tail
  const std::string dir = save_checkpoint(d.string(), ck, 1);
  const json manifest = json::parse(read_text(fs::path(dir) / "manifest.json"));
  // Known answers from the documented rule (Python); byte-wise FNV-1a-64 of the
  // same 12 bytes is 1de40d89811fe258, which is why the docs name the difference.
  CHECK(manifest["files"]["params.bin"]["fnv1a64"] == "dbc0c7699c65204f");
  CHECK(manifest["files"]["params.bin"]["bytes"] == 12);
}

TEST_CASE("only the newest keep_checkpoints survive, and dead temporaries go", "[checkpoint]") {
  const auto d = scratch_dir("ckpt_prune");
  fs::create_directories(fs::path(checkpoint_root(d.string())) / ".step_00000003.tmp");
  for (int64_t step : {1, 2, 3, 4}) save_checkpoint(d.string(), random_checkpoint(step, 10), 2);
  const auto all = list_checkpoints(d.string());
  REQUIRE(all.size() == 2);
  CHECK(fs::path(all[0]).filename() == "step_00000003");
  CHECK(fs::path(all[1]).filename() == "step_00000004");
  CHECK_FALSE(fs::exists(fs::path(checkpoint_root(d.string())) / ".step_00000003.tmp"));
}

namespace {

// Every name under dir that is a temporary of save_checkpoint or write_file_atomically.
std::vector<std::string> temporaries(const fs::path& dir) {
  std::vector<std::string> found;
  for (const auto& name : listing(dir))
    if (name.size() >= 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) found.push_back(name);
  return found;
}

}  // namespace

TEST_CASE("a checkpoint write leaves no temporary, whether it succeeds or fails midway", "[checkpoint]") {
  const auto d = scratch_dir("ckpt_no_temporaries");
  const fs::path root = checkpoint_root(d.string());

  SECTION("success, with a killed writer's temporary of another step beside it") {
    fs::create_directories(root / ".step_00000099.tmp");
    save_checkpoint(d.string(), random_checkpoint(5, 100), 3);
    CHECK(temporaries(d).empty());
    CHECK(listing(root).size() == 7);  // step_00000005 and its 6 files
  }
  SECTION("the checkpoints folder is a regular file: the error names it, nothing is written") {
    fs::create_directories(d);
    std::ofstream(root) << "not a folder";
    CHECK_THROWS_WITH(save_checkpoint(d.string(), random_checkpoint(5, 100), 3),
                      Catch::Contains("cannot create " + root.string()) && Catch::Contains("ot a directory"));
    CHECK(listing(d) == std::vector<std::string>{"checkpoints"});
  }
  SECTION("a tensor write fails midway (file size limit): the error names the file, the previous checkpoint stays") {
    const std::string previous = save_checkpoint(d.string(), random_checkpoint(4, 100000), 3);
    const auto before = listing(d);
    // RLIMIT_FSIZE binds root too: writes past 64 KiB fail with EFBIG (SIGXFSZ ignored),
    // after config.json and state.json and partway through params.bin's 400 KB.
    struct rlimit old{};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
    const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = old;
    small.rlim_cur = 64 << 10;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    std::string error;
    try {
      save_checkpoint(d.string(), random_checkpoint(8, 100000), 3);
    } catch (const CheckpointError& e) {
      error = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, old_handler);
    CHECK_THAT(error, Catch::Contains("cannot write " + (root / ".step_00000008.tmp" / "params.bin").string() +
                                      ": File too large"));
    CHECK(temporaries(d).empty());
    CHECK(listing(d) == before);
    CHECK(load_checkpoint(previous).params == random_checkpoint(4, 100000).params);
  }
}

TEST_CASE("config differences name the keys and ignore logging", "[checkpoint]") {
  const json a = {{"train", {{"lr", 0.01}, {"steps", 10}, {"checkpoint_every", 5}}}, {"log", {{"every", 1}}}};
  json b = a;
  b["train"]["lr"] = 0.02;
  b["train"]["checkpoint_every"] = 2;
  b["log"]["every"] = 7;
  b["model"]["qk_norm"] = true;
  const auto diffs = config_differences(a, b);
  REQUIRE(diffs.size() == 2);
  CHECK(diffs[0] == "model.qk_norm: (absent) -> true");
  CHECK(diffs[1] == "train.lr: 0.01 -> 0.02");
}

TEST_CASE("resume continues bit-exactly and refuses a different config", "[checkpoint][train]") {
  const auto d = scratch_dir("ckpt_resume");
  make_corpus(d);
  const json whole = tiny_config(d, "whole", 12);
  REQUIRE(train_in_process(whole).status == RunStatus::finished);
  const auto expected = loss_columns(d / "runs" / "whole" / "metrics.csv");
  REQUIRE(expected.size() == 13);

  SECTION("rows after the checkpoint are recomputed the same") {
    json j = tiny_config(d, "cut", 12);
    REQUIRE(train_in_process(j).status == RunStatus::finished);
    fs::remove_all(d / "runs" / "cut" / "checkpoints" / "step_00000012");  // as if killed after step 11
    const TrainResult r = train_in_process(j);
    CHECK(r.resumed_from == 8);
    CHECK(r.status == RunStatus::finished);
    CHECK(loss_columns(d / "runs" / "cut" / "metrics.csv") == expected);
  }
  SECTION("a stop request before the first evaluation ends the run at step 0; the next starts afresh") {
    const json j = tiny_config(d, "stopped", 12);
    StopRequest stop;
    stop.request();
    TrainOptions o;
    o.stop = &stop;
    const TrainResult first = train_in_process(j, o);
    CHECK(first.status == RunStatus::interrupted);
    CHECK(first.steps_done == 0);
    const json st = json::parse(read_text(d / "runs" / "stopped" / "status.json"));
    CHECK(st["status"] == "interrupted");
    CHECK_THAT(st["reason"].get<std::string>(), Catch::Contains("during the evaluation of step 0"));
    CHECK(latest_checkpoint((d / "runs" / "stopped").string()).empty());
    stop.clear();
    CHECK(train_in_process(j, o).resumed_from == -1);
    CHECK(loss_columns(d / "runs" / "stopped" / "metrics.csv") == expected);
  }
  SECTION("a changed config is an error naming the key") {
    json j = whole;
    j["train"]["lr"] = 0.005;
    j["log"]["every"] = 3;  // logging may change
    CHECK_THROWS_WITH(train_in_process(j), Catch::Contains("train.lr: 0.01 -> 0.005") &&
                                               !Catch::Contains("log.every"));
  }
  SECTION("--resume without a checkpoint is an error") {
    TrainOptions o;
    o.resume = ResumeMode::require;
    CHECK_THROWS_AS(train_in_process(tiny_config(d, "none", 12), o), ResumeError);
  }
}

TEST_CASE("resume restores QK-norm's parameters and continues bit-exactly, each form", "[checkpoint][train][qknorm]") {
  const auto d = scratch_dir("ckpt_resume_qknorm");
  make_corpus(d);
  for (const json& qk_norm : {json({{"form", "gain"}, {"lr_mult", 10}}), json({{"form", "logit_scale"}, {"lr_mult", 10}})}) {
    const std::string form = qk_norm["form"];
    INFO("model.qk_norm = " << qk_norm.dump());
    json whole = tiny_config(d, "whole_" + form, 12);
    whole["model"]["qk_norm"] = qk_norm;
    REQUIRE(train_in_process(whole).status == RunStatus::finished);
    json cut = tiny_config(d, "cut_" + form, 12);
    cut["model"]["qk_norm"] = qk_norm;
    REQUIRE(train_in_process(cut).status == RunStatus::finished);
    const fs::path cut_dir = d / "runs" / ("cut_" + form);
    fs::remove_all(cut_dir / "checkpoints" / "step_00000012");  // as if killed after step 11
    const TrainResult r = train_in_process(cut);
    CHECK(r.resumed_from == 8);
    CHECK(loss_columns(cut_dir / "metrics.csv") == loss_columns(d / "runs" / ("whole_" + form) / "metrics.csv"));
    // The final state is the same bit for bit, QK-norm's tensors included, and they moved.
    const Checkpoint a = load_checkpoint(latest_checkpoint((d / "runs" / ("whole_" + form)).string()));
    const Checkpoint b = load_checkpoint(latest_checkpoint(cut_dir.string()));
    CHECK(a.params == b.params);
    CHECK(a.adam_m == b.adam_m);
    CHECK(a.adam_v == b.adam_v);
    const Config cfg = config_from_json(whole);
    const ParamLayout lay(cfg.model);
    std::vector<float> init;
    init_params(cfg.model, cfg.train.seed, init);
    REQUIRE(a.params.size() == lay.total);
    const int tensor = form == "gain" ? P_QGAMMA : P_QKSCALE;
    REQUIRE(lay.size[tensor] > 0);
    const auto begin = static_cast<std::ptrdiff_t>(lay.offset[tensor]), end = begin + static_cast<std::ptrdiff_t>(lay.size[tensor]);
    CHECK_FALSE(std::equal(a.params.begin() + begin, a.params.begin() + end, init.begin() + begin));
  }
}

TEST_CASE("a stop during an evaluation ends it between batches; resume evaluates first", "[checkpoint][train]") {
  const auto d = scratch_dir("ckpt_stop_eval");
  make_corpus(d);
  REQUIRE(train_in_process(tiny_config(d, "whole", 12)).status == RunStatus::finished);
  const auto expected = loss_columns(d / "runs" / "whole" / "metrics.csv");
  const json j = tiny_config(d, "cut", 12);  // eval.every 4, 2 batches: evaluations at steps 0, 4, 8, 12
  const Config cfg = config_from_json(j);
  const std::string run = run_directory(cfg);
  for (const int last_step : {8, 12}) {
    INFO("stopped in the evaluation of step " << last_step);
    fs::remove_all(run);
    StopRequest stop;
    TrainOptions o;
    o.stop = &stop;
    // Evaluation batches before the cut: steps 0 and 4 (and 8) take 2 each; the cut comes before the 2nd batch.
    StopInEvaluation backend(make_cpu_backend(cfg), stop, 2 * (last_step / 4) + 2);
    const TrainResult first = train(cfg, backend, run, o);
    CHECK(first.status == RunStatus::interrupted);
    CHECK(first.steps_done == last_step);
    const json st = json::parse(read_text(fs::path(run) / "status.json"));
    CHECK(st["status"] == "interrupted");
    const Checkpoint ck = load_checkpoint(latest_checkpoint(run));
    CHECK(ck.state.step == last_step);
    CHECK(ck.state.eval_pending);
    const auto rows = loss_columns(fs::path(run) / "metrics.csv");
    REQUIRE(rows.size() == static_cast<size_t>(last_step + 1));
    CHECK_THAT(rows.back(), Catch::Contains(",,"));  // the cut row has no val_loss

    // Resume: the cut evaluation runs first and fills in its row; metrics.csv
    // then reads as the uninterrupted run's, and the event says what happened.
    stop.clear();
    const TrainResult second = train_in_process(j);
    CHECK(second.status == RunStatus::finished);
    CHECK(loss_columns(fs::path(run) / "metrics.csv") == expected);
    CHECK_THAT(read_text(fs::path(run) / "metrics.csv"),
               Catch::Contains("evaluation cut short by a stop signal; done on resume"));
  }
}

TEST_CASE("SIGKILL while writing a checkpoint leaves the previous one, and resume matches", "[checkpoint][cli]") {
  const auto d = scratch_dir("ckpt_kill");
  make_corpus(d);
  REQUIRE(train_in_process(tiny_config(d, "whole", 12)).status == RunStatus::finished);
  const auto cfg = write_json(d / "kill.json", tiny_config(d, "kill", 12));
  const int killed = run_qattn({"train", cfg.string()}, {{"QATTN_TEST_KILL_IN_CHECKPOINT", "8"}}, d / "log.txt");
  REQUIRE(WIFSIGNALED(killed));
  CHECK(WTERMSIG(killed) == SIGKILL);
  const fs::path run = d / "runs" / "kill";
  CHECK(fs::exists(run / "checkpoints" / ".step_00000008.tmp"));  // the half-written one
  CHECK(fs::path(latest_checkpoint(run.string())).filename() == "step_00000004");

  REQUIRE(exit_code(run_qattn({"train", cfg.string()}, {}, d / "log.txt")) == 0);
  CHECK(loss_columns(run / "metrics.csv") == loss_columns(d / "runs" / "whole" / "metrics.csv"));
  CHECK_FALSE(fs::exists(run / "checkpoints" / ".step_00000008.tmp"));
  CHECK(json::parse(read_text(run / "status.json"))["status"] == "finished");
}

TEST_CASE("SIGTERM writes a final checkpoint and exits with code 4", "[checkpoint][cli]") {
  const auto d = scratch_dir("ckpt_term");
  make_corpus(d);
  json j = tiny_config(d, "term", 100000);
  j["train"]["checkpoint_every"] = 0;
  const auto cfg = write_json(d / "term.json", j);
  const fs::path run = d / "runs" / "term";
  const pid_t pid = spawn_qattn({"train", cfg.string()}, {}, d / "log.txt");
  // Wait until it is training (a few metrics rows), then ask it to stop.
  for (int i = 0; i < 3000 && loss_columns(run / "metrics.csv").size() < 4; ++i) ::usleep(20000);
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  CHECK(exit_code(status) == kExitInterrupted);
  const json st = json::parse(read_text(run / "status.json"));
  CHECK(st["status"] == "interrupted");
  const std::string ck = latest_checkpoint(run.string());
  REQUIRE_FALSE(ck.empty());
  CHECK(load_checkpoint(ck).state.step == st["step"].get<int64_t>());
  CHECK(st["step"].get<int64_t>() >= 3);
}

namespace {

// Waits for pid to end, up to `seconds` (then kills it and fails): whether a
// stop request was acted on, with a bound far below the work it stops.
int wait_for_exit(pid_t pid, int seconds) {
  int status = 0;
  for (int i = 0; i < seconds * 50; ++i) {
    if (::waitpid(pid, &status, WNOHANG) == pid) return exit_code(status);
    ::usleep(20000);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  FAIL("qattn did not stop within " << seconds << " s of the signal");
  return -1;
}

}  // namespace

TEST_CASE("SIGTERM during a long evaluation is acknowledged and ends it between batches", "[checkpoint][cli]") {
  const auto d = scratch_dir("ckpt_term_eval");
  make_corpus(d);
  // A val split of 2^23 tokens read whole at step 0: 2,047 batches of 32
  // sequences of 128 + 1 tokens, tens of milliseconds each (OMP_NUM_THREADS=1).
  const std::vector<uint16_t> val(size_t{1} << 23, uint16_t{'a'});
  write_shard((d / "long_val_000000.bin").string(), val.data(), val.size());
  json j = tiny_config(d, "eval", 100);
  j["data"]["val"] = (d / "long_val_*.bin").string();
  j["model"]["seq_len"] = 128;
  j["train"]["micro_batch"] = 32;
  j["train"]["tokens_per_step"] = 32 * 128;
  j["eval"]["batches"] = qattn::batches_in(int64_t{1} << 23, 32, 128);
  const auto cfg = write_json(d / "eval.json", j);
  const fs::path run = d / "runs" / "eval";
  const pid_t pid = spawn_qattn({"train", cfg.string()}, {}, d / "log.txt");
  for (int i = 0; i < 3000 && !fs::exists(run / "status.json"); ++i) ::usleep(20000);  // written before step 0
  ::usleep(200000);
  ::kill(pid, SIGTERM);
  CHECK(wait_for_exit(pid, 60) == kExitInterrupted);
  const std::string log = read_text(d / "log.txt");
  CHECK_THAT(log, Catch::Contains("stop requested: stopping after the current step or evaluation"));
  const json st = json::parse(read_text(run / "status.json"));
  CHECK(st["status"] == "interrupted");
  CHECK_THAT(st["reason"].get<std::string>(), Catch::Contains("during the evaluation of step 0"));
}

TEST_CASE("a second SIGTERM stops at once, and status.json says interrupted", "[checkpoint][cli]") {
  const auto d = scratch_dir("ckpt_term_twice");
  make_corpus(d);
  json j = tiny_config(d, "twice", 2);
  j["train"]["tokens_per_step"] = int64_t{128} * 100000000;  // one step of 10^8 micro-batches: days
  const auto cfg = write_json(d / "twice.json", j);
  const fs::path run = d / "runs" / "twice";
  const pid_t pid = spawn_qattn({"train", cfg.string()}, {}, d / "log.txt");
  for (int i = 0; i < 3000 && loss_columns(run / "metrics.csv").empty(); ++i) ::usleep(20000);  // step 1 began
  ::kill(pid, SIGTERM);
  for (int i = 0; i < 500 && read_text(d / "log.txt").find("stop requested") == std::string::npos; ++i) ::usleep(20000);
  ::kill(pid, SIGTERM);
  CHECK(wait_for_exit(pid, 60) == kExitInterrupted);
  const json st = json::parse(read_text(run / "status.json"));
  CHECK(st["status"] == "interrupted");
  CHECK_THAT(st["reason"].get<std::string>(), Catch::Contains("second signal"));
  CHECK(st["step"] == 0);
}

TEST_CASE("a non-finite loss stops the run: diverged row, exit 3, last good checkpoint kept", "[checkpoint][cli]") {
  const auto d = scratch_dir("ckpt_nan");
  make_corpus(d);
  const auto cfg = write_json(d / "nan.json", tiny_config(d, "nan", 12));
  const int status = run_qattn({"train", cfg.string()}, {{"QATTN_TEST_NAN_AT_STEP", "6"}}, d / "log.txt");
  CHECK(exit_code(status) == kExitDiverged);
  const fs::path run = d / "runs" / "nan";
  const auto rows = loss_columns(run / "metrics.csv");
  REQUIRE(rows.size() == 7);  // steps 0..6
  CHECK_THAT(read_text(run / "metrics.csv"), Catch::Contains("diverged: non-finite train loss (nan) at step 6"));
  const json st = json::parse(read_text(run / "status.json"));
  CHECK(st["status"] == "diverged");
  CHECK(st["step"] == 5);
  CHECK(fs::path(st["checkpoint"].get<std::string>()).filename() == "step_00000004");
  CHECK(checkpoint_problem(st["checkpoint"]).empty());
}

TEST_CASE("the loss-spike rule skips updates and counts them", "[checkpoint][train]") {
  const auto d = scratch_dir("ckpt_spike");
  make_corpus(d);
  // With a learning rate too small to move the loss, the loss only wobbles
  // around its mean, and a tiny threshold flags the steps above the mean.
  json j = tiny_config(d, "spike", 40);
  j["train"]["lr"] = 1e-7;
  j["train"]["spike_zscore"] = 1e-9;
  j["train"]["checkpoint_every"] = 0;
  const TrainResult r = train_in_process(j);
  CHECK(r.status == RunStatus::finished);
  const json st = json::parse(read_text(d / "runs" / "spike" / "status.json"));
  CHECK(st["skipped"].get<int>() > 0);
  CHECK(st["skipped"].get<int>() <= 20);
  CHECK_THAT(read_text(d / "runs" / "spike" / "metrics.csv"), Catch::Contains("spike: update skipped"));
}

TEST_CASE("one process at a time writes a run directory", "[checkpoint]") {
  const auto d = scratch_dir("ckpt_lock");
  make_corpus(d);
  const json j = tiny_config(d, "locked", 4);
  fs::create_directories(d / "runs" / "locked");
  {
    const DirLock other(d / "runs" / "locked");  // as a live process would hold it
    CHECK_THROWS_WITH(train_in_process(j), Catch::Contains("is in use by another qattn process (pid " +
                                                           std::to_string(::getpid()) + ")"));
  }
  CHECK(train_in_process(j).status == RunStatus::finished);  // released with its holder
}
