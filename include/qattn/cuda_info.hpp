// The GPUs this process can see, for `qattn info` and for train.device = "auto".
// Without the CUDA build (QATTN_HAVE_CUDA undefined) there is no definition:
// callers guard their use with #ifdef QATTN_HAVE_CUDA.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace qattn {

struct GpuInfo {
  int index = 0;
  std::string name;        // "NVIDIA H200"
  int major = 0, minor = 0;  // compute capability
  int multiprocessors = 0;
  size_t total_bytes = 0;  // device memory
  size_t free_bytes = 0;
};

// Empty when there is no driver or no device (never throws).
std::vector<GpuInfo> list_gpus();

}  // namespace qattn
