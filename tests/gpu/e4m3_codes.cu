// Test aid for the e4m3 conversion: CUDA's own float -> e4m3 codes, from the
// device instruction (cvt.rn.satfinite.e4m3x2.f32, through __nv_cvt_float2_to_fp8x2)
// and from the host converter of <cuda_fp8.h>, to hold src/cpu/attention/e4m3.hpp to.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "common.cuh"

// e4m3_codes is declared in gpu_test_util.hpp, not included here so that
// Catch2 stays out of nvcc.
namespace qattn::test {
namespace {

__global__ void e4m3_codes_kernel(const float* x, int n, uint8_t* codes) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (2 * i >= n) return;
  const float2 pair = make_float2(x[2 * i], 2 * i + 1 < n ? x[2 * i + 1] : 0.0f);
  const __nv_fp8x2_storage_t two = __nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E4M3);
  codes[2 * i] = static_cast<uint8_t>(two & 0xffu);  // .x is the low byte
  if (2 * i + 1 < n) codes[2 * i + 1] = static_cast<uint8_t>(two >> 8);
}

}  // namespace

void e4m3_codes(const std::vector<float>& x, std::vector<uint8_t>& on_device,
                std::vector<uint8_t>& on_host) {
  const int n = static_cast<int>(x.size());
  float* d_x;
  uint8_t* d_c;
  CUDA_CHECK(cudaMalloc(&d_x, n * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&d_c, n));
  CUDA_CHECK(cudaMemcpy(d_x, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  e4m3_codes_kernel<<<(n / 2 + 256) / 256, 256>>>(d_x, n, d_c);
  CUDA_CHECK_LAUNCH();
  on_device.resize(n);
  CUDA_CHECK(cudaMemcpy(on_device.data(), d_c, n, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaFree(d_x));
  CUDA_CHECK(cudaFree(d_c));
  on_host.resize(n);
  for (int i = 0; i < n; ++i)
    on_host[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(x[i], __NV_SATFINITE, __NV_E4M3));
}

}  // namespace qattn::test
