#include "backend_select.hpp"

#include <stdexcept>

#ifdef QATTN_HAVE_CUDA
#include "qattn/cuda_info.hpp"
#endif

namespace qattn::cli {

int cuda_device_count() {
#ifdef QATTN_HAVE_CUDA
  return static_cast<int>(list_gpus().size());
#else
  return 0;
#endif
}

std::unique_ptr<Backend> make_backend(const Config& cfg) {
  const std::string& d = cfg.train.device;
  const bool want_cuda = d == "cuda" || (d == "auto" && cuda_device_count() > 0);
  if (!want_cuda) return make_cpu_backend(cfg);
#ifdef QATTN_HAVE_CUDA
  if (cuda_device_count() == 0)
    throw std::runtime_error("train.device: \"cuda\" but no CUDA device is visible; "
                             "use \"cpu\" or \"auto\" on this machine");
  return make_cuda_backend(cfg);
#else
  throw std::runtime_error("train.device: \"cuda\" but this qattn was built without the CUDA "
                           "backend (configure with -DQATTN_CUDA=ON where nvcc exists); "
                           "use \"cpu\" or \"auto\"");
#endif
}

}  // namespace qattn::cli
