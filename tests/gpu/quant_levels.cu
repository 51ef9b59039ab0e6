// Test aids for ψ on the device: the levels of (x, s) pairs both ways quant.cuh
// computes them (quantise_level by a reciprocal per scale, and
// quantise_level_by_division, the definition), for the pre-pass test; and the
// weights' scales from their amax as the kernels compute them
// (int8_operands.cuh's scales_of_amax), with the level amax itself gets.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "attention/sage/int8_operands.cuh"
#include "attention/sage/quant.cuh"

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

// Two rows per thread, as the kernels call it: amax[2i], amax[2i + 1].
__global__ void weight_scales_kernel(const float* amax, int n, float* scale, float* inv, int* top_level) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (2 * i >= n) return;
  const float a[2] = {amax[2 * i], 2 * i + 1 < n ? amax[2 * i + 1] : 0.0f};
  float s[2], r[2];
  cuda::flash::scales_of_amax(a, s, r);
  for (int k = 0; k < 2 && 2 * i + k < n; ++k) {
    scale[2 * i + k] = s[k];
    inv[2 * i + k] = r[k];
    // The level of amax as pack_s8x4 makes it (the low byte, as int8).
    top_level[2 * i + k] = static_cast<int8_t>(cuda::flash::pack_s8x4(a[k], 0.0f, 0.0f, 0.0f, r[k]) & 0xffu);
  }
}

}  // namespace

void weight_scales(const std::vector<float>& amax, std::vector<float>& scale, std::vector<float>& inv,
                   std::vector<int>& top_level) {
  const int n = static_cast<int>(amax.size());
  float *d_a, *d_s, *d_r;
  int* d_l;
  CUDA_CHECK(cudaMalloc(&d_a, n * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&d_s, n * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&d_r, n * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&d_l, n * sizeof(int)));
  CUDA_CHECK(cudaMemcpy(d_a, amax.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  weight_scales_kernel<<<(n / 2 + 256) / 256, 256>>>(d_a, n, d_s, d_r, d_l);
  CUDA_CHECK_LAUNCH();
  scale.resize(n);
  inv.resize(n);
  top_level.resize(n);
  CUDA_CHECK(cudaMemcpy(scale.data(), d_s, n * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(inv.data(), d_r, n * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(top_level.data(), d_l, n * sizeof(int), cudaMemcpyDeviceToHost));
  for (void* p : {static_cast<void*>(d_a), static_cast<void*>(d_s), static_cast<void*>(d_r), static_cast<void*>(d_l)})
    CUDA_CHECK(cudaFree(p));
}

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
