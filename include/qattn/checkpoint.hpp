// Checkpoints: one directory per step under <run>/checkpoints/, e.g.
// checkpoints/step_00001200/ holding config.json (effective), params.bin,
// adam_m.bin, adam_v.bin (fp32, canonical ParamLayout order), state.json
// (step, data position, RNG, spike statistics, timers) and manifest.json.
//
// Crash safety: the files are written and fsync'ed into a hidden temporary
// directory, the manifest (byte size and checksum of every file) last, then
// the directory is renamed to its final name. A checkpoint is valid only when
// its manifest exists and every file matches it, so a process killed at any
// point never leaves a checkpoint that loads. The checksum is FNV-1a's 64-bit
// arithmetic over each file's 64-bit little-endian words (docs/runs.md).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "qattn/config.hpp"

namespace qattn {

struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What the training loop needs besides the tensors to continue bit-exactly.
struct TrainState {
  int64_t step = 0;              // optimizer steps done
  int64_t adam_t = 0;            // AdamW updates applied (bias correction; spikes skip it)
  int64_t data_epoch = 0;        // train DataLoader position (epoch, batch cursor)
  int64_t data_cursor = 0;
  uint64_t data_seed = 0;        // RNG: the data order is a function of (seed, epoch) alone
  int64_t skipped = 0;           // updates skipped by the loss-spike rule
  double spike_mean = 0;         // spike rule: EMA of the train loss and of its variance
  double spike_var = 0;
  int64_t spike_count = 0;       // losses seen by the EMA
  double last_val_loss = 0;
  bool eval_pending = false;     // the evaluation of `step` was cut short by a stop request: run it on resume
  double train_seconds = 0;      // time inside optimizer steps, all sessions
  double wall_seconds = 0;       // time of the whole run (evals, checkpoints), all sessions
};

struct Checkpoint {
  nlohmann::json config;         // the effective config of the run
  TrainState state;
  std::vector<float> params;     // fp32 master weights
  std::vector<float> adam_m, adam_v;
};

// <run_dir>/checkpoints
std::string checkpoint_root(const std::string& run_dir);

// Writes ck as <run_dir>/checkpoints/step_<step>/ (crash-safe, see above),
// then removes the oldest valid checkpoints beyond `keep` and any temporary
// directory a killed writer left. Returns the final directory.
std::string save_checkpoint(const std::string& run_dir, const Checkpoint& ck, int keep);

// Reads and verifies a checkpoint directory; throws CheckpointError naming the
// directory, the file and what is wrong.
Checkpoint load_checkpoint(const std::string& dir);

// Empty when dir is a valid checkpoint, else why not (sizes and checksums checked).
std::string checkpoint_problem(const std::string& dir);

// Checkpoint directories of a run, oldest first (valid or not).
std::vector<std::string> list_checkpoints(const std::string& run_dir);

// The newest valid checkpoint of a run, or "" when there is none; the reason
// each newer invalid one was passed over is appended to `passed_over`.
std::string latest_checkpoint(const std::string& run_dir,
                              std::vector<std::string>* passed_over = nullptr);

// An exclusive lock on a directory (flock on <dir>/.lock, which holds the
// owner's pid): one process writes a run (or runs a sweep) at a time. The
// kernel drops the lock when the process dies, however it dies. Throws
// CheckpointError naming the directory and the owner when it is taken.
class DirLock {
 public:
  explicit DirLock(const std::string& dir);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

// A checkpoint directory, or a run directory meaning its newest valid checkpoint.
std::string resolve_checkpoint(const std::string& checkpoint_or_run_dir);

// The keys in which two effective configs differ, as "json.path: saved -> current",
// ignoring those that do not change the training numerics (log.*, eval.every,
// train.checkpoint_every, train.keep_checkpoints, train.device).
std::vector<std::string> config_differences(const nlohmann::json& saved,
                                            const nlohmann::json& current);

// The run Config of a checkpoint's effective config (derived keys dropped
// before validation). Throws ConfigError.
Config config_of_checkpoint(const nlohmann::json& effective);

}  // namespace qattn
