// A test aid: ψ's levels of (x, s) pairs on the device, both ways quant.cuh
// computes them (quantise_level by a reciprocal per scale, and
// quantise_level_by_division, the definition), for the pre-pass test.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "attention/quant.cuh"

// quant_levels is declared in gpu_test_util.hpp, not included here so that
// Catch2 stays out of nvcc.
namespace qattn::test {
namespace {

__global__ void levels_kernel(const float* x, const float* s, int n, uint32_t* by_reciprocal,
                              uint32_t* by_division) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  by_reciprocal[i] = cuda::quantise_level(x[i], s[i], __frcp_rn(s[i]));
  by_division[i] = cuda::quantise_level_by_division(x[i], s[i]);
}

}  // namespace

void quant_levels(const std::vector<float>& x, const std::vector<float>& s, std::vector<uint32_t>& by_reciprocal,
                  std::vector<uint32_t>& by_division) {
  const int n = static_cast<int>(x.size());
  float *d_x, *d_s;
  uint32_t *d_r, *d_d;
  CUDA_CHECK(cudaMalloc(&d_x, n * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&d_s, n * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&d_r, n * sizeof(uint32_t)));
  CUDA_CHECK(cudaMalloc(&d_d, n * sizeof(uint32_t)));
  CUDA_CHECK(cudaMemcpy(d_x, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_s, s.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  levels_kernel<<<(n + 255) / 256, 256>>>(d_x, d_s, n, d_r, d_d);
  CUDA_CHECK_LAUNCH();
  by_reciprocal.resize(n);
  by_division.resize(n);
  CUDA_CHECK(cudaMemcpy(by_reciprocal.data(), d_r, n * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(by_division.data(), d_d, n * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  for (void* p : {static_cast<void*>(d_x), static_cast<void*>(d_s), static_cast<void*>(d_r), static_cast<void*>(d_d)})
    CUDA_CHECK(cudaFree(p));
}

}  // namespace qattn::test
