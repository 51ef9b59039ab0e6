#include "distributed.hpp"

#include <spdlog/spdlog.h>

#ifdef QATTN_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "backend_select.hpp"

namespace qattn::cli {

namespace {

// The visible GPUs, counted without creating a context on any of them (the
// launcher and every worker would otherwise hold memory on every GPU).
int visible_gpus() {
  int n = 0;
#ifdef QATTN_HAVE_CUDA
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
#endif
  return n;
}

bool uses_cuda(const Config& cfg) {
  return cfg.train.device == "cuda" || (cfg.train.device == "auto" && visible_gpus() > 0);
}

}  // namespace

std::optional<DistEnv> distributed_env() {
  std::optional<DistEnv> env = dist_env_from();
  if (env && env->world > 1)
    spdlog::set_pattern(fmt::format("[%Y-%m-%d %H:%M:%S.%e] [rank {}] [%^%l%$] %v", env->rank));
  return env;
}

int launch_train_workers(const Config& cfg, int nproc, const std::vector<std::string>& worker_args) {
  if (const auto outer = dist_env_from())
    throw DistError("--nproc " + std::to_string(nproc) + " inside a " + outer->source +
                    " job (rank variables are set): the launcher already started one process per "
                    "GPU; drop --nproc");
  if (!uses_cuda(cfg))
    throw DistError("--nproc " + std::to_string(nproc) + ": several processes need the CUDA backend, but "
                    "train.device = \"" + cfg.train.device + "\" resolves to the CPU here");
  if (visible_gpus() < nproc)
    throw DistError("--nproc " + std::to_string(nproc) + " but " + std::to_string(visible_gpus()) +
                    " GPU(s) are visible; allowed: --nproc <= the visible GPUs (CUDA_VISIBLE_DEVICES)");
  LaunchOptions o;
  o.nproc = nproc;
  o.argv = {"/proc/self/exe"};
  o.argv.insert(o.argv.end(), worker_args.begin(), worker_args.end());
  return launch_workers(o);
}

std::unique_ptr<Backend> make_rank_backend(const Config& cfg, const std::optional<DistEnv>& env) {
  if (!env || (env->world == 1 && !uses_cuda(cfg))) return make_backend(cfg);
  if (!uses_cuda(cfg))
    throw DistError("rank " + std::to_string(env->rank) + " of " + std::to_string(env->world) +
                    ": several processes need the CUDA backend, but train.device = \"" + cfg.train.device +
                    "\" resolves to the CPU here");
#ifdef QATTN_HAVE_CUDA
  return make_cuda_backend(cfg, *env);
#else
  throw DistError("rank " + std::to_string(env->rank) + ": this qattn was built without the CUDA backend");
#endif
}

}  // namespace qattn::cli
