// qattn: one executable, one subcommand per file in src/cli/.
#include <spdlog/spdlog.h>

#include <exception>

#include "commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"qattn: GPT pre-training with low-bit attention (FPA, SageBwd INT8, K-interval)"};
  app.require_subcommand(1);
  qattn::cli::add_train_command(app);
  qattn::cli::add_validate_command(app);
  qattn::cli::add_info_command(app);
  qattn::cli::add_probe_command(app);
  qattn::cli::add_bench_command(app);
  qattn::cli::add_tokenize_command(app);
  qattn::cli::add_detokenize_command(app);
  qattn::cli::add_sweep_command(app);
  qattn::cli::add_sample_command(app);
  qattn::cli::add_export_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  return 0;
}
