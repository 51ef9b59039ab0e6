#include "column_sum.cuh"
#include "layernorm.cuh"

namespace qattn::cuda {

namespace {
constexpr int kWarps = 4;          // warps per block; one row per warp at a time
constexpr int kRowsPerBlock = 64;  // rows of one backward block (one partial row of dw, db)
constexpr float kEps = 1e-5f;
}  // namespace

// One warp per row; lane handles 8 channels at c = (j * 32 + lane) * 8. The row
// is read three times (mean, variance, output): the re-reads hit L1.
__global__ void layernorm_forward_kernel(bf16* out, float* mean, float* rstd, const bf16* inp,
                                         const bf16* w, const bf16* b, int N, int C) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= N) return;
  const bf16* x = inp + static_cast<long long>(row) * C;
  float sum = 0.0f;
  for (int c = lane * 8; c < C; c += 256) {
    float v[8];
    load8_f32(x + c, v);
#pragma unroll
    for (int k = 0; k < 8; ++k) sum += v[k];
  }
  const float m = warp_sum(sum) / C;
  float var = 0.0f;
  for (int c = lane * 8; c < C; c += 256) {
    float v[8];
    load8_f32(x + c, v);
#pragma unroll
    for (int k = 0; k < 8; ++k) var += (v[k] - m) * (v[k] - m);
  }
  const float s = rsqrtf(warp_sum(var) / C + kEps);
  for (int c = lane * 8; c < C; c += 256) {
    float v[8], wv[8], bv[8];
    load8_f32(x + c, v);
    load8_f32(w + c, wv);
    load8_f32(b + c, bv);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = (v[k] - m) * s * wv[k] + bv[k];
    store8_f32(out + static_cast<long long>(row) * C + c, v);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// Block of kWarps warps over kRowsPerBlock rows. Per row (one warp):
//   g = dout * w, dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
// dw, db partials: each warp accumulates its rows into its own shared slice,
// then the slices are summed in warp order into partials (blocks, 2, C).
__global__ void layernorm_backward_kernel(bf16* dinp, float* partials, const bf16* dout,
                                          const bf16* inp, const bf16* w, const float* mean,
                                          const float* rstd, int N, int C) {
  // (kWarps, 2, 8, C/8): dw then db of each warp, channel c + k stored at
  // k * C/8 + c/8 so that the 32 lanes of a warp hit 32 different banks.
  extern __shared__ float shared[];
  const int C8 = C / 8;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* sdw = shared + warp * 2 * C;
  float* sdb = sdw + C;
  for (int c = lane; c < C; c += 32) sdw[c] = sdb[c] = 0.0f;
  __syncwarp();
  const int row_end = min(N, (blockIdx.x + 1) * kRowsPerBlock);
  for (int row = blockIdx.x * kRowsPerBlock + warp; row < row_end; row += kWarps) {
    const long long base = static_cast<long long>(row) * C;
    const float m = mean[row], s = rstd[row];
    float g_sum = 0.0f, gx_sum = 0.0f;
    for (int c = lane * 8; c < C; c += 256) {
      float d[8], x[8], wv[8];
      load8_f32(dout + base + c, d);
      load8_f32(inp + base + c, x);
      load8_f32(w + c, wv);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float xhat = (x[k] - m) * s;
        g_sum += d[k] * wv[k];
        gx_sum += d[k] * wv[k] * xhat;
        sdw[k * C8 + c / 8] += d[k] * xhat;  // lane-private, conflict-free across the warp
        sdb[k * C8 + c / 8] += d[k];
      }
    }
    const float g_mean = warp_sum(g_sum) / C, gx_mean = warp_sum(gx_sum) / C;
    for (int c = lane * 8; c < C; c += 256) {
      float d[8], x[8], wv[8], di[8];
      load8_f32(dout + base + c, d);
      load8_f32(inp + base + c, x);
      load8_f32(w + c, wv);
      load8_f32(dinp + base + c, di);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float xhat = (x[k] - m) * s;
        di[k] += s * (d[k] * wv[k] - g_mean - xhat * gx_mean);
      }
      store8_f32(dinp + base + c, di);
    }
  }
  __syncthreads();
  float* out = partials + static_cast<long long>(blockIdx.x) * 2 * C;
  for (int i = threadIdx.x; i < 2 * C; i += blockDim.x) {
    const int part = i / C, c = i % C;  // part 0: dw, 1: db
    const int slot = part * C + (c % 8) * C8 + c / 8;
    float acc = 0.0f;
    for (int v = 0; v < kWarps; ++v) acc += shared[v * 2 * C + slot];
    out[i] = acc;
  }
}

void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* w,
                       const bf16* b, int N, int C, cudaStream_t stream) {
  const int threads = 256;
  layernorm_forward_kernel<<<ceil_div(N, threads / 32), threads, 0, stream>>>(out, mean, rstd,
                                                                              inp, w, b, N, C);
  CUDA_CHECK_LAUNCH();
}

size_t layernorm_backward_scratch_floats(int N, int C) {
  return static_cast<size_t>(ceil_div(N, kRowsPerBlock)) * 2 * C;
}

void layernorm_backward(bf16* dinp, float* dw, float* db, const bf16* dout, const bf16* inp,
                        const bf16* w, const float* mean, const float* rstd, int N, int C,
                        float* scratch, cudaStream_t stream) {
  const int blocks = ceil_div(N, kRowsPerBlock);
  const size_t smem = sizeof(float) * kWarps * 2 * C;
  if (smem > 48 * 1024) {
    CUDA_CHECK(cudaFuncSetAttribute(layernorm_backward_kernel,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem)));
  }
  layernorm_backward_kernel<<<blocks, kWarps * 32, smem, stream>>>(dinp, scratch, dout, inp, w,
                                                                   mean, rstd, N, C);
  CUDA_CHECK_LAUNCH();
  add_partial_sums(dw, scratch, blocks, C, 2 * C, stream);
  add_partial_sums(db, scratch + C, blocks, C, 2 * C, stream);
}

}  // namespace qattn::cuda
