// Each subcommand of `qattn` lives in its own file and registers itself here.
#pragma once
#include <CLI/CLI.hpp>

namespace qattn::cli {

void add_train_command(CLI::App& app);
void add_validate_command(CLI::App& app);
void add_info_command(CLI::App& app);
void add_probe_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_detokenize_command(CLI::App& app);
void add_sweep_command(CLI::App& app);
void add_sample_command(CLI::App& app);
void add_export_command(CLI::App& app);

}  // namespace qattn::cli
