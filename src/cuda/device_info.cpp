#include <cuda_runtime.h>

#include "qattn/cuda_info.hpp"

namespace qattn {

std::vector<GpuInfo> list_gpus() {
  std::vector<GpuInfo> gpus;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error for later callers
    return gpus;
  }
  int current = 0;
  cudaGetDevice(&current);
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    GpuInfo g;
    g.index = i;
    g.name = prop.name;
    g.major = prop.major;
    g.minor = prop.minor;
    g.multiprocessors = prop.multiProcessorCount;
    g.total_bytes = prop.totalGlobalMem;
    if (cudaSetDevice(i) == cudaSuccess) cudaMemGetInfo(&g.free_bytes, &g.total_bytes);
    gpus.push_back(g);
  }
  cudaSetDevice(current);
  return gpus;
}

}  // namespace qattn
