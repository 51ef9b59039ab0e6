// qattn validate CONFIG [--set ...]: prints the effective config (exit 0) or every error (exit 2).
#include <spdlog/spdlog.h>

#include <iostream>

#include "commands.hpp"
#include "qattn/config.hpp"

namespace qattn::cli {

void add_validate_command(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> sets;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("validate", "Check a config; print it with defaults filled in");
  cmd->add_option("config", args->config, "run config (JSON)")->required();
  cmd->add_option("--set", args->sets, "override a key: json.path=value (repeatable)");
  cmd->callback([args] {
    try {
      const Config cfg = load_config(args->config, args->sets);
      for (const auto& w : cfg.warnings) spdlog::warn("{}", w);
      std::cout << cfg.effective.dump(2) << '\n';
    } catch (const ConfigError& e) {
      std::cerr << args->config << ": " << e.what() << '\n';
      throw CLI::RuntimeError(2);
    }
  });
}

}  // namespace qattn::cli
