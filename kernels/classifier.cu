#include <cfloat>

#include "attention/common/online_softmax.cuh"  // fast_exp2, kLog2e, kLn2
#include "attention/common/pipeline.cuh"        // cp.async, launch
#include "classifier.cuh"

namespace qattn::cuda {

namespace {
constexpr int kThreads = 512;
constexpr int kBlocksPerSm = 2;  // two rows in flight per SM: one loads while the other computes
}  // namespace

using flash::fast_exp2;
using flash::kLn2;
using flash::kLog2e;

struct MaxSum {
  float max, sum;  // running max of x log2(e) and sum of 2^(x log2(e) - max)
};

__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.max, b.max);
  return {m, a.sum * fast_exp2(a.max - m) + b.sum * fast_exp2(b.max - m)};
}

// The 8 logits of columns [c, c + 8); columns at or past V (padding) are -inf,
// whose probability is 0.
__device__ __forceinline__ void load8_masked(const bf16* row, int c, int V, float (&x)[8]) {
  load8_f32(row + c, x);
  if (c + 8 > V) {  // the vector holding the vocabulary's end, or padding
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (c + k >= V) x[k] = -INFINITY;
  }
}

// One block per row. kRowInShared: the row is copied once into shared memory
// (cp.async) and both passes read the copy, so global memory sees one read and
// one write of it. Otherwise both passes read global memory (rows too long for
// shared memory, and the forward alone, which has one pass). Pass 1: online
// max and sum over the real columns. Pass 2 (write_grad): the gradient, in place.
template <bool kRowInShared>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    classifier_kernel(bf16* logits, float* losses, const int32_t* targets, int V, int Vp,
                      float dloss, bool write_grad) {
  extern __shared__ Bf16x8 row_copy[];  // (Vp / 8) when kRowInShared
  __shared__ MaxSum warp_results[kThreads / 32];
  bf16* row = logits + static_cast<long long>(blockIdx.x) * Vp;
  const bf16* src = row;
  if constexpr (kRowInShared) {
    // A thread copies exactly the 8-column vectors it reads in both passes
    // (columns 8 threadIdx.x + 8 kThreads r), so waiting for its own copies
    // is enough: each warp starts as soon as its part of the row has landed.
    // Only thread 0's read of the target column crosses threads, after the
    // reduction's barrier.
    for (int i = threadIdx.x; i < Vp / 8; i += kThreads)
      flash::cp_async_16(&row_copy[i], row + 8 * i, true);
    flash::cp_async_commit();
    flash::cp_async_wait<0>();
    src = reinterpret_cast<const bf16*>(row_copy);
  }

  MaxSum acc{-FLT_MAX, 0.0f};  // -FLT_MAX, not -inf: 2^(-inf - -inf) would be NaN
  for (int c = threadIdx.x * 8; c < V; c += kThreads * 8) {
    float x[8];
    load8_masked(src, c, V, x);
    float x_max = x[0];
#pragma unroll
    for (int k = 1; k < 8; ++k) x_max = fmaxf(x_max, x[k]);
    const float m = fmaxf(acc.max, x_max * kLog2e);
    float s = acc.sum * fast_exp2(acc.max - m);
#pragma unroll
    for (int k = 0; k < 8; ++k) s += fast_exp2(fmaf(x[k], kLog2e, -m));
    acc = {m, s};
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, acc.max, o),
                 __shfl_xor_sync(0xffffffffu, acc.sum, o)};
    acc = combine(acc, other);
  }
  if (threadIdx.x % 32 == 0) warp_results[threadIdx.x / 32] = acc;
  __syncthreads();
  MaxSum total = warp_results[0];
  for (int w = 1; w < kThreads / 32; ++w) total = combine(total, warp_results[w]);
  const int target = targets[blockIdx.x];
  if (threadIdx.x == 0) {
    // logsumexp = (max + log2(sum)) ln 2, in natural units.
    losses[blockIdx.x] = (total.max + log2f(total.sum)) * kLn2 - __bfloat162float(src[target]);
  }
  if (!write_grad) return;
  // In global memory, everyone has read row[target] before it is overwritten.
  if constexpr (!kRowInShared) __syncthreads();
  const float scale = dloss / total.sum;
  for (int c = threadIdx.x * 8; c < Vp; c += kThreads * 8) {
    float x[8];
    load8_masked(src, c, V, x);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      // (softmax - onehot(target)) * dloss
      x[k] = fast_exp2(fmaf(x[k], kLog2e, -total.max)) * scale;
      if (c + k == target) x[k] -= dloss;
    }
    store8_f32(row + c, x);
  }
}

void classifier_forward_backward(bf16* logits, float* losses, const int32_t* targets, int N, int V,
                                 int Vp, float dloss, bool write_grad, cudaStream_t stream) {
  const int row_bytes = Vp * static_cast<int>(sizeof(bf16));
  if (write_grad && row_bytes <= classifier_shared_row_limit()) {
    flash::launch(classifier_kernel<true>, dim3(N), kThreads, row_bytes, stream, logits, losses,
                  targets, V, Vp, dloss, write_grad);
  } else {
    classifier_kernel<false>
        <<<N, kThreads, 0, stream>>>(logits, losses, targets, V, Vp, dloss, write_grad);
    CUDA_CHECK_LAUNCH();
  }
}

int classifier_shared_row_limit() {
  int device = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cudaFuncAttributes attr{};
  CUDA_CHECK(cudaFuncGetAttributes(&attr, classifier_kernel<true>));
  return optin - static_cast<int>(attr.sharedSizeBytes);
}

}  // namespace qattn::cuda
