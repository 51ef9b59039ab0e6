// qattn export --checkpoint DIR --out PATH [--format llmc|hf] [--dtype fp32|bf16]:
// a checkpoint's weights as an llm.c model file (the default) or as a Hugging
// Face GPT-2 directory (config.json + model.safetensors) that transformers'
// GPT2LMHeadModel.from_pretrained loads. GPT-2 configs without QK-norm only.
// The reverse direction is the config key model.init_from, which reads both.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "checks.hpp"
#include "commands.hpp"
#include "qattn/checkpoint.hpp"
#include "qattn/hf_model.hpp"
#include "qattn/llmc_model.hpp"

namespace qattn::cli {

void add_export_command(CLI::App& app) {
  struct Args {
    std::string checkpoint, out, format = "llmc", dtype = "fp32";
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "export", "Write a checkpoint's weights as an llm.c model file or a Hugging Face GPT-2 directory");
  cmd->add_option("--checkpoint", args->checkpoint, "checkpoint directory, or a run directory (its newest checkpoint)")
      ->required()
      ->check(nonempty_path());
  cmd->add_option("--out", args->out, "llmc: the model file to write (e.g. gpt2_124M.bin); hf: the directory")
      ->required()
      ->check(nonempty_path());
  cmd->add_option("--format", args->format, "llmc (llm.c's model file) or hf (config.json + model.safetensors)")
      ->check(CLI::IsMember({"llmc", "hf"}))
      ->capture_default_str();
  cmd->add_option("--dtype", args->dtype, "fp32 or bf16 (llmc: version 3 or 5; hf: F32 or BF16 tensors)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  cmd->callback([args] {
    const std::string dir = resolve_checkpoint(args->checkpoint);
    const Checkpoint ck = load_checkpoint(dir);
    const Config cfg = config_of_checkpoint(ck.config);
    const bool fp32 = args->dtype == "fp32";
    if (args->format == "llmc") {
      write_llmc_model(args->out, cfg.model, ck.params, fp32 ? kLlmcVersionFp32 : kLlmcVersionBf16);
    } else {
      // transformers runs exact attention whatever kind trained the weights;
      // the metadata keeps which one did.
      write_hf_model(args->out, cfg.model, ck.params, fp32 ? TensorDtype::f32 : TensorDtype::bf16,
                     {{"qattn.step", std::to_string(ck.state.step)},
                      {"qattn.attention", ck.config["attention"].dump()}});
      const auto layers = cfg.attention_per_layer();
      if (std::any_of(layers.begin(), layers.end(), [](const auto& a) { return a.kind != AttentionKind::fpa; }))
        spdlog::info("the run trained with quantised attention; transformers evaluates it with exact attention");
    }
    spdlog::info("wrote {} ({} {}, step {} of {})", args->out, args->format, args->dtype, ck.state.step, dir);
  });
}

}  // namespace qattn::cli
