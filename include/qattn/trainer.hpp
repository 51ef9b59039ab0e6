// The training loop: config -> data -> backend -> steps -> metrics.
#pragma once
#include <memory>
#include <string>

#include "qattn/backend.hpp"
#include "qattn/config.hpp"

namespace qattn {

struct TrainResult {
  int64_t steps_done = 0;
  double last_val_loss = 0;
  bool diverged = false;
  std::string reason;  // why the run stopped early ("" when it finished)
};

// Runs cfg on the backend, writing config.json, metrics.csv, diag.csv and
// events.log into run_dir. Console progress goes through spdlog.
TrainResult train(const Config& cfg, Backend& backend, const std::string& run_dir);

// The run directory a config writes to: log.out / log.name.
std::string run_directory(const Config& cfg);

}  // namespace qattn
