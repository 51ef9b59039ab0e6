// qattn validate CONFIG [--set ...] [--nproc N]: prints the effective config
// (exit 0) or every error (exit 2). Checks what `qattn train` checks before
// step 0 except the device and the run directory: the config, both data globs
// (every shard read once: headers, sizes, token ids against model.vocab, one
// batch) and model.init_from.
#include <spdlog/spdlog.h>

#include <iostream>

#include "commands.hpp"
#include "checks.hpp"
#include "qattn/config.hpp"
#include "qattn/trainer.hpp"

namespace qattn::cli {

void add_validate_command(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> sets;
    int nproc = 1;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("validate", "Check a config and the data it names; print it with defaults filled in");
  cmd->add_option("config", args->config, "run config (JSON)")->required()->check(nonempty_path());
  cmd->add_option("--set", args->sets, "override a key: json.path=value (repeatable)");
  cmd->add_option("--nproc", args->nproc, "check for N data-parallel processes, as train --nproc N")
      ->check(integer_range(1, kMaxProcesses))
      ->capture_default_str();
  cmd->callback([args] {
    try {
      const Config cfg = load_config(args->config, args->sets, args->nproc);
      for (const auto& w : cfg.warnings) spdlog::warn("{}", w);
      check_run_inputs(cfg, args->nproc);
      std::cout << cfg.effective.dump(2) << '\n';
    } catch (const std::runtime_error& e) {
      if (!is_input_error(e)) throw;
      std::cerr << args->config << ": " << e.what() << '\n';
      throw CLI::RuntimeError(kExitBadInput);
    }
  });
}

}  // namespace qattn::cli
