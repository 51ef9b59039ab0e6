#include "global_norm.cuh"

namespace qattn::cuda {

namespace {
constexpr int kBlocks = 1024;  // fixed, so the summation order never depends on the device
constexpr int kThreads = 512;
}  // namespace

__global__ void norm_partial_kernel(float* partials, const float* x, size_t n) {
  __shared__ float scratch[32];
  float acc = 0.0f;
  for (size_t i = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<size_t>(kBlocks) * kThreads) {
    acc += x[i] * x[i];
  }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void norm_final_kernel(float* out, const float* partials) {
  __shared__ float scratch[32];
  float acc = 0.0f;
  for (int i = threadIdx.x; i < kBlocks; i += kThreads) acc += partials[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) *out = acc;
}

size_t global_norm_scratch_floats() { return kBlocks; }

void global_norm_squared(float* out, const float* x, size_t n, float* scratch,
                         cudaStream_t stream) {
  norm_partial_kernel<<<kBlocks, kThreads, 0, stream>>>(scratch, x, n);
  CUDA_CHECK_LAUNCH();
  norm_final_kernel<<<1, kThreads, 0, stream>>>(out, scratch);
  CUDA_CHECK_LAUNCH();
}

}  // namespace qattn::cuda
