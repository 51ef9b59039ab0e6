// SageBwd's quantisation pre-pass (quant.cuh): three kernels, then launchers.
//   key_block_sums   Σ of K per block and channel (smooth_k: μ_K = Σ blocks / T,
//                    summed in a fixed order by the next kernel: deterministic)
//   quantise         one block of one operand: smoothing, ψ, the three copies, δ
//   query_bias       smooth_q's fp32 bias c·μ_Qi·(K_j − μ_K), one row per query block
#include <cmath>

#include "attention/quant.cuh"

namespace qattn::cuda {
namespace {

constexpr int kQuantThreads = 256;
constexpr int kBiasThreads = 128;

struct QuantiseParams {
  const bf16* qkv;   // (B, T, 3, H, d)
  const bf16* o;     // (B, T, H, d), backward only
  const bf16* dout;  // (B, T, H, d), backward only
  SageWorkspace ws;
  SageCopies copies;
  int B, H, T;
  float c;           // 1 / sqrt(d)
  bool smooth_q, smooth_k;
};

// Row t of slot (0 q, 1 k, 2 v) of head h, batch b in (B, T, 3, H, d).
__device__ __forceinline__ const bf16* qkv_row(const QuantiseParams& p, int D, int b, int t, int slot, int h) {
  return p.qkv + ((static_cast<size_t>(b) * p.T + t) * 3 + slot) * p.H * D + static_cast<size_t>(h) * D;
}
// Row t of head h, batch b in (B, T, H, d).
__device__ __forceinline__ const bf16* head_row(const bf16* x, const QuantiseParams& p, int D, int b, int t, int h) {
  return x + (static_cast<size_t>(b) * p.T + t) * p.H * D + static_cast<size_t>(h) * D;
}

// ψ's level of x with scale s, as the CPU reference: round(x / s), half away from zero.
__device__ __forceinline__ int8_t quantise_level(float x, float s) {
  return static_cast<int8_t>(static_cast<int>(roundf(x / s)));
}

// Grid (blocks, B·H), d threads: column sums of K over the block's valid rows.
template <int D>
__global__ void __launch_bounds__(D) key_block_sums_kernel(const QuantiseParams p) {
  const int blk = blockIdx.x, bh = blockIdx.y, b = bh / p.H, h = bh % p.H, col = threadIdx.x;
  const int t0 = blk * kSageBlock, rows = min(kSageBlock, p.T - t0);
  float sum = 0.0f;
  for (int r = 0; r < rows; ++r) sum += __bfloat162float(qkv_row(p, D, b, t0 + r, 1, h)[col]);
  p.ws.key_block_sums[(static_cast<size_t>(bh) * p.ws.blocks + blk) * D + col] = sum;
}

// Grid (blocks, B·H, operands): operand z = 0 c·(Q − μ_Q), 1 K − μ_K, 2 V, 3 dO.
// The block's (64, d) rows go through shared memory in fp32; padded rows stay 0.
template <int D>
__global__ void __launch_bounds__(kQuantThreads) quantise_kernel(const QuantiseParams p) {
  __shared__ float x[kSageBlock][D + 1];  // (64, d) the block, then smoothed and scaled
  __shared__ float mean[D];               // (d) the mean subtracted from every valid row
  __shared__ float scratch[kQuantThreads / 32];
  const int blk = blockIdx.x, bh = blockIdx.y, which = blockIdx.z;
  const int b = bh / p.H, h = bh % p.H, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int t0 = blk * kSageBlock, rows = min(kSageBlock, p.T - t0);
  const SageWorkspace& ws = p.ws;
  const QuantOperand& out = which == 0 ? ws.q : which == 1 ? ws.k : which == 2 ? ws.v : ws.dout;
  const OperandCopies& copies =
      which == 0 ? p.copies.q : which == 1 ? p.copies.k : which == 2 ? p.copies.v : p.copies.dout;

  for (int i = threadIdx.x; i < kSageBlock * D; i += kQuantThreads) {
    const int r = i / D, col = i % D;
    float v = 0.0f;
    if (r < rows)
      v = __bfloat162float(which == 3 ? head_row(p.dout, p, D, b, t0 + r, h)[col]
                                      : qkv_row(p, D, b, t0 + r, which, h)[col]);
    x[r][col] = v;
  }
  __syncthreads();

  // SPEC §3 steps 1-2: μ_K over all T tokens (from the block sums, fixed order),
  // μ_Q over the block's valid rows.
  for (int col = threadIdx.x; col < D; col += kQuantThreads) {
    float mu = 0.0f;
    if (which == 1 && p.smooth_k) {
      for (int k = 0; k < ws.blocks; ++k) mu += ws.key_block_sums[(static_cast<size_t>(bh) * ws.blocks + k) * D + col];
      mu /= static_cast<float>(p.T);
    } else if (which == 0 && p.smooth_q) {
      for (int r = 0; r < rows; ++r) mu += x[r][col];
      mu /= static_cast<float>(rows);
      ws.query_mean[(static_cast<size_t>(bh) * ws.blocks + blk) * D + col] = mu;
    }
    if (which == 1 && blk == 0) ws.key_mean[static_cast<size_t>(bh) * D + col] = mu;
    mean[col] = mu;
  }
  __syncthreads();

  // Step 3: the quantised value is c·(Q − μ_Q) for Q, X − μ for the others.
  const float mult = which == 0 ? p.c : 1.0f;
  float amax = 0.0f;
  for (int i = threadIdx.x; i < rows * D; i += kQuantThreads) {
    const int r = i / D, col = i % D;
    const float v = (x[r][col] - mean[col]) * mult;
    x[r][col] = v;
    amax = fmaxf(amax, fabsf(v));
  }
  amax = warp_max(amax);
  if (lane == 0) scratch[warp] = amax;
  __syncthreads();
  amax = 0.0f;
#pragma unroll
  for (int w = 0; w < kQuantThreads / 32; ++w) amax = fmaxf(amax, scratch[w]);
  const float scale = amax == 0.0f ? 1.0f : amax / 127.0f;
  if (threadIdx.x == 0) out.scale[static_cast<size_t>(bh) * ws.blocks + blk] = scale;

  const size_t natural0 = (static_cast<size_t>(bh) * ws.Tp + t0) * D;  // row t0 of (B·H, Tp, d)
  for (int i = threadIdx.x; (copies.i8 || copies.bf) && i < kSageBlock * D; i += kQuantThreads) {
    const int r = i / D, col = i % D;
    if (copies.i8) out.i8[natural0 + i] = quantise_level(x[r][col], scale);
    if (copies.bf) out.bf[natural0 + i] = __float2bfloat16(x[r][col]);
  }
  // (d, Tp): position pos of the block holds row kPermuted of its 16-group.
  for (int i = threadIdx.x; copies.i8t && i < kSageBlock * D; i += kQuantThreads) {
    const int col = i / kSageBlock, pos = i % kSageBlock;
    const int r = (pos / 16) * 16 + kPermuted(pos % 16);
    out.i8t[(static_cast<size_t>(bh) * D + col) * ws.Tp + t0 + pos] = quantise_level(x[r][col], scale);
  }

  if (which == 3) {  // δ = rowsum(dO ∘ O), one warp per row; padded rows 0
    for (int r = warp; r < kSageBlock; r += kQuantThreads / 32) {
      float sum = 0.0f;
      if (r < rows) {
        const bf16* o_row = head_row(p.o, p, D, b, t0 + r, h);
        for (int col = lane; col < D; col += 32) sum += x[r][col] * __bfloat162float(o_row[col]);
      }
      sum = warp_sum(sum);
      if (lane == 0) ws.delta[static_cast<size_t>(bh) * ws.Tp + t0 + r] = sum;
    }
  }
}

// Grid (ceil(Tp / 128), blocks, B·H): bias[i][t] = c·μ_Qi·(K_t − μ_K), 0 past T.
template <int D>
__global__ void __launch_bounds__(kBiasThreads) query_bias_kernel(const QuantiseParams p) {
  __shared__ float mu_q[D], mu_k[D];
  const int bh = blockIdx.z, qb = blockIdx.y, b = bh / p.H, h = bh % p.H;
  const int t = blockIdx.x * kBiasThreads + threadIdx.x;
  const SageWorkspace& ws = p.ws;
  for (int col = threadIdx.x; col < D; col += kBiasThreads) {
    mu_q[col] = ws.query_mean[(static_cast<size_t>(bh) * ws.blocks + qb) * D + col];
    mu_k[col] = ws.key_mean[static_cast<size_t>(bh) * D + col];
  }
  __syncthreads();
  if (t >= ws.Tp) return;
  float sum = 0.0f;
  if (t < p.T) {
    const bf16* k_row = qkv_row(p, D, b, t, 1, h);
    for (int col = 0; col < D; ++col) sum += mu_q[col] * (__bfloat162float(k_row[col]) - mu_k[col]);
  }
  ws.query_bias[(static_cast<size_t>(bh) * ws.blocks + qb) * ws.Tp + t] = p.c * sum;
}

// The workspace's buffers, 256-byte aligned, from `base` (null: offsets only).
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<unsigned char*>(base)) {}
  template <typename T>
  T* take(size_t n) {
    used_ = (used_ + 255) / 256 * 256;
    T* p = base_ ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += n * sizeof(T);
    return p;
  }
  size_t used() const { return used_; }

 private:
  unsigned char* base_;
  size_t used_ = 0;
};

SageWorkspace carve(const SageOptions& opt, const AttentionShape& s, Carver& c) {
  SageWorkspace ws{};
  ws.blocks = ceil_div(s.T, kSageBlock);
  ws.Tp = ws.blocks * kSageBlock;
  const size_t heads = static_cast<size_t>(s.B) * s.H, n = heads * ws.Tp * s.d;
  for (QuantOperand* x : {&ws.q, &ws.k, &ws.v, &ws.dout}) {
    x->i8 = c.take<int8_t>(n);
    x->i8t = c.take<int8_t>(n);
    x->bf = c.take<bf16>(n);
    x->scale = c.take<float>(heads * ws.blocks);
  }
  ws.key_block_sums = c.take<float>(heads * ws.blocks * s.d);
  ws.key_mean = c.take<float>(heads * s.d);
  ws.query_mean = c.take<float>(heads * ws.blocks * s.d);
  ws.query_bias = opt.smooth_q ? c.take<float>(heads * ws.blocks * ws.Tp) : nullptr;
  ws.delta = c.take<float>(heads * ws.Tp);
  ws.row_terms = opt.softmax ? c.take<float>(heads * ws.Tp * 4) : nullptr;
  return ws;
}

template <int D>
void quantise(const QuantiseParams& p, bool with_dout, cudaStream_t stream) {
  const int heads = p.B * p.H;
  if (p.smooth_k) {
    key_block_sums_kernel<D><<<dim3(p.ws.blocks, heads), D, 0, stream>>>(p);
    CUDA_CHECK_LAUNCH();
  }
  quantise_kernel<D><<<dim3(p.ws.blocks, heads, with_dout ? 4 : 3), kQuantThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
  if (p.smooth_q) {
    query_bias_kernel<D><<<dim3(ceil_div(p.ws.Tp, kBiasThreads), p.ws.blocks, heads), kBiasThreads, 0,
                           stream>>>(p);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

size_t sage_workspace_bytes(const SageOptions& opt, const AttentionShape& s) {
  Carver c(nullptr);
  carve(opt, s, c);
  return c.used();
}

SageWorkspace sage_workspace(const SageOptions& opt, const AttentionShape& s, void* base) {
  Carver c(base);
  return carve(opt, s, c);
}

SageCopies sage_copies(const SageOptions& opt, bool backward) {
  const SagePrecision& pr = opt.precision;
  // A product at int8 reads the natural (over d) or the transposed (over T)
  // int8 copy of its operand; at bf16 the bf16 copy, on either side.
  const auto read = [](OperandCopies& c, Precision x, bool over_d) {
    if (x == Precision::bf16)
      c.bf = true;
    else
      (over_d ? c.i8 : c.i8t) = true;
  };
  const OperandCopies none{false, false, false};
  SageCopies c{none, none, none, none};
  read(c.q, pr.qk, true);  // S = Q̂ K̂ᵀ, in the forward and again in the backward
  read(c.k, pr.qk, true);
  if (!backward) {
    read(c.v, pr.pv, false);  // O += P̂ V̂
    return c;
  }
  read(c.v, pr.dp, true);  // dP = dÔ V̂ᵀ
  read(c.dout, pr.dp, true);
  read(c.dout, pr.dv, false);  // dV += P̂ᵀ dÔ
  read(c.q, pr.dk, false);     // dK += dŜᵀ Q̂
  read(c.k, pr.dq, false);     // dQ += dŜ K̂
  return c;
}

void sage_quantise(const SageOptions& opt, const AttentionShape& s, const bf16* qkv, const bf16* o,
                   const bf16* dout, const SageWorkspace& ws, const SageCopies& copies, cudaStream_t stream) {
  const QuantiseParams p{qkv, o, dout, ws, copies, s.B, s.H, s.T, 1.0f / std::sqrt(static_cast<float>(s.d)),
                         opt.smooth_q, opt.smooth_k};
  const bool with_dout = dout != nullptr;
  if (s.d == 64) return quantise<64>(p, with_dout, stream);
  return quantise<128>(p, with_dout, stream);
}

}  // namespace qattn::cuda
