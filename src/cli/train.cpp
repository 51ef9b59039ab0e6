// qattn train CONFIG [--set json.path=value ...] [--out DIR] [--resume | --fresh] [--nproc N]
// Exit codes: 0 finished, 1 error, 2 bad arguments, config, data or
// model.init_from, or a resume mismatch, 3 diverged, 4 stopped by
// SIGINT/SIGTERM.
#include <spdlog/spdlog.h>

#include "backend_select.hpp"
#include "checks.hpp"
#include "commands.hpp"
#include "distributed.hpp"
#include "qattn/trainer.hpp"
#include "stop_signal.hpp"

namespace qattn::cli {

void add_train_command(CLI::App& app) {
  struct Args {
    std::string config, out;
    std::vector<std::string> sets;
    bool resume = false, fresh = false;
    int nproc = 0;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("train", "Train a GPT from a JSON config");
  cmd->add_option("config", args->config, "run config (JSON)")->required()->check(nonempty_path());
  cmd->add_option("--set", args->sets, "override a key: json.path=value (repeatable)");
  cmd->add_option("--out", args->out, "run directory (default: log.out/log.name)")->check(nonempty_path());
  auto* resume = cmd->add_flag("--resume", args->resume,
                               "continue from the run's newest valid checkpoint (an error when there is "
                               "none); without it a run resumes when it has one and its config matches");
  cmd->add_flag("--fresh", args->fresh, "delete the run's checkpoints and start from step 0")->excludes(resume);
  cmd->add_option("--nproc", args->nproc,
                  "start N processes on this node, one per GPU: data parallel over NCCL (docs/distributed.md)")
      ->check(integer_range(1, kMaxProcesses));
  cmd->callback([args] {
    // A worker of a launcher (ours, torchrun, Slurm, mpirun) knows its rank from the environment.
    const std::optional<DistEnv> env = args->nproc > 0 ? std::nullopt : distributed_env();
    const int world = args->nproc > 0 ? args->nproc : env ? env->world : 1;
    Config cfg;
    try {
      cfg = load_config(args->config, args->sets, world);
    } catch (const ConfigError& e) {
      spdlog::error("{}: {}", args->config, e.what());
      throw CLI::RuntimeError(kExitBadInput);
    }
    for (const auto& w : cfg.warnings) spdlog::warn("{}", w);
    if (args->nproc > 0) {
      std::vector<std::string> worker = {"train", args->config};
      for (const auto& s : args->sets) worker.insert(worker.end(), {"--set", s});
      if (!args->out.empty()) worker.insert(worker.end(), {"--out", args->out});
      if (args->resume) worker.push_back("--resume");
      if (args->fresh) worker.push_back("--fresh");
      if (const int rc = launch_train_workers(cfg, args->nproc, worker)) throw CLI::RuntimeError(rc);
      return;
    }
    auto backend = make_rank_backend(cfg, env);
    const std::string dir = args->out.empty() ? run_directory(cfg) : args->out;
    TrainOptions options;
    options.resume = args->resume ? ResumeMode::require : args->fresh ? ResumeMode::fresh : ResumeMode::automatic;
    options.stop = &install_stop_handlers();
    TrainResult r;
    try {
      r = train(cfg, *backend, dir, options);
    } catch (const ResumeError& e) {
      spdlog::error("{}", e.what());
      throw CLI::RuntimeError(kExitBadInput);
    } catch (const std::runtime_error& e) {
      if (!is_input_error(e)) throw;
      spdlog::error("{}: {}", args->config, e.what());
      throw CLI::RuntimeError(kExitBadInput);
    }
    if (r.status == RunStatus::diverged) {
      spdlog::error("run diverged: {} (metrics in {}/metrics.csv, last good checkpoint: {})", r.reason, dir,
                    r.last_checkpoint.empty() ? "none" : r.last_checkpoint);
      throw CLI::RuntimeError(kExitDiverged);
    }
    if (r.status == RunStatus::interrupted) throw CLI::RuntimeError(kExitInterrupted);
  });
}

}  // namespace qattn::cli
