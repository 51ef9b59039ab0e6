#include <cfloat>

#include "classifier.cuh"

namespace qattn::cuda {

namespace {
constexpr int kThreads = 1024;
}

struct MaxSum {
  float max, sum;  // running max and sum of exp(x - max)
};

__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.max, b.max);
  return {m, a.sum * __expf(a.max - m) + b.sum * __expf(b.max - m)};
}

// One block per row. Pass 1: online max and sum over the real columns, 8 per
// load. Pass 2 (write_grad): the gradient, in place.
__global__ void __launch_bounds__(kThreads) classifier_kernel(bf16* logits, float* losses,
                                                              const int32_t* targets, int V,
                                                              int Vp, float dloss,
                                                              bool write_grad) {
  __shared__ MaxSum warp_results[kThreads / 32];
  bf16* row = logits + static_cast<long long>(blockIdx.x) * Vp;
  MaxSum acc{-FLT_MAX, 0.0f};  // -FLT_MAX, not -inf: exp(-inf - -inf) would be NaN
  for (int c = threadIdx.x * 8; c < V; c += kThreads * 8) {
    float x[8];
    load8_f32(row + c, x);
    float m = acc.max;
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (c + k < V) m = fmaxf(m, x[k]);
    float s = acc.sum * __expf(acc.max - m);
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (c + k < V) s += __expf(x[k] - m);
    acc = {m, s};
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, acc.max, o), __shfl_xor_sync(0xffffffffu, acc.sum, o)};
    acc = combine(acc, other);
  }
  if (threadIdx.x % 32 == 0) warp_results[threadIdx.x / 32] = acc;
  __syncthreads();
  MaxSum total = warp_results[0];
  for (int w = 1; w < kThreads / 32; ++w) total = combine(total, warp_results[w]);
  const int target = targets[blockIdx.x];
  if (threadIdx.x == 0) {
    losses[blockIdx.x] = total.max + logf(total.sum) - __bfloat162float(row[target]);
  }
  if (!write_grad) return;
  __syncthreads();  // everyone has read row[target] before it is overwritten
  const float inv_sum = 1.0f / total.sum;
  for (int c = threadIdx.x * 8; c < Vp; c += kThreads * 8) {
    float x[8];
    load8_f32(row + c, x);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float p = c + k < V ? __expf(x[k] - total.max) * inv_sum : 0.0f;
      x[k] = (p - (c + k == target ? 1.0f : 0.0f)) * dloss;
    }
    store8_f32(row + c, x);
  }
}

void classifier_forward_backward(bf16* logits, float* losses, const int32_t* targets, int N,
                                 int V, int Vp, float dloss, bool write_grad,
                                 cudaStream_t stream) {
  classifier_kernel<<<N, kThreads, 0, stream>>>(logits, losses, targets, V, Vp, dloss, write_grad);
  CUDA_CHECK_LAUNCH();
}

}  // namespace qattn::cuda
