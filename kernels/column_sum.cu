#include "column_sum.cuh"

namespace qattn::cuda {

namespace {
constexpr int kWarps = 8;          // warps per block of the bias kernel
constexpr int kRowsPerBlock = 256; // rows summed by one block (then one partial row)
}  // namespace

// Block (32, kWarps): lane owns 8 columns of a 256-column tile, warp w sums rows
// w, w + kWarps, ... of the block's row chunk; warps combine in shared memory in
// order. partials (row chunks, OC).
__global__ void bias_partial_kernel(float* partials, const bf16* dout, int N, int OC) {
  __shared__ float sums[kWarps][256];
  const int lane = threadIdx.x, warp = threadIdx.y;
  const int col = blockIdx.x * 256 + lane * 8, row0 = blockIdx.y * kRowsPerBlock;
  const int row_end = min(N, row0 + kRowsPerBlock);
  float acc[8] = {};
  if (col < OC) {
    for (int r = row0 + warp; r < row_end; r += kWarps) {
      float d[8];
      load8_f32(dout + static_cast<long long>(r) * OC + col, d);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] += d[k];
    }
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) sums[warp][lane * 8 + k] = acc[k];
  __syncthreads();
  const int t = warp * 32 + lane;  // 256 threads, one per column of the tile
  if (blockIdx.x * 256 + t < OC) {
    float s = 0.0f;
    for (int w = 0; w < kWarps; ++w) s += sums[w][t];
    partials[static_cast<long long>(blockIdx.y) * OC + blockIdx.x * 256 + t] = s;
  }
}

__global__ void add_partial_sums_kernel(float* dst, const float* partials, int parts, int n,
                                        int ld) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float s = 0.0f;
  for (int p = 0; p < parts; ++p) s += partials[static_cast<long long>(p) * ld + i];
  dst[i] += s;
}

size_t bias_backward_scratch_floats(int N, int OC) {
  return static_cast<size_t>(ceil_div(N, kRowsPerBlock)) * OC;
}

void bias_backward(float* dbias, const bf16* dout, int N, int OC, float* scratch,
                   cudaStream_t stream) {
  const int chunks = ceil_div(N, kRowsPerBlock);
  bias_partial_kernel<<<dim3(ceil_div(OC, 256), chunks), dim3(32, kWarps), 0, stream>>>(
      scratch, dout, N, OC);
  CUDA_CHECK_LAUNCH();
  add_partial_sums(dbias, scratch, chunks, OC, OC, stream);
}

void add_partial_sums(float* dst, const float* partials, int parts, int n, int ld,
                      cudaStream_t stream) {
  add_partial_sums_kernel<<<ceil_div(n, 256), 256, 0, stream>>>(dst, partials, parts, n, ld);
  CUDA_CHECK_LAUNCH();
}

}  // namespace qattn::cuda
