// qattn export --checkpoint DIR --out FILE [--dtype fp32|bf16]: a checkpoint's
// weights as an llm.c model file (GPT-2 configs without QK-norm). The reverse
// direction is the config key model.init_from.
#include <spdlog/spdlog.h>

#include "commands.hpp"
#include "qattn/checkpoint.hpp"
#include "qattn/llmc_model.hpp"

namespace qattn::cli {

void add_export_command(CLI::App& app) {
  struct Args {
    std::string checkpoint, out, dtype = "fp32";
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("export", "Write a checkpoint's weights as an llm.c model file");
  cmd->add_option("--checkpoint", args->checkpoint, "checkpoint directory, or a run directory (its newest checkpoint)")
      ->required();
  cmd->add_option("--out", args->out, "llm.c model file to write (e.g. gpt2_124M.bin)")->required();
  cmd->add_option("--dtype", args->dtype, "fp32 (llm.c version 3) or bf16 (version 5)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  cmd->callback([args] {
    const std::string dir = resolve_checkpoint(args->checkpoint);
    const Checkpoint ck = load_checkpoint(dir);
    const Config cfg = config_of_checkpoint(ck.config);
    write_llmc_model(args->out, cfg.model, ck.params, args->dtype == "fp32" ? kLlmcVersionFp32 : kLlmcVersionBf16);
    spdlog::info("wrote {} ({}, step {} of {})", args->out, args->dtype, ck.state.step, dir);
  });
}

}  // namespace qattn::cli
