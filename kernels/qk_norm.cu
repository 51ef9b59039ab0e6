#include "column_sum.cuh"
#include "qk_norm.cuh"

namespace qattn::cuda {

namespace {
constexpr int kThreads = 256;
constexpr int kRowsPerBlock = 512;  // head rows per backward block (one partial row of dgamma)
constexpr float kEps = 1e-6f;

// A group of d/8 consecutive threads owns one head row; thread `slot` of the
// group owns its 8 values at slot * 8.
struct RowGroup {
  int width, slot, group, groups;
  __device__ explicit RowGroup(int d)
      : width(d / 8), slot(threadIdx.x % (d / 8)), group(threadIdx.x / (d / 8)),
        groups(kThreads / (d / 8)) {}
  __device__ float sum(float v) const {
    for (int o = width / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o, width);
    return v;
  }
};

// Head row r = n * 2H + h (h < H: q head h, else k head h - H) lives at
// n * 3C + h * d of qkv and at n * 2C + h * d of raw: the first 2C of a qkv row.
__device__ __forceinline__ long long qkv_offset(long long r, int H, int d) {
  return (r / (2 * H)) * 3LL * H * d + (r % (2 * H)) * d;
}
}  // namespace

__global__ void qk_norm_forward_kernel(bf16* qkv, bf16* raw, float* rrms, const bf16* gamma_q,
                                       const bf16* gamma_k, long long rows, int H, int d) {
  const RowGroup g(d);
  const long long r = static_cast<long long>(blockIdx.x) * g.groups + g.group;
  // Rows past the end still join the shuffle (full-mask), but touch no memory.
  const bool valid = r < rows;
  bf16* x = qkv + qkv_offset(valid ? r : 0, H, d) + g.slot * 8;
  float v[8] = {}, gm[8], ss = 0.0f;
  if (valid) {
    const Bf16x8 xv = load8(x);
    store8(raw + r * d + g.slot * 8, xv);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      v[k] = __bfloat162float(xv.v[k]);
      ss += v[k] * v[k];
    }
  }
  const float inv = rsqrtf(g.sum(ss) / d + kEps);
  if (!valid) return;
  load8_f32((r % (2 * H) < H ? gamma_q : gamma_k) + g.slot * 8, gm);
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = gm[k] * v[k] * inv;
  store8_f32(x, v);
  if (g.slot == 0) rrms[r] = inv;
}

// dx = rrms * (gamma * dy - xhat * mean(gamma * dy * xhat)), xhat = x * rrms;
// dgamma += dy * xhat, per group in registers, then combined per block in
// group order into partials (blocks, 2, d): q then k.
__global__ void qk_norm_backward_kernel(bf16* dqkv, float* partials, const bf16* raw,
                                        const float* rrms, const bf16* gamma_q,
                                        const bf16* gamma_k, long long rows, int H, int d) {
  __shared__ float group_sums[kThreads * 16];  // (groups, 2, d) = 2 * 8 floats per thread
  const RowGroup g(d);
  float acc_q[8] = {}, acc_k[8] = {};
  const long long row0 = static_cast<long long>(blockIdx.x) * kRowsPerBlock;
  const long long row_end = min(rows, row0 + kRowsPerBlock);
  // Every group runs the same number of iterations so that the in-group
  // shuffles always see full warps; rows past the end touch no memory.
  for (long long base = row0; base < row_end; base += g.groups) {
    const long long r = base + g.group;
    const bool valid = r < row_end;
    const bool is_q = r % (2 * H) < H;
    bf16* dy_ptr = dqkv + qkv_offset(valid ? r : row0, H, d) + g.slot * 8;
    float dy[8] = {}, x[8] = {}, gm[8] = {};
    float inv = 0.0f;
    if (valid) {
      load8_f32(dy_ptr, dy);
      load8_f32(raw + r * d + g.slot * 8, x);
      load8_f32((is_q ? gamma_q : gamma_k) + g.slot * 8, gm);
      inv = rrms[r];
    }
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      x[k] *= inv;  // xhat
      dot += gm[k] * dy[k] * x[k];
      acc_q[k] += is_q ? dy[k] * x[k] : 0.0f;  // selects, not a runtime array choice
      acc_k[k] += is_q ? 0.0f : dy[k] * x[k];
    }
    const float mean_dot = g.sum(dot) / d;
    if (!valid) continue;
#pragma unroll
    for (int k = 0; k < 8; ++k) dy[k] = inv * (gm[k] * dy[k] - x[k] * mean_dot);
    store8_f32(dy_ptr, dy);
  }
  float* mine = group_sums + g.group * 2 * d + g.slot * 8;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    mine[k] = acc_q[k];
    mine[d + k] = acc_k[k];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 2 * d; i += kThreads) {
    float s = 0.0f;
    for (int grp = 0; grp < g.groups; ++grp) s += group_sums[grp * 2 * d + i];
    partials[static_cast<long long>(blockIdx.x) * 2 * d + i] = s;
  }
}

void qk_norm_forward(bf16* qkv, bf16* raw, float* rrms, const bf16* gamma_q, const bf16* gamma_k,
                     int N, int H, int d, cudaStream_t stream) {
  const long long rows = 2LL * N * H;
  const int groups = kThreads / (d / 8);
  qk_norm_forward_kernel<<<ceil_div(rows, groups), kThreads, 0, stream>>>(qkv, raw, rrms, gamma_q,
                                                                          gamma_k, rows, H, d);
  CUDA_CHECK_LAUNCH();
}

size_t qk_norm_backward_scratch_floats(int N, int H, int d) {
  return static_cast<size_t>(ceil_div(2LL * N * H, kRowsPerBlock)) * 2 * d;
}

void qk_norm_backward(bf16* dqkv, float* dgamma_q, float* dgamma_k, const bf16* raw,
                      const float* rrms, const bf16* gamma_q, const bf16* gamma_k, int N, int H,
                      int d, float* scratch, cudaStream_t stream) {
  const long long rows = 2LL * N * H;
  const int blocks = ceil_div(rows, kRowsPerBlock);
  qk_norm_backward_kernel<<<blocks, kThreads, 0, stream>>>(dqkv, scratch, raw, rrms, gamma_q,
                                                           gamma_k, rows, H, d);
  CUDA_CHECK_LAUNCH();
  add_partial_sums(dgamma_q, scratch, blocks, d, 2 * d, stream);
  add_partial_sums(dgamma_k, scratch + d, blocks, d, 2 * d, stream);
}

}  // namespace qattn::cuda
