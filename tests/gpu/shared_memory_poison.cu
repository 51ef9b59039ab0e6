// A test aid: every SM's shared memory filled with 0x7F bytes (bf16 ~3.4e38),
// so that a kernel reading a tile before its copy lands reads those rather than
// a previous block's finite tile of the same layout.
#include <cuda_runtime.h>

#include "common.cuh"

// poison_shared_memory is declared in gpu_test_util.hpp, not included here so
// that Catch2 stays out of nvcc.
namespace qattn::test {
namespace {

__global__ void fill_shared_memory(int bytes) {
  extern __shared__ unsigned char smem[];
  for (int i = threadIdx.x; i < bytes; i += blockDim.x) smem[i] = 0x7F;
}

}  // namespace

void poison_shared_memory() {
  int device = 0, bytes = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_CHECK(cudaFuncSetAttribute(fill_shared_memory, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  fill_shared_memory<<<4 * sms, 1024, bytes>>>(bytes);  // one block per SM at a time: every SM, several times
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace qattn::test
