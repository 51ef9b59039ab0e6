#include <cmath>

#include "column_sum.cuh"
#include "qk_norm.cuh"

namespace qattn::cuda {

namespace {
constexpr int kThreads = 256;
constexpr int kRowsPerBlock = 512;  // head rows per backward block (one row of partials)
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

// The step that differs between the forms: the multiplier w of the 8 entries
// of head row r that thread `slot` owns. gain: γ_q or γ_k. logit_scale:
// g_h·c for q rows (c = 1/√d, the fold of §3.4), 1 for k rows.
template <QkNormForm form>
__device__ __forceinline__ void load_multiplier(float (&w)[8], const QkNormParams& p, long long r,
                                                int H, int slot, float c) {
  const int head = static_cast<int>(r % (2 * H));
  const bool is_q = head < H;
  if constexpr (form == QkNormForm::gain) {
    load8_f32((is_q ? p.gamma_q : p.gamma_k) + slot * 8, w);
  } else {
    const float s = is_q ? __bfloat162float(p.scale[head]) * c : 1.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = s;
  }
}
}  // namespace

template <QkNormForm form>
__global__ void qk_norm_forward_kernel(bf16* qkv, bf16* raw, float* rrms, QkNormParams p,
                                       long long rows, int H, int d, float c) {
  const RowGroup g(d);
  const long long r = static_cast<long long>(blockIdx.x) * g.groups + g.group;
  // Rows past the end still join the shuffle (full-mask), but touch no memory.
  const bool valid = r < rows;
  bf16* x = qkv + qkv_offset(valid ? r : 0, H, d) + g.slot * 8;
  float v[8] = {}, w[8], ss = 0.0f;
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
  load_multiplier<form>(w, p, r, H, g.slot, c);
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = w[k] * v[k] * inv;
  store8_f32(x, v);
  if (g.slot == 0) rrms[r] = inv;
}

// dx = rrms * (w * dy - xhat * mean(w * dy * xhat)), xhat = x * rrms, for
// both forms. The parameters' gradients, combined per block in a fixed order
// into partials:
//   gain: dgamma += dy * xhat per channel, per group in registers, then in
//     group order: partials (blocks, 2, d), q then k.
//   logit_scale: dg_h += c * <dy, xhat> over the q rows of head h, one value
//     per row in shared memory, then in row order: partials (blocks, H).
template <QkNormForm form>
__global__ void qk_norm_backward_kernel(bf16* dqkv, float* partials, const bf16* raw,
                                        const float* rrms, QkNormParams p, long long rows, int H,
                                        int d, float c) {
  constexpr bool kGain = form == QkNormForm::gain;
  // gain: (groups, 2, d) per-channel sums; logit_scale: one value per row.
  __shared__ float sums[kGain ? kThreads * 16 : kRowsPerBlock];
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
    float dy[8] = {}, x[8] = {}, w[8] = {};
    float inv = 0.0f;
    if (valid) {
      load8_f32(dy_ptr, dy);
      load8_f32(raw + r * d + g.slot * 8, x);
      load_multiplier<form>(w, p, r, H, g.slot, c);
      inv = rrms[r];
    }
    float dot = 0.0f, dy_xhat = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      x[k] *= inv;  // xhat
      dot += w[k] * dy[k] * x[k];
      if constexpr (kGain) {
        acc_q[k] += is_q ? dy[k] * x[k] : 0.0f;  // selects, not a runtime array choice
        acc_k[k] += is_q ? 0.0f : dy[k] * x[k];
      } else {
        dy_xhat += dy[k] * x[k];
      }
    }
    const float mean_dot = g.sum(dot) / d;
    if constexpr (!kGain) {
      dy_xhat = g.sum(dy_xhat);
      if (valid && is_q && g.slot == 0) sums[r - row0] = c * dy_xhat;
    }
    if (!valid) continue;
#pragma unroll
    for (int k = 0; k < 8; ++k) dy[k] = inv * (w[k] * dy[k] - x[k] * mean_dot);
    store8_f32(dy_ptr, dy);
  }
  if constexpr (kGain) {
    float* mine = sums + g.group * 2 * d + g.slot * 8;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      mine[k] = acc_q[k];
      mine[d + k] = acc_k[k];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 2 * d; i += kThreads) {
      float s = 0.0f;
      for (int grp = 0; grp < g.groups; ++grp) s += sums[grp * 2 * d + i];
      partials[static_cast<long long>(blockIdx.x) * 2 * d + i] = s;
    }
  } else {
    __syncthreads();
    for (int h = threadIdx.x; h < H; h += kThreads) {
      // The first row of q head h at or after row0, then every 2H rows.
      const long long first = row0 + ((h - row0 % (2 * H)) % (2 * H) + 2 * H) % (2 * H);
      float s = 0.0f;
      for (long long r = first; r < row_end; r += 2 * H) s += sums[r - row0];
      partials[static_cast<long long>(blockIdx.x) * H + h] = s;
    }
  }
}

namespace {
float inv_sqrt(int d) { return 1.0f / std::sqrt(static_cast<float>(d)); }
}  // namespace

void qk_norm_forward(bf16* qkv, bf16* raw, float* rrms, const QkNormParams& p, int N, int H, int d,
                     cudaStream_t stream) {
  const long long rows = 2LL * N * H;
  const int groups = kThreads / (d / 8);
  const int blocks = ceil_div(rows, groups);
  if (p.form == QkNormForm::gain) {
    qk_norm_forward_kernel<QkNormForm::gain>
        <<<blocks, kThreads, 0, stream>>>(qkv, raw, rrms, p, rows, H, d, inv_sqrt(d));
  } else {
    qk_norm_forward_kernel<QkNormForm::logit_scale>
        <<<blocks, kThreads, 0, stream>>>(qkv, raw, rrms, p, rows, H, d, inv_sqrt(d));
  }
  CUDA_CHECK_LAUNCH();
}

size_t qk_norm_backward_scratch_floats(QkNormForm form, int N, int H, int d) {
  const size_t blocks = ceil_div(2LL * N * H, kRowsPerBlock);
  return blocks * (form == QkNormForm::logit_scale ? H : 2 * d);
}

void qk_norm_backward(bf16* dqkv, const QkNormGrads& grads, const bf16* raw, const float* rrms,
                      const QkNormParams& p, int N, int H, int d, float* scratch,
                      cudaStream_t stream) {
  const long long rows = 2LL * N * H;
  const int blocks = ceil_div(rows, kRowsPerBlock);
  if (p.form == QkNormForm::gain) {
    qk_norm_backward_kernel<QkNormForm::gain>
        <<<blocks, kThreads, 0, stream>>>(dqkv, scratch, raw, rrms, p, rows, H, d, inv_sqrt(d));
    CUDA_CHECK_LAUNCH();
    add_partial_sums(grads.dgamma_q, scratch, blocks, d, 2 * d, stream);
    add_partial_sums(grads.dgamma_k, scratch + d, blocks, d, 2 * d, stream);
  } else {
    qk_norm_backward_kernel<QkNormForm::logit_scale>
        <<<blocks, kThreads, 0, stream>>>(dqkv, scratch, raw, rrms, p, rows, H, d, inv_sqrt(d));
    CUDA_CHECK_LAUNCH();
    add_partial_sums(grads.dscale, scratch, blocks, H, H, stream);
  }
}

}  // namespace qattn::cuda
