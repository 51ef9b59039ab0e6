// Each subcommand of `qattn` lives in its own file and registers itself here.
#pragma once
#include <CLI/CLI.hpp>

namespace qattn::cli {

void add_train_command(CLI::App& app);
void add_validate_command(CLI::App& app);
void add_info_command(CLI::App& app);
void add_probe_command(CLI::App& app);

}  // namespace qattn::cli
