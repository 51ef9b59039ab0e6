// Sweeps: a base config, a grid of overrides by JSON path, zipped lists,
// seeds and baselines, expanded into runs with stable ids; and the summary of
// their outcomes (summary.csv, summary.md). `qattn sweep` (src/cli/sweep.cpp)
// runs them. A sweep file:
//   {
//     "name": "kinds",                         runs/<name>/<run id>/
//     "base": "../quickstart.json",            relative to the sweep file
//     "out": "runs",                           optional, default "runs"
//     "set": {"train.steps": 200},             optional, every run
//     "grid": {"attention.kind": ["fpa", "kinterval"]},          product of the lists
//     "zip": [{"attention.kinterval.K": [8, 16], "train.lr": [1e-3, 2e-3],  lists advanced together
//              "label": ["K8", "K16"]}],        optional: what a reader sees per position
//     "seeds": [1, 2, 3],                      optional, train.seed
//     "baseline": {"set": {"attention.kind": "fpa"}, "match": ["train.tokens_per_step"]},
//     "eval_last": 3                           final val loss = mean of the last 3 evaluations
//   }
// The baseline of a run is the run with the baseline's `set` applied and the
// same values of the `match` keys (default: every varied key the baseline does
// not set) and the same seed; such runs are added to the sweep when the grid
// does not hold them.
#pragma once
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace qattn {

struct SweepError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct SweepRun {
  std::string id;             // stable, from the overrides: "kind=fpa_tokens_per_step=4096_seed=2"
  std::string setting;        // the id without the seed: runs that differ only in seed share it
  nlohmann::json overrides;   // {"json.path": value}: the grid, zip and seed values of this run
  bool is_baseline = false;
  std::string baseline;       // setting of this run's baseline ("" when it is one or there is none)
  std::string label;          // the setting as a reader sees it: "2: minmax, nearest, K=4" (unique per setting)
};

struct Sweep {
  std::string name;
  std::string base;             // base config path, resolved against the sweep file's folder
  std::string out = "runs";
  nlohmann::json set = nlohmann::json::object();  // overrides every run gets
  int eval_last = 1;
  std::vector<std::string> keys;  // the override paths that vary, seeds last
  std::vector<SweepRun> runs;
  std::string dir() const;      // out/name
};

// Parses, validates (errors name the JSON path, the value and what is allowed)
// and expands. Throws SweepError.
Sweep load_sweep(const std::string& path);
Sweep expand_sweep(const nlohmann::json& j, const std::string& source);

// The stable id of a set of overrides: "name=value" per key in key order, the
// last path component as the name (the full path where two share it), the
// seed last; "base" when empty; long ids end in a hash of the overrides.
std::string run_id(const nlohmann::json& overrides);

// The `qattn train --set` assignments of a run: the sweep's set, the run's
// overrides, and log.out / log.name placing it at <sweep dir>/<id>.
std::vector<std::string> train_assignments(const Sweep& s, const SweepRun& r);

struct RunOutcome {
  // pending (no run directory) | incomplete (started, never ended cleanly) |
  // finished | diverged | interrupted | failed
  std::string status = "pending";
  std::string reason;
  int64_t steps = 0, tokens = 0, skipped = 0;
  // Mean of the last eval_last evaluations after step 0 (step 0's alone when
  // there is no other); NaN unless the run finished or diverged.
  double final_val_loss = std::numeric_limits<double>::quiet_NaN();
  double last_val_loss = std::numeric_limits<double>::quiet_NaN();  // the newest evaluation
  int64_t last_val_step = -1;                                        // its step (-1: none)
  double train_seconds = 0, wall_seconds = 0;
  double tokens_per_s() const { return train_seconds > 0 ? tokens / train_seconds : 0.0; }
};

// status.json and metrics.csv of one run directory.
RunOutcome read_outcome(const std::string& run_dir, int eval_last);

// Mean of the last `count` values (all of them when fewer).
double mean_of_last(const std::vector<double>& xs, int count);

// A gap paired by seed: the final val loss of a run minus its baseline's with
// the same seed, over the seeds where both finished. The interval is Student's
// t at 95% over those n differences (n - 1 degrees of freedom); the gap is
// significant when the interval excludes 0 (docs/reproducing.md).
struct PairedGap {
  int n = 0;
  double mean = std::numeric_limits<double>::quiet_NaN();
  double std = std::numeric_limits<double>::quiet_NaN();  // sample std (n - 1); NaN for n < 2
  double ci_low = std::numeric_limits<double>::quiet_NaN(), ci_high = std::numeric_limits<double>::quiet_NaN();
  bool significant() const { return n >= 2 && (ci_low > 0 || ci_high < 0); }
};
PairedGap paired_gap(const std::vector<double>& differences);

// The 97.5% quantile of Student's t with `df` degrees of freedom (df >= 1).
double student_t_975(int df);

struct SettingStats {
  std::string setting, baseline, label;
  int runs = 0, finished = 0, diverged = 0;
  double mean = std::numeric_limits<double>::quiet_NaN();  // over finished runs' final val loss
  double std = std::numeric_limits<double>::quiet_NaN();   // sample std (n - 1); NaN for n < 2
  double gap = std::numeric_limits<double>::quiet_NaN();   // mean - baseline's mean, nats
  PairedGap paired;                                        // by seed, against the baseline
};

// Per setting, in the order settings first appear in s.runs.
std::vector<SettingStats> setting_stats(const Sweep& s, const std::vector<RunOutcome>& outcomes);

// Final val loss of run i minus that of its baseline run with the same seed (NaN when unknown).
double run_gap(const Sweep& s, const std::vector<RunOutcome>& outcomes, size_t i);

// Writes <sweep dir>/summary.csv and summary.md; returns the markdown.
std::string write_summary(const Sweep& s, const std::vector<RunOutcome>& outcomes);

}  // namespace qattn
