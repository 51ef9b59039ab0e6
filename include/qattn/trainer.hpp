// The training loop: config -> data -> backend -> steps -> metrics, with
// checkpoints, resume, divergence handling and the loss-spike rule.
#pragma once
#include <memory>
#include <stdexcept>
#include <string>

#include "qattn/backend.hpp"
#include "qattn/config.hpp"
#include "qattn/data.hpp"
#include "qattn/stop_request.hpp"

namespace qattn {

enum class RunStatus { finished, diverged, interrupted };
std::string to_string(RunStatus s);

struct TrainResult {
  RunStatus status = RunStatus::finished;
  int64_t steps_done = 0;
  double last_val_loss = 0;
  bool diverged = false;
  std::string reason;           // why the run stopped early ("" when it finished)
  int64_t resumed_from = -1;    // step of the checkpoint the run continued from (-1: fresh)
  std::string last_checkpoint;  // newest valid checkpoint when the run stopped ("" when none)
};

enum class ResumeMode {
  automatic,  // continue from the newest valid checkpoint when there is one
  require,    // as automatic, but a run directory without a checkpoint is an error
  fresh,      // delete the run's checkpoints and start from step 0
};

struct TrainOptions {
  ResumeMode resume = ResumeMode::automatic;
  // Requested (by SIGINT/SIGTERM) to stop after the current step, or during an
  // evaluation between two of its batches, with a final checkpoint; a second
  // request ends the run at once with status.json saying so. May be null.
  StopRequest* stop = nullptr;
};

// The run directory holds a checkpoint whose config differs from the one given
// (or --resume found none). The message names every differing key.
struct ResumeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Runs cfg on the backend, writing config.json, metrics.csv (step, tokens, lr,
// train_loss, val_loss, grad_norm, step_ms, tokens_per_s, mfu, skipped, event),
// diag.csv, events.log, status.json and checkpoints/ into run_dir. On resume
// the rows after the checkpoint's step are dropped and the run continues
// bit-exactly. Console progress goes through spdlog. The data and
// model.init_from are checked before run_dir is touched; once status.json was
// written, it ends in a final state (finished, diverged, interrupted, or
// failed when an exception leaves, which is then rethrown).
TrainResult train(const Config& cfg, Backend& backend, const std::string& run_dir,
                  const TrainOptions& options = {});

// The loader of data.train (train = true: shuffled, this rank's slice of
// world) or data.val, every shard validated and its token ids checked against
// model.vocab, and data.val holding eval.batches batches; throws DataError
// naming the key, the glob and the shard at fault.
DataLoader open_data(const Config& cfg, bool train, int rank, int world);

// What train checks before step 0 that needs neither a backend nor the run
// directory, without holding the data: both data globs (every shard read once;
// data.val holding eval.batches batches) and model.init_from (an llm.c file
// from its header, a Hugging Face directory read whole). Throws DataError /
// LlmcError / HfError naming the key.
void check_run_inputs(const Config& cfg, int world);

// The run directory a config writes to: log.out / log.name.
std::string run_directory(const Config& cfg);

// Exit codes of `qattn train` (the sweep reads them).
constexpr int kExitDiverged = 3;
constexpr int kExitInterrupted = 4;

}  // namespace qattn
