// SageBwd's quantisation pre-pass (quant.cuh): four kernels, then launchers.
//   key_block_sums   Σ of K per block and channel, in row order (smooth_k)
//   key_mean         μ_K = Σ of the block sums in block order / T, once per head
//                    (smooth_k; fixed orders: deterministic)
//   quantise         one block of every operand of the pass: smoothing, ψ, the
//                    copies (forward Q, K, V; backward dO and δ)
//   query_bias       smooth_q's fp32 bias c·μ_Qi·(K_j − μ_K), one row per query block
// An operand's natural copy (read by S = Q̂ K̂ᵀ for c·(Q − μ_Q) and K − μ_K, by
// dP = dÔ V̂ᵀ for V and dO) and its transposed copy (read by dK, dQ, O and dV)
// each hold e4m3 values on power-of-two block scales (docs/attention-maths.md
// §4.12) where that product is fp8, else ψ's int8 levels: `scale` is the
// natural copy's, `t_scale` the transposed one's (its own array where the two
// differ, QuantOperand). Under dq or dk = fp8 the passes also write what dS's
// bounds are made of: the forward's ‖V_t‖ and its block maxima, from the V it
// stages anyway, the backward's ‖dO_t‖ and its and |δ_t|'s block maxima.
//
// The block kernels move a 64-row block as 16-byte chunks of 8 bf16: thread i
// owns channels 8(i mod d/8) … +7 of rows i / (d/8) + k·(256 / (d/8)), the same
// channels for every k, so a warp reads whole 128/256-byte rows.
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>

#include "attention/common/pipeline.cuh"  // cp.async, launch
#include "attention/phases.cuh"
#include "attention/sage/quant.cuh"

namespace qattn::cuda {
namespace {

using flash::cp_async_16;
using flash::cp_async_commit;
using flash::cp_async_wait;

constexpr int kQuantThreads = 256;

struct QuantiseParams {
  const bf16* qkv;   // (B, T, 3, H, d)
  const bf16* o;     // (B, T, H, d), backward only
  const bf16* dout;  // (B, T, H, d), backward only
  SageWorkspace ws;
  SageCopies copies;
  int B, H, T;
  float c;  // 1 / sqrt(d)
  bool smooth_q, smooth_k;
  // Which copies hold e4m3, per operand (0 c·(Q − μ_Q), 1 K − μ_K, 2 V, 3 dO):
  // the natural one (qk for Q and K, dp for V and dO), the transposed one (dk,
  // dq, pv, dv).
  bool natural_fp8[4], transposed_fp8[4];
  bool ds_bounds;  // dq or dk = fp8: the norms and maxima of dS's bounds
};

// A block of kSageBlock rows of d channels as 16-byte chunks over kQuantThreads threads.
template <int D>
struct BlockChunks {
  static constexpr int kPerRow = D / 8;                     // chunks in a row: 16 or 8
  static constexpr int kRowStep = kQuantThreads / kPerRow;  // rows between a thread's chunks
  static constexpr int kPerThread = kSageBlock / kRowStep;  // chunks per thread: 4 or 2
  // The levels tile in shared memory for the transposed copy: rows of d + 4
  // bytes (an odd number of words) and 32 more bytes after each 16 rows, so that
  // write_transposed's reads (4 groups x 8 channel quads per warp) hit 32 banks
  // and the rows' writes stay free of conflicts.
  static constexpr int kLevelRow = D + 4;
  static constexpr int kLevelBytes = kSageBlock * kLevelRow + 32 * (kSageBlock / 16);
  __device__ static int level_offset(int r) { return r * kLevelRow + 32 * (r / 16); }
  static_assert(kQuantThreads % kPerRow == 0 && kSageBlock % kRowStep == 0 && 32 % kPerRow == 0);
  __device__ static int channel0() { return 8 * (threadIdx.x % kPerRow); }
  __device__ static int row(int k) { return threadIdx.x / kPerRow + k * kRowStep; }
};

// Row t of slot (0 q, 1 k, 2 v) of head h, batch b in (B, T, 3, H, d).
__device__ __forceinline__ const bf16* qkv_row(const QuantiseParams& p, int D, int b, int t,
                                               int slot, int h) {
  return p.qkv + ((static_cast<size_t>(b) * p.T + t) * 3 + slot) * p.H * D +
         static_cast<size_t>(h) * D;
}
// Row t of head h, batch b in (B, T, H, d).
__device__ __forceinline__ const bf16* head_row(const bf16* x, const QuantiseParams& p, int D,
                                                int b, int t, int h) {
  return x + (static_cast<size_t>(b) * p.T + t) * p.H * D + static_cast<size_t>(h) * D;
}
// This thread's chunk k of a block whose row 0 is x_row0 and whose rows are
// row_stride apart; zeros past its `rows` valid rows (nothing read there).
template <int D>
__device__ __forceinline__ Bf16x8 load_chunk(const bf16* x_row0, size_t row_stride, int rows,
                                             int k) {
  using C = BlockChunks<D>;
  const int r = C::row(k);
  if (r < rows) return load8(x_row0 + r * row_stride + C::channel0());
  Bf16x8 zero;
#pragma unroll
  for (int i = 0; i < 8; ++i) zero.v[i] = __float2bfloat16(0.0f);
  return zero;
}

// Σ over the kPerRow threads of a row (BlockChunks) of each one's `sum`, the
// same on all of them: a butterfly of shuffles.
template <int D>
__device__ __forceinline__ float row_sum(float sum) {
#pragma unroll
  for (int offset = BlockChunks<D>::kPerRow / 2; offset > 0; offset >>= 1)
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  return sum;
}
// √(Σ of x²) over a row: this thread's 8 channels in order, then row_sum.
template <int D>
__device__ __forceinline__ float row_norm(const float (&x)[8]) {
  float sq = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) sq += x[e] * x[e];
  return sqrtf(row_sum<D>(sq));
}

// Σ over rows [0, rows) of channel `col` of a (kSageBlock, D) bf16 tile, in row order.
template <int D>
__device__ __forceinline__ float column_sum(const bf16* tile, int rows, int col) {
  float sum = 0.0f;
  for (int r = 0; r < rows; ++r) sum += __bfloat162float(tile[r * D + col]);
  return sum;
}

// Grid (blocks, B·H): column sums of K over the block's valid rows.
template <int D>
__global__ void __launch_bounds__(kQuantThreads) key_block_sums_kernel(const QuantiseParams p) {
  using C = BlockChunks<D>;
  __shared__ __align__(16) bf16 tile[kSageBlock * D];  // (64, d) the block of K, zero past T
  const int blk = blockIdx.x, bh = blockIdx.y, b = bh / p.H, h = bh % p.H;
  const int t0 = blk * kSageBlock, rows = min(kSageBlock, p.T - t0);
  const bf16* k_row0 = qkv_row(p, D, b, t0, 1, h);
  const size_t stride = static_cast<size_t>(3) * p.H * D;
#pragma unroll
  for (int k = 0; k < C::kPerThread; ++k)
    store8(tile + C::row(k) * D + C::channel0(), load_chunk<D>(k_row0, stride, rows, k));
  __syncthreads();
  if (threadIdx.x < D)
    p.ws.key_block_sums[(static_cast<size_t>(bh) * p.ws.blocks + blk) * D + threadIdx.x] =
        column_sum<D>(tile, rows, threadIdx.x);
}

// Grid (B·H), d threads: μ_K = Σ of the block sums in block order / T.
template <int D>
__global__ void __launch_bounds__(D) key_mean_kernel(const QuantiseParams p) {
  const int bh = blockIdx.x, col = threadIdx.x;
  const float* sums = p.ws.key_block_sums + static_cast<size_t>(bh) * p.ws.blocks * D + col;
  float mu = 0.0f;
  for (int k = 0; k < p.ws.blocks; ++k) mu += sums[static_cast<size_t>(k) * D];
  p.ws.key_mean[static_cast<size_t>(bh) * D + col] = mu / static_cast<float>(p.T);
}

// The transposed copy of a block from its levels in shared memory
// (BlockChunks::level_offset): dst (d, ld) from the block's first column,
// position p of each 16-group holding row kPermuted(p). Thread (group g,
// channels 4q … 4q+3), d of them, reads the 16 rows' words of its 4 channels,
// transposes the bytes 4 x 4 and writes each channel's 16 positions as one
// 16-byte store; the four groups of a quad are neighbouring lanes, so a warp's
// store writes 64 contiguous bytes of each of 8 channels.
template <int D>
__device__ __forceinline__ void write_transposed(const int8_t* levels, int8_t* dst, int ld) {
  using C = BlockChunks<D>;
  const int quad = threadIdx.x / 4, group = threadIdx.x % 4;
  uint32_t column[4][4];  // [channel 4q + j][word w]: positions 4w … 4w+3 of the group
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    uint32_t row_word[4];  // rows kPermuted(4w + i), channels 4q … 4q+3
#pragma unroll
    for (int i = 0; i < 4; ++i)
      row_word[i] = *reinterpret_cast<const uint32_t*>(
          levels + C::level_offset(16 * group + kPermuted(4 * w + i)) + 4 * quad);
    // Byte j of row_word[i] -> byte i of column[j][w]: interleave rows 0, 1 and
    // rows 2, 3 (bytes a0 b0 a1 b1 and a2 b2 a3 b3), then pair the halves.
    const uint32_t lo01 = __byte_perm(row_word[0], row_word[1], 0x5140);
    const uint32_t hi01 = __byte_perm(row_word[0], row_word[1], 0x7362);
    const uint32_t lo23 = __byte_perm(row_word[2], row_word[3], 0x5140);
    const uint32_t hi23 = __byte_perm(row_word[2], row_word[3], 0x7362);
    column[0][w] = __byte_perm(lo01, lo23, 0x5410);
    column[1][w] = __byte_perm(lo01, lo23, 0x7632);
    column[2][w] = __byte_perm(hi01, hi23, 0x5410);
    column[3][w] = __byte_perm(hi01, hi23, 0x7632);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j)
    *reinterpret_cast<uint4*>(dst + static_cast<size_t>(4 * quad + j) * ld + 16 * group) =
        make_uint4(column[j][0], column[j][1], column[j][2], column[j][3]);
}

// The tiles one quantise CTA stages: the pass's operands (forward c·Q, K, V;
// backward dO) and in the backward O, for δ, and V where its bf16 copy is the
// backward's to write (sage_backward_copies). dS's bounds take ‖V_t‖ from the
// forward's V tile, so the backward never stages V for them.
constexpr int kStagedTiles = 3;

// Shared memory of quantise_kernel: the staged tiles as loaded (zero past T),
// the levels of the operand being transposed, the mean being subtracted, each
// operand's per-warp maxima.
template <int D>
struct QuantiseSmem {
  bf16 tile[kStagedTiles][kSageBlock * D];     // (64, d) each
  int8_t levels[BlockChunks<D>::kLevelBytes];  // X̂ (64, d), padded (level_offset), for i8t
  float mean[D];
  float warp_amax[3][kQuantThreads / 32];
  // dS's bounds per warp: max ‖V_t‖ (forward); max ‖dO_t‖, |δ_t| (backward)
  float warp_bound_max[2][kQuantThreads / 32];
};

// Grid (blocks, B·H): one block of rows of one head, every operand of the pass
// (forward: operands 0 c·(Q − μ_Q), 1 K − μ_K, 2 V; backward: 3 dO and δ).
// All of the block's tiles are copied into shared memory at once (cp.async,
// one group per tile), so a CTA has them all in flight; then operand by operand:
// the smoothing, ψ's scale, the natural copies, the transposed one. A thread
// reads the chunks it copied itself (BlockChunks), so only the block-wide
// reductions meet at barriers. Padded rows are zero in every copy.
template <int D, bool kGradient>
__global__ void __launch_bounds__(kQuantThreads) quantise_kernel(const QuantiseParams p) {
  using C = BlockChunks<D>;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  QuantiseSmem<D>& sm = *reinterpret_cast<QuantiseSmem<D>*>(smem_bytes);
  const int blk = blockIdx.x, bh = blockIdx.y, b = bh / p.H, h = bh % p.H;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int t0 = blk * kSageBlock, rows = min(kSageBlock, p.T - t0), ch0 = C::channel0();
  const SageWorkspace& ws = p.ws;

  // Staged tile i: operand i (forward) or dO, O, V (backward; V only for its copy).
  const bool copy_v = kGradient && p.copies.v.bf;  // uniform over the grid
  auto source_row0 = [&](int i) {
    if (kGradient && i < 2) return head_row(i == 0 ? p.dout : p.o, p, D, b, t0, h);
    return qkv_row(p, D, b, t0, kGradient ? 2 : i, h);
  };
#pragma unroll
  for (int i = 0; i < kStagedTiles; ++i) {
    if (kGradient && i == 2 && !copy_v) break;
    const bf16* x_row0 = source_row0(i);
    const size_t stride =
        static_cast<size_t>(kGradient && i < 2 ? 1 : 3) * p.H * D;  // between rows
#pragma unroll
    for (int k = 0; k < C::kPerThread; ++k) {
      const int r = C::row(k);
      cp_async_16(sm.tile[i] + r * D + ch0, x_row0 + (r < rows ? r : 0) * stride + ch0, r < rows);
    }
    cp_async_commit();
  }

  auto quantise_operand = [&](auto tile_index, int which) {
    constexpr int i = decltype(tile_index)::value;
    const QuantOperand out = which == 0 ? ws.q : which == 1 ? ws.k : which == 2 ? ws.v : ws.dout;
    const OperandCopies copies = which == 0   ? p.copies.q
                                 : which == 1 ? p.copies.k
                                 : which == 2 ? p.copies.v
                                              : p.copies.dout;
    const bool smooth_q = which == 0 && p.smooth_q, smooth_k = which == 1 && p.smooth_k;
    cp_async_wait<kGradient ? 0 : kStagedTiles - 1 - i>();  // this thread's copies of tile i have
                                                            // landed
    float x[C::kPerThread][8];  // this thread's chunks, then smoothed and scaled
#pragma unroll
    for (int k = 0; k < C::kPerThread; ++k) {
      const Bf16x8 loaded = load8(sm.tile[i] + C::row(k) * D + ch0);
#pragma unroll
      for (int e = 0; e < 8; ++e) x[k][e] = __bfloat162float(loaded.v[e]);
    }

    // The block's largest of each of n per-row values, from each warp's
    // largest (bound_max): after a barrier, n threads, into out[m · stride].
    auto block_max = [&](float* bound_max, int n, float* out, int stride) {
      for (int m = 0; m < n; ++m) {
        bound_max[m] = warp_max(bound_max[m]);
        if (lane == 0) sm.warp_bound_max[m][warp] = bound_max[m];
      }
      __syncthreads();
      if (threadIdx.x < n) {
        float top = 0.0f;
        for (int w = 0; w < kQuantThreads / 32; ++w)
          top = fmaxf(top, sm.warp_bound_max[threadIdx.x][w]);
        out[threadIdx.x * stride] = top;
      }
    };
    const size_t row0 = static_cast<size_t>(bh) * ws.Tp + t0;  // of (B·H, Tp)
    // Padded rows are zeros: their norms and δ are 0, which changes no max.
    if (kGradient) {  // δ = rowsum(dO ∘ O): the row's kPerRow threads sum their chunks
      // (dq or dk = fp8: also ‖dO_t‖, and the block's maxima of it and |δ_t|)
      float bound_max[2] = {0.0f, 0.0f};
#pragma unroll
      for (int k = 0; k < C::kPerThread; ++k) {
        const Bf16x8 o = load8(sm.tile[1] + C::row(k) * D + ch0);  // padded rows: x = o = 0, δ = 0
        float sum = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) sum += x[k][e] * __bfloat162float(o.v[e]);
        sum = row_sum<D>(sum);
        const size_t row = row0 + C::row(k);
        if (ch0 == 0) ws.delta[row] = sum;
        if (!p.ds_bounds) continue;  // uniform over the grid
        const float do_norm = row_norm<D>(x[k]);
        if (ch0 == 0) ws.do_norm[row] = do_norm;
        bound_max[0] = fmaxf(bound_max[0], do_norm);
        bound_max[1] = fmaxf(bound_max[1], fabsf(sum));
      }
      if (p.ds_bounds)
        block_max(bound_max, 2, ws.backward_block_max + (ws.head_block0(bh) + blk) * 2, 1);
    } else if (which == 2 && p.ds_bounds) {  // ‖V_t‖ and the block's max of it
      float bound_max[1] = {0.0f};
#pragma unroll
      for (int k = 0; k < C::kPerThread; ++k) {
        const float v_norm = row_norm<D>(x[k]);
        if (ch0 == 0) ws.v_norm[row0 + C::row(k)] = v_norm;
        bound_max[0] = fmaxf(bound_max[0], v_norm);
      }
      block_max(bound_max, 1, ws.v_norm_block_max + ws.head_block0(bh) + blk, 1);
    }

    // docs/attention-maths.md §4.2-§4.3: μ_K over all T tokens (key_mean_kernel), read per
    // thread; μ_Q over the block's valid rows in row order, from the staged tile.
    float mu[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // the mean of this thread's channels
    if (smooth_k) {
#pragma unroll
      for (int e = 0; e < 8; ++e) mu[e] = ws.key_mean[static_cast<size_t>(bh) * D + ch0 + e];
    } else if (smooth_q) {  // uniform over the grid
      __syncthreads();      // every thread's copies of the Q tile
      for (int col = threadIdx.x; col < D; col += kQuantThreads) {
        const float m = column_sum<D>(sm.tile[i], rows, col) / static_cast<float>(rows);
        ws.query_mean[(ws.head_block0(bh) + blk) * D + col] = m;
        sm.mean[col] = m;
      }
      __syncthreads();
#pragma unroll
      for (int e = 0; e < 8; ++e) mu[e] = sm.mean[ch0 + e];
    }
    if (which == 1 && !p.smooth_k && blk == 0)
      for (int col = threadIdx.x; col < D; col += kQuantThreads)
        ws.key_mean[static_cast<size_t>(bh) * D + col] = 0.0f;

    // Step 3: the quantised value is c·(Q − μ_Q) for Q, X − μ for the others.
    const float mult = which == 0 ? p.c : 1.0f;
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < C::kPerThread; ++k) {
      if (C::row(k) >= rows) continue;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        x[k][e] = (x[k][e] - mu[e]) * mult;
        amax = fmaxf(amax, fabsf(x[k][e]));
      }
    }
    amax = warp_max(amax);
    if (lane == 0) sm.warp_amax[i][warp] = amax;
    __syncthreads();  // also: the previous operand's transpose has read the levels
    amax = 0.0f;
#pragma unroll
    for (int w = 0; w < kQuantThreads / 32; ++w) amax = fmaxf(amax, sm.warp_amax[i][w]);
    const bool fp8 = p.natural_fp8[which], t_fp8 = p.transposed_fp8[which];  // uniform
    const float int8_scale = amax == 0.0f ? 1.0f : amax / 127.0f;
    const float scale = fp8 ? fp8_block_scale(amax) : int8_scale;
    const float t_scale = t_fp8 ? fp8_block_scale(amax) : int8_scale;
    if (threadIdx.x == 0) {
      out.scale[ws.head_block0(bh) + blk] = scale;
      if (t_fp8 != fp8) out.t_scale[ws.head_block0(bh) + blk] = t_scale;
    }

    // The natural copies, one 16-byte (bf16) or 8-byte (int8) store per chunk;
    // the levels also into shared memory for the transposed copy.
    const size_t natural0 = (static_cast<size_t>(bh) * ws.Tp + t0) * D;  // row t0 of (B·H, Tp, d)
    // `level` makes the bytes of the copies it is given (natural, transposed).
    auto write_copies = [&](auto level, bool natural, bool transposed) {
#pragma unroll
      for (int k = 0; k < C::kPerThread; ++k) {
        const int r = C::row(k);
        if (natural && copies.bf) store8_f32(out.bf + natural0 + r * D + ch0, x[k]);
        const bool i8 = natural && copies.i8, i8t = transposed && copies.i8t;
        if (!i8 && !i8t) continue;
        uint32_t word[2];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          word[half] = 0;
#pragma unroll
          for (int e = 0; e < 4; ++e) word[half] |= level(x[k][4 * half + e]) << (8 * e);
        }
        if (i8)
          *reinterpret_cast<uint2*>(out.i8 + natural0 + r * D + ch0) = make_uint2(word[0], word[1]);
        if (i8t) {
          uint32_t* level_row = reinterpret_cast<uint32_t*>(sm.levels + C::level_offset(r) + ch0);
          level_row[0] = word[0];
          level_row[1] = word[1];
        }
      }
    };
    // x / s is exact (a power of two), e4m3's rounding the only one.
    auto e4m3_level = [](float s) {
      const float inv_s = s == 0.0f ? 0.0f : 1.0f / s;
      return [inv_s](float v) {
        return static_cast<uint32_t>(__nv_cvt_float_to_fp8(v * inv_s, __NV_SATFINITE, __NV_E4M3));
      };
    };
    // The copies of one precision at once (both where they share it).
    auto write_at = [&](bool e4m3, bool natural, bool transposed) {
      if (e4m3) {
        write_copies(e4m3_level(fp8_block_scale(amax)), natural, transposed);
      } else if (int8_scale >= kReciprocalScaleMin) {  // uniform over the block
        const float inv_scale = __frcp_rn(int8_scale);
        write_copies([&](float v) { return quantise_level(v, int8_scale, inv_scale); }, natural,
                     transposed);
      } else {
        write_copies([&](float v) { return quantise_level_by_division(v, int8_scale); }, natural,
                     transposed);
      }
    };
    if (fp8 == t_fp8) {
      write_at(fp8, true, true);
    } else {
      write_at(fp8, true, false);
      write_at(t_fp8, false, true);
    }
    if (!copies.i8t) return;
    __syncthreads();
    if (threadIdx.x < D)
      write_transposed<D>(sm.levels, out.i8t + static_cast<size_t>(bh) * D * ws.Tp + t0, ws.Tp);
  };
  if constexpr (kGradient) {
    quantise_operand(std::integral_constant<int, 0>{}, 3);
    if (copy_v) {  // V's bf16 copy as loaded (padded rows zero); wait_group 0 above covered its
                   // tile
      const size_t natural0 = (static_cast<size_t>(bh) * ws.Tp + t0) * D;
#pragma unroll
      for (int k = 0; k < C::kPerThread; ++k)
        store8(ws.v.bf + natural0 + C::row(k) * D + ch0, load8(sm.tile[2] + C::row(k) * D + ch0));
    }
  } else {
    quantise_operand(std::integral_constant<int, 0>{}, 0);
    quantise_operand(std::integral_constant<int, 1>{}, 1);
    quantise_operand(std::integral_constant<int, 2>{}, 2);
  }
}

// smooth_q's bias of every query block and key of one head is a product,
// bias (blocks, Tp) = c · μ_Q (blocks, d) · (K − μ_K)ᵀ (d, Tp), 0 past T. Grid
// (Tp / 64, ceil(blocks / 64), B·H): a block of 256 threads makes 64 query blocks
// x 64 keys, each thread 4 x 4 of them, over d in chunks of 32 columns staged
// column-major in shared memory, so that a thread's 4 means and 4 keys of a
// column are one 16-byte load each (8 FFMA per load); the next chunk is read
// from global memory while this one is multiplied. Each sum takes the columns
// in order, one FFMA each: a sequential fp32 GEMV's arithmetic. Not cuBLASLt:
// its fp32 products take fp32 for both operands, and K is bf16 in qkv (an fp32
// copy of K − μ_K would be written and read once more). (One thread per key
// reading its K row column by column, re-read per query block, took 9.4 ms at
// (4, 16, 4096, 128): 14x the forward without smooth_q.)
constexpr int kBiasTile = 64, kBiasChunk = 32, kBiasThreads = 256;
// A staged column's rows are XOR-swizzled by 8 per group of 8 columns: the 4
// threads that stage one row's 32 columns then store to 4 banks, not one, and a
// thread's 4 consecutive rows stay one 16-byte load.
__device__ __forceinline__ int bias_swizzle(int col, int row) {
  return row ^ (8 * ((col / 8) % 4));
}
template <int D>
__global__ void __launch_bounds__(kBiasThreads) query_bias_kernel(const QuantiseParams p) {
  static_assert(kSageBlock % kBiasTile == 0 && D % kBiasChunk == 0, "Tp is whole tiles");
  __shared__ __align__(16) float means[kBiasChunk][kBiasTile];  // (chunk, 64 query blocks) of μ_Q
  __shared__ __align__(16) float keys[kBiasChunk][kBiasTile];   // (chunk, 64 keys) of K − μ_K
  const int bh = blockIdx.z, b = bh / p.H, h = bh % p.H;
  const int t0 = blockIdx.x * kBiasTile, qb0 = blockIdx.y * kBiasTile;
  const SageWorkspace& ws = p.ws;
  const float* mu_k = ws.key_mean + static_cast<size_t>(bh) * D;  // (d)
  const float* mu_q = ws.query_mean + ws.head_block0(bh) * D;     // (blocks, d)
  // Staging: thread i copies 8 columns of key t0 + i / 4 and of query block qb0 + i / 4.
  const int stage_row = threadIdx.x / 4, stage_col = 8 * (threadIdx.x % 4);
  const int t_stage = t0 + stage_row, qb_stage = qb0 + stage_row;
  const bf16* k_row = t_stage < p.T ? qkv_row(p, D, b, t_stage, 1, h) : nullptr;
  const float* mean_row = qb_stage < ws.blocks ? mu_q + static_cast<size_t>(qb_stage) * D : nullptr;
  float k[8], m[8];  // the staged columns of the next chunk; zeros past T and past the last block
  auto read_columns = [&](int c0) {
    const int col = c0 + stage_col;
    const Bf16x8 x = k_row ? load8(k_row + col) : Bf16x8{};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      k[i] = k_row ? __bfloat162float(x.v[i]) - mu_k[col + i] : 0.0f;
      m[i] = mean_row ? mean_row[col + i] : 0.0f;
    }
  };
  const int ty = threadIdx.x / 16,
            tx = threadIdx.x % 16;  // query blocks qb0 + 4 ty …, keys t0 + 4 tx …
  float acc[4][4] = {};
  read_columns(0);
  for (int c0 = 0; c0 < D; c0 += kBiasChunk) {
    __syncthreads();  // the previous chunk's reads are done
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      keys[stage_col + i][bias_swizzle(stage_col + i, stage_row)] = k[i];
      means[stage_col + i][bias_swizzle(stage_col + i, stage_row)] = m[i];
    }
    __syncthreads();
    if (c0 + kBiasChunk < D) read_columns(c0 + kBiasChunk);
#pragma unroll 8
    for (int cc = 0; cc < kBiasChunk; ++cc) {
      const float4 mq = *reinterpret_cast<const float4*>(&means[cc][bias_swizzle(cc, 4 * ty)]);
      const float4 kt = *reinterpret_cast<const float4*>(&keys[cc][bias_swizzle(cc, 4 * tx)]);
      const float mv[4] = {mq.x, mq.y, mq.z, mq.w}, kv[4] = {kt.x, kt.y, kt.z, kt.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(mv[i], kv[j], acc[i][j]);
    }
  }
  const int t = t0 + 4 * tx;  // Tp is whole blocks: the four keys are inside it
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int qb = qb0 + 4 * ty + i;
    if (qb >= ws.blocks) continue;
    float4 out;
    out.x = t < p.T ? p.c * acc[i][0] : 0.0f;
    out.y = t + 1 < p.T ? p.c * acc[i][1] : 0.0f;
    out.z = t + 2 < p.T ? p.c * acc[i][2] : 0.0f;
    out.w = t + 3 < p.T ? p.c * acc[i][3] : 0.0f;
    *reinterpret_cast<float4*>(ws.query_bias + (ws.head_block0(bh) + qb) * ws.Tp + t) = out;
  }
}

// The saved buffer's or the scratch's parts, 256-byte aligned, from `base` (null: offsets only).
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

// V's bf16 copy is the forward's (in the saved buffer) when the forward reads
// it, pv = bf16; else the backward's (scratch), for an mma.sync kernel (quant.cuh).
bool v_bf16_is_the_forwards(const SageOptions& opt) { return opt.precision.pv == Precision::bf16; }

// Operand x's copies named in `copies`, each (B·H, Tp, d), and its block scales.
// own_t_scale: one of the natural and the transposed copy is e4m3, the other
// int8 levels (QuantOperand::t_scale).
void carve_operand(QuantOperand& x, const OperandCopies& copies, size_t n, size_t scales, Carver& c,
                   bool own_t_scale = false) {
  x.i8 = copies.i8 ? c.take<int8_t>(n) : nullptr;
  x.i8t = copies.i8t ? c.take<int8_t>(n) : nullptr;
  x.bf = copies.bf ? c.take<bf16>(n) : nullptr;
  x.scale = c.take<float>(scales);
  x.t_scale = own_t_scale ? c.take<float>(scales) : x.scale;
}

SageWorkspace carve(const SageOptions& opt, const AttentionShape& s, const SageCopies& copies,
                    Carver& saved, Carver& scratch) {
  SageWorkspace ws{};
  ws.blocks = ceil_div(s.T, kSageBlock);
  ws.Tp = ws.blocks * kSageBlock;
  const size_t heads = static_cast<size_t>(s.B) * s.H, n = heads * ws.Tp * s.d,
               scales = heads * ws.blocks;
  const SagePrecision& pr = opt.precision;
  auto fp8 = [](Precision x) { return x == Precision::fp8; };
  const bool dq_fp8 = fp8(pr.dq), dk_fp8 = fp8(pr.dk);
  carve_operand(ws.q, copies.q, n, scales, saved, fp8(pr.qk) != dk_fp8);
  carve_operand(ws.k, copies.k, n, scales, saved, fp8(pr.qk) != dq_fp8);
  const bool v_bf_saved = v_bf16_is_the_forwards(opt);
  carve_operand(ws.v, {copies.v.i8, copies.v.i8t, copies.v.bf && v_bf_saved}, n, scales, saved,
                fp8(pr.dp) != fp8(pr.pv));
  ws.key_block_sums = opt.smooth_k ? saved.take<float>(heads * ws.blocks * s.d) : nullptr;
  ws.key_mean = saved.take<float>(heads * s.d);
  ws.query_mean = opt.smooth_q ? saved.take<float>(heads * ws.blocks * s.d) : nullptr;
  ws.query_bias = opt.smooth_q ? saved.take<float>(heads * ws.blocks * ws.Tp) : nullptr;
  if (dq_fp8 || dk_fp8) {
    ws.v_norm = saved.take<float>(heads * ws.Tp);
    ws.v_norm_block_max = saved.take<float>(heads * ws.blocks);
  }
  if (copies.v.bf && !v_bf_saved) ws.v.bf = scratch.take<bf16>(n);
  carve_operand(ws.dout, copies.dout, n, scales, scratch, fp8(pr.dp) != fp8(pr.dv));
  ws.delta = scratch.take<float>(heads * ws.Tp);
  if (dq_fp8 || dk_fp8) {
    ws.do_norm = scratch.take<float>(heads * ws.Tp);
    ws.backward_block_max = scratch.take<float>(heads * ws.blocks * 2);
  }
  ws.row_terms = opt.softmax ? scratch.take<float>(heads * ws.Tp * 4) : nullptr;
  return ws;
}

QuantiseParams quantise_params(const SageOptions& opt, const AttentionShape& s, const bf16* qkv,
                               const bf16* o, const bf16* dout, const SageWorkspace& ws,
                               const SageCopies& copies) {
  const SagePrecision& pr = opt.precision;
  auto fp8 = [](Precision x) { return x == Precision::fp8; };
  QuantiseParams p{};
  p.qkv = qkv, p.o = o, p.dout = dout;
  p.ws = ws;
  p.copies = copies;
  p.B = s.B, p.H = s.H, p.T = s.T;
  p.c = 1.0f / std::sqrt(static_cast<float>(s.d));
  p.smooth_q = opt.smooth_q, p.smooth_k = opt.smooth_k;
  const bool natural[4] = {fp8(pr.qk), fp8(pr.qk), fp8(pr.dp), fp8(pr.dp)};
  const bool transposed[4] = {fp8(pr.dk), fp8(pr.dq), fp8(pr.pv), fp8(pr.dv)};
  for (int i = 0; i < 4; ++i) p.natural_fp8[i] = natural[i], p.transposed_fp8[i] = transposed[i];
  p.ds_bounds = fp8(pr.dq) || fp8(pr.dk);
  return p;
}

// The bytes each launch below moves (PhaseWork): every array it reads or
// writes, once.
struct PassBytes {
  const QuantiseParams& p;
  int D;
  // One (B, T, H, d) bf16 activation: Q, K, V in qkv, O, dO.
  double activation() const { return 2.0 * p.B * p.T * p.H * D; }
  // n floats per head.
  double floats(double n) const { return 4.0 * p.B * p.H * n; }
  // One (B·H, Tp, d) copy of n-byte elements.
  double copy(int bytes) const { return static_cast<double>(bytes) * p.B * p.H * p.ws.Tp * D; }
  // The copies of x named in c and its scales (two arrays where x's differ).
  double copies(const QuantOperand& x, const OperandCopies& c) const {
    return (c.i8 ? copy(1) : 0) + (c.i8t ? copy(1) : 0) + (c.bf ? copy(2) : 0) +
           floats(p.ws.blocks) * (x.t_scale != x.scale ? 2 : 1);
  }
  // K in, the block sums out.
  double key_block_sums() const { return activation() + floats(p.ws.blocks * D); }
  double key_mean() const { return floats(p.ws.blocks * D) + floats(D); }
  // Q, K, V in, their copies out; μ_K in (smooth_k) or its zeros out, μ_Q out
  // (smooth_q), ‖V_t‖ and its block maxima out (dS's bounds).
  double quantise_inputs() const {
    const SageWorkspace& ws = p.ws;
    return 3 * activation() + copies(ws.q, p.copies.q) + copies(ws.k, p.copies.k) +
           copies(ws.v, p.copies.v) + floats(D) + (p.smooth_q ? floats(ws.blocks * D) : 0) +
           (p.ds_bounds ? floats(ws.Tp + ws.blocks) : 0);
  }
  // dO, O and (for its copy) V in; dO's copies, δ, V's bf16 copy, ‖dO_t‖ and
  // the block maxima of it and |δ_t| out.
  double quantise_gradient() const {
    return (p.copies.v.bf ? 3 : 2) * activation() + copies(p.ws.dout, p.copies.dout) +
           (p.copies.v.bf ? copy(2) : 0) + floats(p.ws.Tp) +
           (p.ds_bounds ? floats(p.ws.Tp + 2 * p.ws.blocks) : 0);
  }
  // K, μ_Q and μ_K in, the bias out.
  double query_bias() const {
    return activation() + floats(p.ws.blocks * D) + floats(D) +
           floats(static_cast<double>(p.ws.blocks) * p.ws.Tp);
  }
};

template <int D>
void quantise_inputs(const QuantiseParams& p, cudaStream_t stream, PhaseRecorder* phases) {
  const int heads = p.B * p.H;
  const PassBytes bytes{p, D};
  if (p.smooth_k) {
    in_phase(phases, "key_block_sums", {bytes.key_block_sums()}, stream, [&] {
      key_block_sums_kernel<D><<<dim3(p.ws.blocks, heads), kQuantThreads, 0, stream>>>(p);
      CUDA_CHECK_LAUNCH();
    });
    in_phase(phases, "key_mean", {bytes.key_mean()}, stream, [&] {
      key_mean_kernel<D><<<heads, D, 0, stream>>>(p);
      CUDA_CHECK_LAUNCH();
    });
  }
  in_phase(phases, "quantise_qkv", {bytes.quantise_inputs()}, stream, [&] {
    flash::launch(quantise_kernel<D, false>, dim3(p.ws.blocks, heads), kQuantThreads,
                  sizeof(QuantiseSmem<D>), stream, p);
  });
  if (p.smooth_q)
    in_phase(phases, "query_bias", {bytes.query_bias()}, stream, [&] {
      query_bias_kernel<D><<<dim3(p.ws.Tp / kBiasTile, ceil_div(p.ws.blocks, kBiasTile), heads),
                             kBiasThreads, 0, stream>>>(p);
      CUDA_CHECK_LAUNCH();
    });
}

template <int D>
void quantise_gradient(const QuantiseParams& p, cudaStream_t stream, PhaseRecorder* phases) {
  in_phase(phases, "quantise_dout", {PassBytes{p, D}.quantise_gradient()}, stream, [&] {
    flash::launch(quantise_kernel<D, true>, dim3(p.ws.blocks, p.B * p.H), kQuantThreads,
                  sizeof(QuantiseSmem<D>), stream, p);
  });
}

}  // namespace

size_t sage_saved_bytes(const SageOptions& opt, const AttentionShape& s, const SageCopies& copies) {
  Carver saved(nullptr), scratch(nullptr);
  carve(opt, s, copies, saved, scratch);
  return saved.used();
}

size_t sage_workspace_bytes(const SageOptions& opt, const AttentionShape& s,
                            const SageCopies& copies) {
  Carver saved(nullptr), scratch(nullptr);
  carve(opt, s, copies, saved, scratch);
  return scratch.used();
}

SageWorkspace sage_workspace(const SageOptions& opt, const AttentionShape& s, void* saved,
                             void* scratch, const SageCopies& copies) {
  Carver saved_carver(saved), scratch_carver(scratch);
  return carve(opt, s, copies, saved_carver, scratch_carver);
}

SageCopies sage_copies(const SageOptions& opt) {
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
  read(c.v, pr.pv, false);  // O += P̂ V̂
  read(c.v, pr.dp, true);   // dP = dÔ V̂ᵀ
  read(c.dout, pr.dp, true);
  read(c.dout, pr.dv, false);  // dV += P̂ᵀ dÔ
  read(c.q, pr.dk, false);     // dK += dŜᵀ Q̂
  read(c.k, pr.dq, false);     // dQ += dŜ K̂
  return c;
}

SageCopies sage_forward_copies(const SageOptions& opt) {
  SageCopies c = sage_copies(opt);
  c.v.bf = c.v.bf && v_bf16_is_the_forwards(opt);
  c.dout = {false, false, false};
  return c;
}

SageCopies sage_backward_copies(const SageOptions& opt, bool in_place) {
  const SageCopies all = sage_copies(opt);
  const OperandCopies none{false, false, false};
  SageCopies c{none, none, none, all.dout};
  c.v.bf = all.v.bf && !v_bf16_is_the_forwards(opt) && !in_place;
  c.dout.bf = all.dout.bf && !in_place;
  return c;
}

void sage_quantise_inputs(const SageOptions& opt, const AttentionShape& s, const bf16* qkv,
                          const SageWorkspace& ws, const SageCopies& copies, cudaStream_t stream,
                          PhaseRecorder* phases) {
  const QuantiseParams p = quantise_params(opt, s, qkv, nullptr, nullptr, ws, copies);
  if (s.d == 64) return quantise_inputs<64>(p, stream, phases);
  return quantise_inputs<128>(p, stream, phases);
}

void sage_quantise_gradient(const SageOptions& opt, const AttentionShape& s, const bf16* qkv,
                            const bf16* o, const bf16* dout, const SageWorkspace& ws,
                            const SageCopies& copies, cudaStream_t stream, PhaseRecorder* phases) {
  const QuantiseParams p = quantise_params(opt, s, qkv, o, dout, ws, copies);
  if (s.d == 64) return quantise_gradient<64>(p, stream, phases);
  return quantise_gradient<128>(p, stream, phases);
}

}  // namespace qattn::cuda
