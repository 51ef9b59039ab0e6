#include <algorithm>

#include "encoder.cuh"

namespace qattn::cuda {

// One thread per 8 channels of one (b, t).
__global__ void encoder_forward_kernel(bf16* out, const int32_t* inp, const bf16* wte,
                                       const bf16* wpe, int N, int T, int C) {
  const long long i = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  if (i >= static_cast<long long>(N) * C) return;
  const int n = static_cast<int>(i / C), c = static_cast<int>(i % C), t = n % T;
  float a[8], b[8];
  load8_f32(wte + static_cast<long long>(inp[n]) * C + c, a);
  load8_f32(wpe + static_cast<long long>(t) * C + c, b);
#pragma unroll
  for (int k = 0; k < 8; ++k) a[k] += b[k];
  store8_f32(out + i, a);
}

// One thread per (bucket, 8 channels): sums the bucket's rows in position order.
__global__ void encoder_backward_wte_kernel(float* dwte, const bf16* dout, const int32_t* token,
                                            const int32_t* start, const int32_t* position,
                                            int num_tokens, int C) {
  const int c8 = blockIdx.y * blockDim.x + threadIdx.x, bucket = blockIdx.x;
  if (c8 * 8 >= C || bucket >= num_tokens) return;
  float acc[8] = {};
  for (int p = start[bucket]; p < start[bucket + 1]; ++p) {
    float d[8];
    load8_f32(dout + static_cast<long long>(position[p]) * C + c8 * 8, d);
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] += d[k];
  }
  float* dst = dwte + static_cast<long long>(token[bucket]) * C + c8 * 8;
#pragma unroll
  for (int k = 0; k < 8; ++k) dst[k] += acc[k];
}

// One thread per (t, channel): sums over the batch in order.
__global__ void encoder_backward_wpe_kernel(float* dwpe, const bf16* dout, int B, int T, int C) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= T * C) return;
  float acc = 0.0f;
  for (int b = 0; b < B; ++b) acc += __bfloat162float(dout[static_cast<long long>(b) * T * C + i]);
  dwpe[i] += acc;
}

void encoder_forward(bf16* out, const int32_t* inp, const bf16* wte, const bf16* wpe, int B, int T,
                     int C, cudaStream_t stream) {
  const int threads = 256;
  encoder_forward_kernel<<<ceil_div(static_cast<long long>(B) * T * C / 8, threads), threads, 0,
                           stream>>>(out, inp, wte, wpe, B * T, T, C);
  CUDA_CHECK_LAUNCH();
}

void encoder_backward(float* dwte, float* dwpe, const bf16* dout, const TokenBuckets& buckets,
                      int B, int T, int C, cudaStream_t stream) {
  if (buckets.num_tokens > 0) {
    const int threads = std::min(1024, ceil_div(C / 8, 32) * 32);
    dim3 grid(buckets.num_tokens, ceil_div(C / 8, threads));
    encoder_backward_wte_kernel<<<grid, threads, 0, stream>>>(
        dwte, dout, buckets.token, buckets.start, buckets.position, buckets.num_tokens, C);
    CUDA_CHECK_LAUNCH();
  }
  encoder_backward_wpe_kernel<<<ceil_div(static_cast<long long>(T) * C, 256), 256, 0, stream>>>(
      dwpe, dout, B, T, C);
  CUDA_CHECK_LAUNCH();
}

}  // namespace qattn::cuda
