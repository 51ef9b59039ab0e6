// qattn info: build, backends, devices.
#include <iostream>

#include "backend_select.hpp"
#include "commands.hpp"

#ifdef QATTN_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace qattn::cli {

void add_info_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("info", "Show the build, its backends and the visible devices");
  cmd->callback([] {
    std::cout << "qattn (" << __DATE__ << ", " << (sizeof(void*) * 8) << "-bit)\n";
    std::cout << "backends: cpu";
#ifdef QATTN_HAVE_CUDA
    std::cout << ", cuda\n";
    const int n = cuda_device_count();
    if (n == 0) std::cout << "GPUs: none visible\n";
    for (int i = 0; i < n; ++i) {
      cudaDeviceProp p{};
      cudaGetDeviceProperties(&p, i);
      std::cout << "GPU " << i << ": " << p.name << ", compute capability " << p.major << "."
                << p.minor << ", " << p.totalGlobalMem / (1024.0 * 1024 * 1024) << " GiB, "
                << p.multiProcessorCount << " SMs\n";
    }
#else
    std::cout << " (built without CUDA)\n";
#endif
  });
}

}  // namespace qattn::cli
