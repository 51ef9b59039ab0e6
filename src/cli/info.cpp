// qattn info: build, backends, devices.
#include <iostream>

#include "commands.hpp"

#ifdef QATTN_HAVE_CUDA
#include "qattn/cuda_info.hpp"
#endif

namespace qattn::cli {

void add_info_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("info", "Show the build, its backends and the visible devices");
  cmd->callback([] {
    std::cout << "qattn, built " << __DATE__ << " with " << __VERSION__ << "\n";
#ifdef QATTN_HAVE_CUDA
    std::cout << "backends: cpu, cuda\n";
    const auto gpus = list_gpus();
    if (gpus.empty()) std::cout << "GPUs: none visible (train.device \"auto\" uses the CPU)\n";
    for (const auto& g : gpus)
      std::cout << "GPU " << g.index << ": " << g.name << ", compute capability " << g.major << "."
                << g.minor << ", " << g.multiprocessors << " SMs, "
                << g.total_bytes / 1073741824.0 << " GiB (" << g.free_bytes / 1073741824.0
                << " GiB free)\n";
#else
    std::cout << "backends: cpu (built without CUDA: configure with -DQATTN_CUDA=ON where nvcc exists)\n";
#endif
  });
}

}  // namespace qattn::cli
