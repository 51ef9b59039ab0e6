// The training loop. One optimizer step = grad_accum micro-batches of
// (micro_batch, seq_len) tokens, then the divergence check, the loss-spike
// rule, clip, AdamW, a metrics row, and on their schedules an evaluation, the
// attention diagnostics (docs/attention-maths.md §7) and a checkpoint. A run
// continues from its newest valid checkpoint bit-exactly: the checkpoint holds
// everything the loop reads.
#include "qattn/atomic_file.hpp"
#include "qattn/trainer.hpp"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>

#include "qattn/checkpoint.hpp"
#include "qattn/data.hpp"
#include "qattn/hf_model.hpp"
#include "qattn/llmc_model.hpp"
#include "qattn/optimizer.hpp"
#include "qattn/stop_request.hpp"

namespace qattn {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kMetricsHeader =
    "step,tokens,lr,train_loss,val_loss,grad_norm,step_ms,tokens_per_s,mfu,skipped,event\n";
constexpr const char* kDiagHeader =
    "step,layer,kind,q_rms,k_rms,max_abs_score,cos_o,cos_p,cos_ds,cos_dq,cos_dk,cos_dv,"
    "rel_o,rel_p,rel_ds,rel_dq,rel_dk,rel_dv\n";

// Loss-spike rule: exponential moving mean and variance of the train loss
// (about the last 100 steps). A step whose loss lies more than spike_zscore
// standard deviations above the mean, once 20 losses were seen, skips its
// update. Every finite loss enters the statistics, skipped ones included, so a
// lasting shift of the loss widens the variance instead of skipping forever.
constexpr double kSpikeAlpha = 0.01;
constexpr int64_t kSpikeWarmup = 20;

double spike_zscore(const TrainState& s, double loss) {
  if (s.spike_count < kSpikeWarmup || s.spike_var <= 0) return 0.0;
  return (loss - s.spike_mean) / std::sqrt(s.spike_var);
}

void observe_loss(TrainState& s, double loss) {
  if (s.spike_count == 0) {
    s.spike_mean = loss;
  } else {
    const double d = loss - s.spike_mean;
    s.spike_mean += kSpikeAlpha * d;
    s.spike_var = (1 - kSpikeAlpha) * (s.spike_var + kSpikeAlpha * d * d);
  }
  ++s.spike_count;
}

// Test hook for the divergence path: QATTN_TEST_NAN_AT_STEP=N makes the train
// loss of step N NaN, as a real overflow would.
int64_t injected_nan_step() {
  const char* s = std::getenv("QATTN_TEST_NAN_AT_STEP");
  return s ? std::strtoll(s, nullptr, 10) : -1;
}

std::string fmt_or_empty(bool present, double x, const char* f = "{:.6f}") {
  return present ? fmt::format(fmt::runtime(f), x) : std::string();
}

// The mean loss of the first `batches` val batches, or nothing when a stop is
// requested before one of them: a long evaluation must not hold up a stop.
std::optional<double> mean_val_loss(Backend& backend, DataLoader& val, int batches, int B, int T,
                                    const StopRequest* stop) {
  std::vector<int32_t> in, tg;
  val.reset();
  double sum = 0;
  for (int i = 0; i < batches; ++i) {
    if (stop && stop->requested()) return std::nullopt;
    val.next(in, tg);
    sum += backend.forward_loss(in.data(), tg.data(), B, T);
  }
  return sum / batches;
}

void write_diag(std::ofstream& csv, int64_t step, const std::vector<LayerDiag>& rows) {
  for (const auto& d : rows) {
    csv << step << ',' << d.layer << ',' << to_string(d.kind) << ',' << d.q_rms << ',' << d.k_rms << ',' << d.max_abs_score;
    const double cmp[12] = {d.cos_o, d.cos_p, d.cos_ds, d.cos_dq, d.cos_dk, d.cos_dv,
                            d.rel_o, d.rel_p, d.rel_ds, d.rel_dq, d.rel_dk, d.rel_dv};
    for (double x : cmp) csv << ',' << (d.compared ? fmt::format("{:.8g}", x) : std::string());
    csv << '\n';
  }
  csv.flush();
}

// A file of the run directory that cannot be opened (a directory in its place,
// a folder that refuses writes): named with the OS's reason before the run starts.
[[noreturn]] void fail_to_open(const std::string& path) {
  throw std::runtime_error(path + ": cannot open it for writing: " + std::strerror(errno));
}

// Opens a CSV for appending after resuming at `step`: rows of later steps
// (written after the checkpoint by the process that died) are dropped.
// A fresh run (step < 0) starts the file anew, and so does a file with other
// columns (an older qattn's), which is kept beside it as PATH.old.
std::ofstream open_csv(const std::string& path, const char* header, int64_t step) {
  std::string kept = header;
  if (step >= 0) {
    std::ifstream in(path);
    std::string line;
    if (std::getline(in, line) && line + '\n' != header) {
      in.close();
      std::error_code ec;
      fs::rename(path, path + ".old", ec);
      return open_csv(path, header, -1);
    }
    while (std::getline(in, line)) {
      const int64_t row_step = std::strtoll(line.c_str(), nullptr, 10);
      if (row_step <= step) kept += line + '\n';
    }
  }
  std::ofstream out(path, std::ios::trunc);
  if (!out) fail_to_open(path);
  out << kept;
  out.flush();
  return out;
}

// The event of a step whose evaluation a stop request cut short; the resumed
// run evaluates that step first and fills the row in.
constexpr const char* kCutEvaluation = "evaluation cut short by a stop signal";

// Fills the val_loss of step's row (the one with kCutEvaluation) in metrics.csv
// with the evaluation the resumed run made: the file then reads as an
// uninterrupted run's, with the event saying what happened.
void fill_cut_evaluation(const std::string& path, int64_t step, double val) {
  std::ifstream in(path);
  std::string text;
  for (std::string line; std::getline(in, line);) {
    if (std::strtoll(line.c_str(), nullptr, 10) == step && line.find(kCutEvaluation) != std::string::npos) {
      std::vector<std::string> fields;
      std::stringstream ss(line);
      for (std::string f; std::getline(ss, f, ',');) fields.push_back(f);
      if (fields.size() > 4) fields[4] = fmt::format("{:.6f}", val);
      fields.back() += "; done on resume";
      line = fmt::format("{}", fmt::join(fields, ","));
    }
    text += line + '\n';
  }
  in.close();
  write_file_atomically(path, [&](std::ostream& f) { f << text; });
}

// <run>/status.json, written by the lead rank from the training thread and,
// on a second stop signal, from the signal thread: the writes are serialised,
// and once a final state is written nothing overwrites it.
class StatusFile {
 public:
  StatusFile(std::string run_dir, bool lead) : path_((fs::path(run_dir) / "status.json").string()), lead_(lead) {}

  // Writes status (its "status" key says which); a final one ends the writes.
  void write(const json& status) {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (final_) return;
    latest_ = status;
    final_ = status.at("status") != "running";
    if (lead_) write_file_atomically(path_, [&](std::ostream& f) { f << status.dump(2) << '\n'; });
  }
  // Keeps status as the newest state without writing it (every step).
  void note(const json& status) {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (!final_) latest_ = status;
  }
  // The newest state under another status and reason, written at once; nothing
  // when no status was written yet (the run never started).
  void end(const std::string& status, const std::string& reason) {
    json s;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (latest_.is_null() || final_) return;
      s = latest_;
    }
    s["status"] = status;
    s["reason"] = reason;
    write(s);
  }

 private:
  std::string path_;
  bool lead_;
  std::mutex mutex_;
  json latest_;         // null until the first write
  bool final_ = false;
};

// The checkpoint to continue from, per the resume mode (nullopt: start fresh),
// and its directory in `dir` ("" when none). Only the lead rank (rank 0)
// deletes checkpoints.
std::optional<Checkpoint> checkpoint_to_resume(const Config& cfg, const std::string& run_dir,
                                               ResumeMode mode, std::vector<std::string>& passed_over,
                                               bool lead, std::string& dir) {
  if (mode == ResumeMode::fresh) {
    if (lead) fs::remove_all(checkpoint_root(run_dir));
    return std::nullopt;
  }
  dir = latest_checkpoint(run_dir, &passed_over);
  if (dir.empty()) {
    if (mode != ResumeMode::require) return std::nullopt;
    std::string msg = run_dir + ": --resume given, but the run has no valid checkpoint";
    for (const auto& p : passed_over) msg += "\n  passed over " + p;
    throw ResumeError(msg);
  }
  Checkpoint ck = load_checkpoint(dir);
  const auto diffs = config_differences(ck.config, cfg.effective);
  if (!diffs.empty()) {
    std::string msg = run_dir + " has a checkpoint (" + dir + ") whose config differs from this one in:";
    for (const auto& d : diffs) msg += "\n  " + d;
    for (const auto& d : diffs)
      if (d.rfind("train.grad_accum", 0) == 0)
        msg += "\n(train.grad_accum follows the number of ranks, tokens_per_step / (micro_batch x seq_len x "
               "world size), and so does the data position: resume on as many GPUs as the checkpoint was "
               "written with)";
    msg += "\nresume with the same config, start over with --fresh, or pick another log.name";
    throw ResumeError(msg);
  }
  return ck;
}

// What train checks of model.init_from before it starts: an llm.c file from its
// header and size, a Hugging Face directory by reading it (its checks need the
// tensors). Throws LlmcError / HfError naming model.init_from.
void check_init_from(const ModelConfig& m) {
  if (m.init_from.empty()) return;
  if (is_model_dir(m.init_from))
    params_from_hf_model(m.init_from, m);
  else
    check_llmc_model(m.init_from, m);
}

// Runs f, prefixing a DataError with the config key and glob it came from.
template <class F>
auto naming_key(bool train, const Config& cfg, F&& f) {
  const char* key = train ? "data.train" : "data.val";
  const std::string& glob = train ? cfg.data.train : cfg.data.val;
  try {
    return f(glob);
  } catch (const DataError& e) {
    throw DataError(std::string(key) + " = \"" + glob + "\": " + e.what());
  }
}

// An evaluation reads eval.batches batches from the start of data.val; past
// its end the loader starts over, and a batch read twice counts twice in the
// val loss.
void check_eval_batches(const Config& cfg, int64_t val_tokens) {
  const int64_t held = batches_in(val_tokens, cfg.train.micro_batch, cfg.model.seq_len);
  if (cfg.eval.batches > held)
    throw DataError(fmt::format("eval.batches: {} is more than data.val = \"{}\" holds ({} tokens: {} batches of "
                                "micro_batch = {} sequences of {}+1 tokens); a batch read twice would count twice in "
                                "the val loss; allowed: at most {}",
                                cfg.eval.batches, cfg.data.val, val_tokens, held, cfg.train.micro_batch,
                                cfg.model.seq_len, held));
}

}  // namespace

DataLoader open_data(const Config& cfg, bool train, int rank, int world) {
  DataLoader data = naming_key(train, cfg, [&](const std::string& glob) {
    DataLoader d(glob, cfg.train.micro_batch, cfg.model.seq_len, /*shuffle=*/train, cfg.train.seed, rank, world);
    check_token_ids(d.shards(), cfg.model.vocab);
    return d;
  });
  if (!train) check_eval_batches(cfg, data.num_tokens());
  return data;
}

void check_run_inputs(const Config& cfg, int world) {
  for (const bool train : {true, false}) {
    const int64_t tokens = naming_key(train, cfg, [&](const std::string& glob) {
      std::vector<ShardInfo> shards;
      int64_t held = 0;
      for (const auto& path : expand_glob(glob)) {
        shards.push_back(scan_shard(path));
        held += shards.back().tokens;
      }
      check_token_ids(shards, cfg.model.vocab);
      check_one_batch(glob, held, static_cast<int64_t>(cfg.train.micro_batch) * (train ? world : 1),
                      cfg.model.seq_len);
      return held;
    });
    if (!train) check_eval_batches(cfg, tokens);
  }
  check_init_from(cfg.model);
}

std::string to_string(RunStatus s) {
  switch (s) {
    case RunStatus::finished: return "finished";
    case RunStatus::diverged: return "diverged";
    case RunStatus::interrupted: return "interrupted";
  }
  return "?";
}

std::string run_directory(const Config& cfg) { return (fs::path(cfg.log.out) / cfg.log.name).string(); }

namespace {

TrainResult run_training(const Config& cfg, Backend& backend, const std::string& run_dir,
                         const TrainOptions& options, StatusFile& status) {
  const auto wall_start = std::chrono::steady_clock::now();
  const TrainConfig& tc = cfg.train;
  const int B = tc.micro_batch, T = cfg.model.seq_len;
  // Data parallel: every rank runs this loop on its slice of each batch and
  // takes the same decisions; only rank 0 (the lead) writes files and logs.
  const bool lead = backend.rank() == 0;

  // ---- data, opened before anything in run_dir is touched: a run that cannot
  // start leaves no trace
  DataLoader train_data = open_data(cfg, /*train=*/true, backend.rank(), backend.world());
  DataLoader val_data = open_data(cfg, /*train=*/false, 0, 1);
  check_init_from(cfg.model);

  // ---- resume or start fresh (decided before anything in run_dir is written)
  if (options.resume == ResumeMode::require && !fs::is_directory(run_dir))
    throw ResumeError(run_dir + ": --resume given, but the run directory does not exist");
  if (std::error_code ec; fs::create_directories(run_dir, ec), ec)
    throw CheckpointError("cannot create the run directory " + run_dir + ": " + ec.message());
  std::optional<DirLock> lock;  // the lead writes the run directory; two runs on one would interleave
  if (lead) lock.emplace(run_dir);
  std::vector<std::string> passed_over;
  std::string resumed_dir;
  std::optional<Checkpoint> resume =
      checkpoint_to_resume(cfg, run_dir, options.resume, passed_over, lead, resumed_dir);
  const int64_t resumed_step = resume ? resume->state.step : -1;
  if (resume && resume->params.size() != backend.layout().total)
    throw CheckpointError("checkpoint of step " + std::to_string(resumed_step) + " holds " +
                          std::to_string(resume->params.size()) + " parameters; the model has " +
                          std::to_string(backend.layout().total));

  // ---- run directory and logs
  std::vector<spdlog::sink_ptr> sinks;  // none on the other ranks
  if (lead) {
    write_file_atomically(run_dir + "/config.json", [&](std::ostream& f) { f << cfg.effective.dump(2) << '\n'; });
    const std::string events = run_dir + "/events.log";
    if (!std::ofstream(events, std::ios::app)) fail_to_open(events);  // spdlog's own error starts with its words
    sinks = {std::make_shared<spdlog::sinks::stdout_color_sink_mt>(),
             std::make_shared<spdlog::sinks::basic_file_sink_mt>(events, !resume)};
  }
  spdlog::logger log("train", sinks.begin(), sinks.end());
  log.set_pattern("[%H:%M:%S] %v");
  log.flush_on(spdlog::level::info);
  for (const auto& p : passed_over) log.warn("passed over invalid checkpoint {}", p);

  const double fpt = flops_per_token(cfg.model);
  const double peak = backend.peak_flops() * backend.world();  // 0: unknown, no MFU
  log.info("run {} | backend {} | {} parameters | {} layers x {} dim x {} heads, T {} | attention {}",
           cfg.log.name, backend.name(), num_parameters(cfg.model), cfg.model.layers,
           cfg.model.dim, cfg.model.heads, T, describe_attention(cfg));
  log.info("data: train {} tokens, val {} tokens | {} tokens/step = {} x {} x {} accum x {} ranks | {} steps",
           train_data.num_tokens(), val_data.num_tokens(), tc.tokens_per_step, B, T,
           tc.grad_accum, backend.world(), tc.steps);
  if (backend.memory_bytes()) log.info("device memory reserved: {:.2f} GiB", backend.memory_bytes() / 1073741824.0);

  // ---- state: from the checkpoint, from a model file or directory, or fresh
  TrainState st;
  st.data_seed = tc.seed;
  if (resume) {
    st = resume->state;
    backend.set_params(resume->params);
    backend.set_adam_state(resume->adam_m, resume->adam_v);
    train_data.seek(st.data_epoch, st.data_cursor);
    log.info("resumed from checkpoint of step {} (epoch {}, batch {})", st.step, st.data_epoch, st.data_cursor);
    resume.reset();  // free the host copy
  } else if (!cfg.model.init_from.empty()) {
    const bool hf = is_model_dir(cfg.model.init_from);
    backend.set_params(hf ? params_from_hf_model(cfg.model.init_from, cfg.model)
                          : params_from_llmc_model(cfg.model.init_from, cfg.model));
    log.info("initialised from {} {}", hf ? "Hugging Face model directory" : "llm.c model file", cfg.model.init_from);
  }
  const double wall_before = st.wall_seconds;
  auto wall_now = [&] {
    return wall_before + std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  };

  std::ofstream metrics;  // stays closed on the other ranks: their rows go nowhere
  if (lead) metrics = open_csv(run_dir + "/metrics.csv", kMetricsHeader, resumed_step);
  std::ofstream diag;
  std::vector<int32_t> probe_in, probe_tg;
  if (cfg.log.diag_every > 0 && lead) {
    diag = open_csv(run_dir + "/diag.csv", kDiagHeader, resumed_step);
    val_data.reset();
    val_data.next(probe_in, probe_tg);  // the fixed probe batch: the first val batch
  }

  TrainResult result;
  result.resumed_from = resumed_step;
  result.last_checkpoint = resumed_dir;  // not latest_checkpoint() again: that re-hashes every checkpoint
  auto status_json = [&](const std::string& status) {
    return json{{"status", status},
                {"reason", result.reason},
                {"step", st.step},
                {"steps", tc.steps},
                {"tokens", st.step * tc.tokens_per_step},
                {"last_val_loss", st.last_val_loss},
                {"skipped", st.skipped},
                {"train_seconds", st.train_seconds},
                {"wall_seconds", wall_now()},
                {"checkpoint", result.last_checkpoint}};
  };
  auto finish = [&](RunStatus s) {
    result.status = s;
    result.diverged = s == RunStatus::diverged;
    result.steps_done = st.step;
    result.last_val_loss = st.last_val_loss;
    status.write(status_json(to_string(s)));
    return result;
  };
  auto save = [&] {
    st.data_epoch = train_data.epoch();
    st.data_cursor = train_data.cursor();
    st.wall_seconds = wall_now();
    Checkpoint ck{cfg.effective, st, {}, {}, {}};
    backend.get_params(ck.params);  // collective: the full state, every rank's shard gathered
    backend.get_adam_state(ck.adam_m, ck.adam_v);
    if (!lead) return;
    result.last_checkpoint = save_checkpoint(run_dir, ck, tc.keep_checkpoints);
    status.write(status_json("running"));
    log.info("checkpoint {}", result.last_checkpoint);
  };
  // nullopt when a stop request cut the evaluation short.
  auto evaluate = [&]() -> std::optional<double> {
    const auto val = mean_val_loss(backend, val_data, cfg.eval.batches, B, T, options.stop);
    if (val) st.last_val_loss = *val;
    return val;
  };
  auto stopped = [&](const std::string& reason) {
    result.reason = reason;
    log.warn("{}; resume with the same command", result.reason);
    return finish(RunStatus::interrupted);
  };
  status.write(status_json("running"));
  // The first stop signal is acknowledged at once; a second one ends the run
  // now, with status.json saying so.
  const StopListener listener(options.stop, [&](bool now) {
    if (!now) {
      log.warn("stop requested: stopping after the current step or evaluation, with a checkpoint; a second "
               "signal stops at once");
      return;
    }
    status.end("interrupted", "stopped at once by a second signal; resume continues from the newest checkpoint");
    log.warn("stopped at once by a second signal (no final checkpoint)");
  });

  if (resumed_step < 0) {  // step 0: the untrained model
    const auto val0 = evaluate();
    if (!val0) return stopped("stopped by a signal during the evaluation of step 0 (no checkpoint)");
    metrics << "0,0,,," << fmt::format("{:.6f}", *val0) << ",,,,,0,\n";
    metrics.flush();
    log.info("step 0 | val loss {:.4f}", *val0);
    if (diag.is_open())
      write_diag(diag, 0, backend.diagnostics(probe_in.data(), probe_tg.data(), B, T));
  }

  if (st.eval_pending) {  // the evaluation a stop request cut short, before the next step
    const auto val = evaluate();
    if (!val) return stopped(fmt::format("stopped by a signal during the evaluation of step {}", st.step));
    st.eval_pending = false;
    if (lead) {
      metrics.close();
      fill_cut_evaluation(run_dir + "/metrics.csv", st.step, *val);
      metrics.open(run_dir + "/metrics.csv", std::ios::app);
    }
    log.info("step {} | val loss {:.4f} (the evaluation a stop cut short)", st.step, *val);
  }

  const int64_t nan_step = injected_nan_step();
  const bool spike_rule = tc.spike_zscore > 0;
  double session_ms = 0;
  int64_t session_steps = 0;
  std::vector<int32_t> in, tg;
  for (int64_t step = st.step + 1; step <= tc.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = learning_rate(tc, step - 1);
    backend.zero_grad();
    double loss = 0;
    for (int micro = 0; micro < tc.grad_accum; ++micro) {
      train_data.next(in, tg);
      loss += backend.forward_backward(in.data(), tg.data(), B, T, 1.0f / tc.grad_accum);
    }
    loss /= tc.grad_accum;
    backend.sum_over_ranks(&loss, 1);  // every rank's slice: the global batch's loss
    loss /= backend.world();
    if (step == nan_step) loss = std::numeric_limits<double>::quiet_NaN();
    const double norm = backend.grad_norm();
    if (!std::isfinite(loss) || !std::isfinite(norm)) {
      result.reason = !std::isfinite(loss) ? fmt::format("non-finite train loss ({}) at step {}", loss, step)
                                           : fmt::format("non-finite grad norm ({}) at step {}", norm, step);
      metrics << step << ',' << step * tc.tokens_per_step << ',' << lr << ',' << loss << ",," << norm
              << ",,,," << st.skipped << ",diverged: " << result.reason << '\n';
      metrics.flush();
      log.error("diverged: {}; stopping (no update applied at step {}; last good checkpoint: {})",
                result.reason, step, result.last_checkpoint.empty() ? "none" : result.last_checkpoint);
      return finish(RunStatus::diverged);
    }

    // Loss-spike rule, then clip and AdamW (bias correction counts applied updates).
    const double z = spike_zscore(st, loss);
    const bool skip = spike_rule && z > tc.spike_zscore;
    observe_loss(st, loss);
    if (skip) {
      ++st.skipped;
    } else {
      const float grad_mult = (tc.grad_clip > 0 && norm > tc.grad_clip) ? static_cast<float>(tc.grad_clip / norm) : 1.0f;
      backend.adamw_step({static_cast<float>(lr), static_cast<float>(tc.beta1), static_cast<float>(tc.beta2),
                          static_cast<float>(tc.eps), static_cast<float>(tc.weight_decay)},
                         grad_mult, ++st.adam_t);
    }
    st.step = step;
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    session_ms += ms;
    ++session_steps;
    st.train_seconds += ms / 1000.0;
    const double tok_s = tc.tokens_per_step / (ms / 1000.0);
    const double mfu = peak > 0 ? fpt * tok_s / peak : 0.0;

    const bool eval_now = (cfg.eval.every > 0 && step % cfg.eval.every == 0) || step == tc.steps;
    const std::optional<double> evaluated = eval_now ? evaluate() : std::nullopt;
    const bool has_val = evaluated.has_value();
    const double val = has_val ? *evaluated : 0.0;
    st.eval_pending = eval_now && !has_val;
    std::string event = skip ? fmt::format("spike: update skipped (z = {:.2f})", z) : "";
    if (st.eval_pending) event += std::string(event.empty() ? "" : "; ") + kCutEvaluation;
    metrics << step << ',' << step * tc.tokens_per_step << ',' << fmt::format("{:.6g}", lr) << ','
            << fmt::format("{:.6f}", loss) << ',' << fmt_or_empty(has_val, val) << ','
            << fmt::format("{:.6f}", norm) << ',' << fmt::format("{:.2f}", ms) << ','
            << fmt::format("{:.0f}", tok_s) << ',' << fmt_or_empty(mfu > 0, mfu, "{:.4f}") << ','
            << st.skipped << ',' << event << '\n';
    metrics.flush();
    if (skip) log.warn("step {}: loss {:.4f} is {:.2f} sd above its running mean; update skipped", step, loss, z);
    if (diag.is_open() && step % cfg.log.diag_every == 0)
      write_diag(diag, step, backend.diagnostics(probe_in.data(), probe_tg.data(), B, T));
    if (step % cfg.log.every == 0 || eval_now) {  // eval_now holds at the last step
      const double left_s = session_ms / session_steps * (tc.steps - step) / 1000.0;
      log.info("step {:>6}/{} | loss {:.4f}{} | norm {:.3f} | lr {:.2e} | {:.1f} ms | {:.0f} tok/s{} | {:.0f}s left",
               step, tc.steps, loss, has_val ? fmt::format(" | val {:.4f}", val) : "", norm, lr, ms,
               tok_s, mfu > 0 ? fmt::format(" | MFU {:.1f}%", 100 * mfu) : "", left_s);
    }

    status.note(status_json("running"));
    bool stop = options.stop && options.stop->requested();
    if (backend.world() > 1) {  // a signal may reach the ranks at different steps: stop together
      double requests = stop ? 1.0 : 0.0;
      backend.sum_over_ranks(&requests, 1);
      stop = requests > 0;
    }
    if ((tc.checkpoint_every > 0 && step % tc.checkpoint_every == 0) || step == tc.steps || stop) save();
    if (stop && (step < tc.steps || st.eval_pending))
      return stopped(fmt::format("stopped by a signal after step {}{}", step,
                                 st.eval_pending ? " (its evaluation runs on resume)" : ""));
  }
  log.info("done: {} steps, final val loss {:.4f}, {:.1f} s in steps", st.step, st.last_val_loss, st.train_seconds);
  return finish(RunStatus::finished);
}

}  // namespace

TrainResult train(const Config& cfg, Backend& backend, const std::string& run_dir, const TrainOptions& options) {
  StatusFile status(run_dir, backend.rank() == 0);
  try {
    return run_training(cfg, backend, run_dir, options, status);
  } catch (const std::exception& e) {
    status.end("failed", e.what());  // a run that started ends in a final state
    throw;
  }
}

}  // namespace qattn
