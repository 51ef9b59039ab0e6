// What the tile-shape sweeps (tools/dev/attention_tiles.cu, tools/dev/sage_tiles.cu)
// share: random normal inputs made on the device, and the median time of a
// piece of GPU work by CUDA events.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "common.cuh"

namespace qattn::cuda::tiles {

// Normal(0, 1) from a counter hash (Box-Muller), as bf16.
__global__ void fill_normal(__nv_bfloat16* x, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    unsigned a = static_cast<unsigned>(i) * 2654435761u ^ seed, b = a * 1664525u + 1013904223u;
    a ^= a >> 13, a *= 0x5bd1e995u, a ^= a >> 15;
    b ^= b >> 13, b *= 0x5bd1e995u, b ^= b >> 15;
    const float u1 = (a + 1.0f) / 4294967296.0f, u2 = b / 4294967296.0f;
    x[i] = __float2bfloat16(sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2));
  }
}

// Median milliseconds of run() over 20 timed calls after 3 warm-ups.
template <class Run>
float median_ms(Run&& run) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < 23; ++i) {
    CUDA_CHECK(cudaEventRecord(a));
    run();
    CUDA_CHECK(cudaEventRecord(b));
    CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    if (i >= 3) ms.push_back(t);
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace qattn::cuda::tiles
