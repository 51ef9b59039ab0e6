// qattn train CONFIG [--set json.path=value ...] [--out DIR]
#include <spdlog/spdlog.h>

#include "backend_select.hpp"
#include "commands.hpp"
#include "qattn/trainer.hpp"

namespace qattn::cli {

void add_train_command(CLI::App& app) {
  struct Args {
    std::string config, out;
    std::vector<std::string> sets;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("train", "Train a GPT from a JSON config");
  cmd->add_option("config", args->config, "run config (JSON)")->required();
  cmd->add_option("--set", args->sets, "override a key: json.path=value (repeatable)");
  cmd->add_option("--out", args->out, "run directory (default: log.out/log.name)");
  cmd->callback([args] {
    Config cfg;
    try {
      cfg = load_config(args->config, args->sets);
    } catch (const ConfigError& e) {
      spdlog::error("{}: {}", args->config, e.what());
      throw CLI::RuntimeError(2);
    }
    for (const auto& w : cfg.warnings) spdlog::warn("{}", w);
    auto backend = make_backend(cfg);
    const std::string dir = args->out.empty() ? run_directory(cfg) : args->out;
    const TrainResult r = train(cfg, *backend, dir);
    if (r.diverged) {
      spdlog::error("run diverged: {} (metrics in {}/metrics.csv)", r.reason, dir);
      throw CLI::RuntimeError(3);
    }
  });
}

}  // namespace qattn::cli
