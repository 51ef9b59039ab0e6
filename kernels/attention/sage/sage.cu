// SageBwd INT8 attention (docs/attention-maths.md §4): the flash recurrences of flash_skeleton.cuh
// over operands that the pre-pass (quant.cu) has quantised per 64-row block.
// Kernels first, launchers after.
//
// Why these kernels are not instantiations of flash_skeleton.cuh: the skeleton
// loads bf16 tiles of Q, K, V, dO from the activations into fixed shared-memory
// slots; SageBwd's operands come from the workspace, in int8 or bf16 per product
// at run time (six precision flags, one kernel per head dim), with per-block
// scales, and the int8 weight products need T-transposed copies. What they share
// is used as is: the warp tile primitives (tile_mma.cuh) and the online softmax
// policy (online_softmax.cuh). The Softmax template parameter (sage_softmax.cuh)
// is plain SageBwd's exact softmax or the K-interval composition (§6).
//
// Tiles (SageTraits): kWarps warps x 16 rows resident (64 or 128 rows: one or
// two quantisation blocks), 64-row steps: every step and every warp's rows lie
// in one quantisation block, so each product has one scale per operand (times
// the row/column scales of P̂ and dŜ). The launchers pick the warps per kernel
// and head dim (SageTiles, sage.cuh).
//   forward   per query block, key blocks 0 .. diagonal:
//             S = Q̂K̂ᵀ·s_Q·s_K (+ smooth_q bias) -> mask -> online softmax ->
//             O += ψ_row(P̃)·V̂ · s_P·s_V;  O /= l, L = m + log l
//             (K-interval: a first pass over the keys for each row's max and
//             min; then P̃ = ŵ, O /= Ẑ, the row's RowStats saved instead of L)
//   dQ        per query block, key blocks 0 .. diagonal: P, dP, dS (below);
//             dQ += c·ψ(dS)·K̂ (K-interval: a first sweep over the keys for
//             the row terms ḡ, dL/dm, dL/dℓ, saved for the dK/dV kernel)
//   dK, dV    per key block, query blocks diagonal .. end, transposed tiles
//             (keys x queries) so Pᵀ, dSᵀ are A operands straight from registers:
//             Pᵀ = exp(Sᵀ − L); dV += ψ(Pᵀ)·dÔ; dPᵀ = V·dOᵀ; dSᵀ = Pᵀ ∘ (dPᵀ − δ);
//             dK += ψ(dSᵀ)·Q̂ (+ smooth_q: c·(dSᵀ1)·μ_Qᵀ)
// ψ of Pᵀ and dS: one scale per row of the warp's tile (= per key for dV and dK,
// per query for dQ: "rowcol"), or one per 64x64 tile ("tile").
// On Hopper the forward and the dQ kernel with the default precisions run on
// wgmma instead (sage_forward_sm90.cuh, sage_dq_sm90.cuh), chosen at run time
// (SageTiles, sage.cuh); they share this file's per-element helpers.
// Deterministic: every output element has one writer; sums run in a fixed order.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "attention/common/online_softmax.cuh"
#include "attention/common/pipeline.cuh"
#include "attention/common/tile_mma.cuh"
#include "attention/phases.cuh"
#include "attention/sage/int8_operands.cuh"
#include "attention/sage/quant.cuh"
#include "attention/sage/sage.cuh"
#include "attention/sage/sage_dkdv_sm90.cuh"
#include "attention/sage/sage_dq_sm90.cuh"
#include "attention/sage/sage_forward_sm90.cuh"
#include "attention/sage/sage_softmax.cuh"

namespace qattn::cuda {
namespace {

using namespace flash;
using namespace sage;

constexpr int kTile = kSageBlock;           // rows of a step: one quantisation block
constexpr int kTileN = kTile / 8;           // 8-column accumulator tiles across a step
constexpr int kWarpsPerBlock = kTile / 16;  // warps whose rows form one quantisation block

// A kernel's shape: kWarps warps of 16 rows hold kRows resident rows (queries,
// or keys in the dK/dV kernel), kBlocks quantisation blocks.
template <int kHeadDim, int kWarps_>
struct SageTraits {
  static constexpr int D = kHeadDim, kWarps = kWarps_, kThreads = 32 * kWarps_;
  static constexpr int kRows = 16 * kWarps_, kBlocks = kRows / kTile;
  static_assert(kRows % kTile == 0, "resident rows must be whole quantisation blocks");
};

struct SageParams {
  SageWorkspace ws;
  float* stats_out;    // (B, H, T, Softmax::kStatFloats) written by the forward (L, or RowStats)
  const float* stats;  // the same, read by the backward
  float* row_terms;    // (B, H, Tp, Softmax::kTermFloats) the backward's row terms: the
                       // pre-pass's δ, or the K-interval dQ kernel's row sweep
  SoftmaxOptions softmax;  // the softmax block (K-interval composition)
  bf16* o;                 // (B, T, H, d), forward
  bf16* dqkv;              // (B, T, 3, H, d), backward
  const bf16* qkv;         // (B, T, 3, H, d), backward: V read in place by the wgmma kernels
  const bf16* dout;        // (B, T, H, d), backward: read in place by the wgmma kernels
  int B, H, T;
  float c;  // 1 / sqrt(d)
  // Precision of each product (the keys of docs/attention-maths.md §4.7): true = int8, false =
  // bf16, or fp8 where the fp8 flag says so (on the wgmma kernels alone).
  bool qk8, pv8, dv8, dp8, dq8, dk8;
  bool qk_fp8, pv_fp8, dv_fp8, dp_fp8, dq_fp8, dk_fp8;
  bool tile_scales;  // bwd_granularity "tile": one scale per 64x64 tile of P and dS
  bool smooth_q;     // add the bias to S and the dK correction
};

// Bytes of a tile in shared memory: (kRows, d) for products over d (S, dP),
// (d, 64) transposed for products over T (int8 only: bf16 keeps (64, d)).
template <int D, int kRows = kTile>
__host__ __device__ constexpr int natural_bytes(bool int8) {
  return int8 ? Int8Tile<kRows, D>::kBytes : kRows * D * 2;
}
template <int D>
__host__ __device__ constexpr int transposed_bytes(bool int8) {
  return int8 ? Int8Tile<D, kTile>::kBytes : kTile * D * 2;
}

// Shared-memory layout of a kernel whose slot sizes depend on the precisions:
// kResident slots, then two stages of kStaged slots (double buffering).
template <int kResident, int kStaged>
struct SmemPlan {
  int resident[kResident], staged[kStaged];  // byte offsets; staged[] in stage 0
  int stage_bytes = 0, total = 0;
  __host__ __device__ SmemPlan(const int (&resident_bytes)[kResident],
                               const int (&staged_bytes)[kStaged]) {
    int at = 0;
    for (int i = 0; i < kResident; ++i) resident[i] = at, at += resident_bytes[i];
    for (int i = 0; i < kStaged; ++i) staged[i] = at + stage_bytes, stage_bytes += staged_bytes[i];
    total = at + 2 * stage_bytes;
  }
  __host__ __device__ int slot(int stage, int i) const { return staged[i] + stage * stage_bytes; }
};

// forward: resident Q (qk); staged K (qk), V (pv)
template <class Tr>
__host__ __device__ SmemPlan<1, 2> forward_plan(const SageParams& p) {
  constexpr int D = Tr::D;
  return SmemPlan<1, 2>({natural_bytes<D, Tr::kRows>(p.qk8)},
                        {natural_bytes<D>(p.qk8), transposed_bytes<D>(p.pv8)});
}
// dK/dV: resident K (qk), V (dp); staged Q (qk), Q (dk), dO (dp), dO (dv), the
// queries' saved statistics and row terms
template <class Tr, class Softmax>
__host__ __device__ SmemPlan<2, 6> dkdv_plan(const SageParams& p) {
  constexpr int D = Tr::D;
  return SmemPlan<2, 6>({natural_bytes<D, Tr::kRows>(p.qk8), natural_bytes<D, Tr::kRows>(p.dp8)},
                        {natural_bytes<D>(p.qk8), transposed_bytes<D>(p.dk8),
                         natural_bytes<D>(p.dp8), transposed_bytes<D>(p.dv8),
                         kTile * 4 * Softmax::kStatFloats, kTile * 4 * Softmax::kTermFloats});
}
// dQ: resident Q (qk), dO (dp); staged K (qk), K (dq), V (dp)
template <class Tr>
__host__ __device__ SmemPlan<2, 3> dq_plan(const SageParams& p) {
  constexpr int D = Tr::D;
  return SmemPlan<2, 3>(
      {natural_bytes<D, Tr::kRows>(p.qk8), natural_bytes<D, Tr::kRows>(p.dp8)},
      {natural_bytes<D>(p.qk8), transposed_bytes<D>(p.dq8), natural_bytes<D>(p.dp8)});
}

// Blocks [blk, blk + kRows / 64) of operand x of head bh into a slot, as the
// product reading it wants. A block past the last repeats the last one: the
// rows of a resident tile past T are computed on and never stored.
template <int D, int kThreads, int kRows = kTile>
__device__ __forceinline__ void load_natural(unsigned char* slot, const QuantOperand& x, bool int8,
                                             const SageWorkspace& ws, int bh, int blk) {
#pragma unroll
  for (int part = 0; part < kRows / kTile; ++part) {
    const int block = min(blk + part, ws.blocks - 1);
    const size_t row0 = static_cast<size_t>(bh) * ws.Tp + static_cast<size_t>(block) * kTile;
    unsigned char* part_slot = slot + part * natural_bytes<D>(int8);
    if (int8)
      load_int8_tile_async<kThreads>(Int8Tile<kTile, D>{reinterpret_cast<int8_t*>(part_slot)},
                                     x.i8 + row0 * D, D);
    else
      load_tile_async<kThreads>(SmemTile<kTile, D>{reinterpret_cast<bf16*>(part_slot)},
                                x.bf + row0 * D, D, kTile);
  }
}
template <int D, int kThreads>
__device__ __forceinline__ void load_transposed(unsigned char* slot, const QuantOperand& x,
                                                bool int8, const SageWorkspace& ws, int bh,
                                                int blk) {
  if (int8)
    load_int8_tile_async<kThreads>(
        Int8Tile<D, kTile>{reinterpret_cast<int8_t*>(slot)},
        x.i8t + static_cast<size_t>(bh) * D * ws.Tp + static_cast<size_t>(blk) * kTile, ws.Tp);
  else
    load_natural<D, kThreads>(slot, x, false, ws, bh, blk);
}

// acc (16, 64) = rows [row0, row0 + 16) of the resident tile a (kRowsA rows)
// times the staged tile bᵀ, over d: S or dP (transposed in the dK/dV pass).
// int8: times the two block scales `scale`.
template <int D, int kRowsA>
__device__ __forceinline__ void product_over_d(float (&acc)[1][kTileN][4], bool int8,
                                               unsigned char* a, int row0, unsigned char* b,
                                               float scale) {
  if (int8) {
    int8_product_nk(acc, Int8Tile<kRowsA, D>{reinterpret_cast<int8_t*>(a)}, row0,
                    Int8Tile<kTile, D>{reinterpret_cast<int8_t*>(b)}, scale);
  } else {
    // The resident tile is kRowsA / 64 tiles of 64 rows (load_natural): read row0's.
    const SmemTile<kTile, D> a_part{reinterpret_cast<bf16*>(a) + (row0 / kTile) * kTile * D};
    zero(acc);
    mma_rows_b_nk(acc, a_part, row0 % kTile, SmemTile<kTile, D>{reinterpret_cast<bf16*>(b)});
  }
}

// acc (16, d) += w (16, 64) · tile b, over the 64 rows of the tile: O += P V,
// dV += Pᵀ dO, dK += dSᵀ Q, dQ += dS K. int8: w quantised per row of the warp
// (or per 64 x 64 tile) and the product times that scale and scale_b. With
// per_tile every thread of the CTA calls it (the scale is a reduction over warps).
template <int D>
__device__ __forceinline__ void product_over_t(float (&acc)[1][D / 8][4], bool int8,
                                               const float (&w)[1][kTileN][4], bool per_tile,
                                               float* scratch, unsigned char* b, float scale_b) {
  if (int8) {
    float scale[2], inv[2];
    weight_scales<kWarpsPerBlock>(w, per_tile, scratch, scale, inv);
    int8_product_weights(acc, w, scale, inv, Int8Tile<D, kTile>{reinterpret_cast<int8_t*>(b)},
                         scale_b);
  } else {
    mma_weights_kn(acc, w, SmemTile<kTile, D>{reinterpret_cast<bf16*>(b)});
  }
}

// Rows [t0, t0 + kRows) of slot (0 q, 1 k, 2 v) of head h in dqkv, or of o, from
// a staged bf16 tile; rows past T are skipped.
template <int kThreads, int kRows, int D>
__device__ __forceinline__ void store_rows(SmemTile<kRows, D> tile, bf16* base, size_t ld, int t0,
                                           int T) {
  store_tile<kThreads>(tile, base + static_cast<size_t>(t0) * ld, ld, T - t0);
}

// ---------------------------------------------------------------------------
// Forward. Grid (query tiles, B·H); every head's heaviest (last) query tile starts
// first (block_by_rank).
template <class Tr, class Softmax>
__global__ void __launch_bounds__(Tr::kThreads) sage_forward_kernel(const SageParams p) {
  constexpr int D = Tr::D, kThreads = Tr::kThreads;
  extern __shared__ __align__(128) unsigned char smem[];
  const SmemPlan<1, 2> plan = forward_plan<Tr>(p);
  const SageWorkspace& ws = p.ws;
  const BlockIndex at = last_first(block_by_rank());  // grid (tiles, B H): at.h is b H + h
  const int q_tile = at.block, bh = at.h, b = bh / p.H, h = bh % p.H;
  const int q0 = q_tile * Tr::kRows;
  const int row0 = (threadIdx.x / 32) * 16;  // the warp's first row in the tile
  const int first_query = q0 + row0;         // of the warp
  // The warp's quantisation block (a block past the last: the last, see load_natural).
  const int q_block = min(first_query / kTile, ws.blocks - 1);
  const int key_blocks =
      min(ws.blocks, (q0 + Tr::kRows - 1) / kTile + 1);  // up to the tile's diagonal
  unsigned char* q_slot = smem + plan.resident[0];
  auto k_slot = [&](int s) { return smem + plan.slot(s, 0); };
  auto v_slot = [&](int s) { return smem + plan.slot(s, 1); };
  auto load_k = [&](int j, int s) { load_natural<D, kThreads>(k_slot(s), ws.k, p.qk8, ws, bh, j); };
  auto load_kv = [&](int j, int s) {
    load_k(j, s);
    load_transposed<D, kThreads>(v_slot(s), ws.v, p.pv8, ws, bh, j);
  };
  // Key block j holds no key the warp's rows see: every score masked, nothing to add.
  auto masked_for_warp = [&](int j) { return j * kTile > first_query + 15; };

  load_natural<D, kThreads, Tr::kRows>(q_slot, ws.q, p.qk8, ws, bh, q_tile * Tr::kBlocks);
  const size_t scale0 = ws.head_block0(bh);
  const float* scale_k = ws.k.scale + scale0;
  const float* scale_v = ws.v.t_scale + scale0;  // of V̂ᵀ
  const float scale_q = ws.q.scale[scale0 + q_block];
  const float* bias = p.smooth_q ? ws.query_bias + (scale0 + q_block) * ws.Tp : nullptr;
  // s (16, 64) = the scores of key block j, masked entries −inf.
  auto scores = [&](float(&s)[1][kTileN][4], int j, int stage) {
    product_over_d<D, Tr::kRows>(s, p.qk8, q_slot, row0, k_slot(stage), scale_q * scale_k[j]);
    bias_and_mask(s, bias, j * kTile, first_query);
  };

  float o_acc[1][D / 8][4];  // (16, d) rows of O owned by this warp
  zero(o_acc);
  Softmax softmax(p.softmax);
  if constexpr (Softmax::kCalibrates) {  // pass 1: each row's max and min, then its grid
    pipelined(0, key_blocks, load_k, [&](int j, int stage) {
      if (masked_for_warp(j)) return;
      float s[1][kTileN][4];
      scores(s, j, stage);
      softmax.observe(s, j * kTile);
    });
    softmax.calibrate();
  }
  pipelined(0, key_blocks, load_kv, [&](int j, int stage) {
    if (masked_for_warp(j)) return;
    float s[1][kTileN][4];
    scores(s, j, stage);
    softmax.update(s, o_acc);  // s now holds P̃ = exp(S − m), or ŵ
    product_over_t<D>(o_acc, p.pv8, s, false, nullptr, v_slot(stage), scale_v[j]);
  });

  softmax.finalize(o_acc);
  softmax.store(p.stats_out + static_cast<size_t>(bh) * p.T * Softmax::kStatFloats, first_query,
                p.T);
  const SmemTile<Tr::kRows, D> o_tile{reinterpret_cast<bf16*>(smem)};  // every slot is free now
  store_acc(o_tile, o_acc, row0, 1.0f);
  __syncthreads();
  store_rows<kThreads>(o_tile,
                       p.o + static_cast<size_t>(b) * p.T * p.H * D + static_cast<size_t>(h) * D,
                       static_cast<size_t>(p.H) * D, q0, p.T);
}

// ---------------------------------------------------------------------------
// dK, dV. Grid (key tiles, B·H); tile 0, which sees every query, starts first.
template <class Tr, class Softmax>
__global__ void __launch_bounds__(Tr::kThreads) sage_backward_dkdv_kernel(const SageParams p) {
  constexpr int D = Tr::D, kThreads = Tr::kThreads;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ float scratch[2][Tr::kWarps];  // per-tile scales of Pᵀ and dSᵀ
  const SmemPlan<2, 6> plan = dkdv_plan<Tr, Softmax>(p);
  const SageWorkspace& ws = p.ws;
  const BlockIndex at = block_by_rank();  // grid (tiles, B H): at.h is b H + h
  const int k_tile = at.block, bh = at.h, b = bh / p.H, h = bh % p.H;
  const int k0 = k_tile * Tr::kRows;
  const int row0 = (threadIdx.x / 32) * 16;  // the warp's first key in the tile
  // The warp's quantisation block (a block past the last: the last, see load_natural).
  const int k_block = min((k0 + row0) / kTile, ws.blocks - 1);
  unsigned char* k_slot = smem + plan.resident[0];
  unsigned char* v_slot = smem + plan.resident[1];
  auto q_slot = [&](int s) { return smem + plan.slot(s, 0); };    // Q̂ for Sᵀ
  auto qt_slot = [&](int s) { return smem + plan.slot(s, 1); };   // Q̂ for dK
  auto do_slot = [&](int s) { return smem + plan.slot(s, 2); };   // dO for dPᵀ
  auto dot_slot = [&](int s) { return smem + plan.slot(s, 3); };  // dÔ for dV
  auto stats_slot = [&](int s) { return reinterpret_cast<float*>(smem + plan.slot(s, 4)); };
  auto terms_slot = [&](int s) { return reinterpret_cast<float*>(smem + plan.slot(s, 5)); };
  constexpr int kStat = Softmax::kStatFloats, kTerm = Softmax::kTermFloats;
  const float* stats_src = p.stats + static_cast<size_t>(bh) * p.T * kStat;        // (T, kStat)
  const float* terms_src = p.row_terms + static_cast<size_t>(bh) * ws.Tp * kTerm;  // (Tp, kTerm)
  auto load_queries = [&](int i, int s) {
    load_natural<D, kThreads>(q_slot(s), ws.q, p.qk8, ws, bh, i);
    load_transposed<D, kThreads>(qt_slot(s), ws.q, p.dk8, ws, bh, i);
    load_natural<D, kThreads>(do_slot(s), ws.dout, p.dp8, ws, bh, i);
    load_transposed<D, kThreads>(dot_slot(s), ws.dout, p.dv8, ws, bh, i);
    load_row_values_async<kThreads, kTile * kStat>(stats_slot(s), stats_src + i * kTile * kStat,
                                                   (p.T - i * kTile) * kStat);
    load_row_values_async<kThreads, kTile * kTerm>(terms_slot(s), terms_src + i * kTile * kTerm,
                                                   kTile * kTerm);
  };

  load_natural<D, kThreads, Tr::kRows>(k_slot, ws.k, p.qk8, ws, bh, k_tile * Tr::kBlocks);
  load_natural<D, kThreads, Tr::kRows>(v_slot, ws.v, p.dp8, ws, bh, k_tile * Tr::kBlocks);
  const size_t scale0 = ws.head_block0(bh);
  const float s_k = ws.k.scale[scale0 + k_block], s_v = ws.v.scale[scale0 + k_block];

  const Softmax softmax(p.softmax);

  float dk_acc[1][D / 8][4], dv_acc[1][D / 8][4];  // (16, d) rows of dK, dV owned by this warp
  zero(dk_acc);
  zero(dv_acc);
  // Causal: earlier query blocks see none of these keys.
  pipelined(k0 / kTile, ws.blocks, load_queries, [&](int i, int s) {
    const int q0 = i * kTile;
    const float s_q = ws.q.scale[scale0 + i], s_do = ws.dout.scale[scale0 + i];
    const float* stats = stats_slot(s);
    const float* terms = terms_slot(s);
    // The bias of the warp's keys (c·μ_Qi·(K − μ_K)), from its block's first key.
    const float* bias = p.smooth_q
                            ? ws.query_bias + (scale0 + i) * ws.Tp + k_block * kTile + row0 % kTile
                            : nullptr;
    auto query_row = [&](int qi) {
      return Softmax::load_row(stats + qi * kStat, terms + qi * kTerm);
    };
    auto visible = [&](int key, int query) { return query < p.T && key <= query; };
    // The warp's last key sees the step's first query, and every query is real.
    const bool all_visible = k0 + row0 + 15 <= q0 && q0 + kTile <= p.T;
    float score[1][kTileN][4];  // (16 keys, 64 queries): Sᵀ
    product_over_d<D, Tr::kRows>(score, p.qk8, k_slot, row0, q_slot(s), s_k * s_q);
    if (bias) add_row_key_bias(score, bias);
    float w[1][kTileN][4];  // (16 keys, 64 queries): Pᵀ, then dSᵀ
    with_mask(all_visible, [&](auto unmasked) {
#pragma unroll
      for (int nt = 0; nt < kTileN; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = k0 + row0 + frag_row(e), qi = frag_col(nt, e);
          w[0][nt][e] = unmasked || visible(key, q0 + qi)
                            ? softmax.probability(query_row(qi), score[0][nt][e])
                            : 0.0f;
        }
    });
    product_over_t<D>(dv_acc, p.dv8, w, p.tile_scales, scratch[0], dot_slot(s),
                      ws.dout.t_scale[scale0 + i]);
    float dp[1][kTileN][4];  // (16 keys, 64 queries): dPᵀ
    product_over_d<D, Tr::kRows>(dp, p.dp8, v_slot, row0, do_slot(s), s_v * s_do);
    with_mask(all_visible, [&](auto unmasked) {
#pragma unroll
      for (int nt = 0; nt < kTileN; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = k0 + row0 + frag_row(e), qi = frag_col(nt, e);
          w[0][nt][e] =
              unmasked || visible(key, q0 + qi)
                  ? softmax.grad(query_row(qi), score[0][nt][e], w[0][nt][e], dp[0][nt][e], key)
                  : 0.0f;
        }
    });
    product_over_t<D>(dk_acc, p.dk8, w, p.tile_scales, scratch[1], qt_slot(s),
                      ws.q.t_scale[scale0 + i]);
    if (p.smooth_q) {  // dK_j += c (dSᵀ 1) μ_Qiᵀ, from the unquantised dS
      float row_sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int nt = 0; nt < kTileN; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) row_sum[e / 2] += w[0][nt][e];
      row_sum[0] = row_sum4(row_sum[0]);
      row_sum[1] = row_sum4(row_sum[1]);
      const float* mu_q = ws.query_mean + (scale0 + i) * D;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          dk_acc[0][dt][e] += p.c * row_sum[e / 2] * mu_q[frag_col(dt, e)];
    }
  });

  // Every slot is free: stage dK (Q̂ carried c) and dV, then store both.
  const SmemTile<Tr::kRows, D> dk_tile{reinterpret_cast<bf16*>(smem)};
  const SmemTile<Tr::kRows, D> dv_tile{dk_tile.data + Tr::kRows * D};
  store_acc(dk_tile, dk_acc, row0, 1.0f);
  store_acc(dv_tile, dv_acc, row0, 1.0f);
  __syncthreads();
  const size_t ld = static_cast<size_t>(3) * p.H * D;
  bf16* head = p.dqkv + static_cast<size_t>(b) * p.T * ld + static_cast<size_t>(h) * D;
  store_rows<kThreads>(dk_tile, head + static_cast<size_t>(p.H) * D, ld, k0, p.T);
  store_rows<kThreads>(dv_tile, head + static_cast<size_t>(2) * p.H * D, ld, k0, p.T);
}

// ---------------------------------------------------------------------------
// dQ. Grid (query tiles, B·H); every head's heaviest (last) query tile starts
// first (block_by_rank).
template <class Tr, class Softmax>
__global__ void __launch_bounds__(Tr::kThreads) sage_backward_dq_kernel(const SageParams p) {
  constexpr int D = Tr::D, kThreads = Tr::kThreads;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ float scratch[Tr::kWarps];  // per-tile scale of dS
  const SmemPlan<2, 3> plan = dq_plan<Tr>(p);
  const SageWorkspace& ws = p.ws;
  const BlockIndex at = last_first(block_by_rank());  // grid (tiles, B H): at.h is b H + h
  const int q_tile = at.block, bh = at.h, b = bh / p.H, h = bh % p.H;
  const int q0 = q_tile * Tr::kRows;
  const int row0 = (threadIdx.x / 32) * 16;  // the warp's first row in the tile
  // The warp's quantisation block (a block past the last: the last, see load_natural).
  const int q_block = min((q0 + row0) / kTile, ws.blocks - 1);
  const int key_blocks =
      min(ws.blocks, (q0 + Tr::kRows - 1) / kTile + 1);  // up to the tile's diagonal
  unsigned char* q_slot = smem + plan.resident[0];
  unsigned char* do_slot = smem + plan.resident[1];
  auto k_slot = [&](int s) { return smem + plan.slot(s, 0); };   // K̂ for S
  auto kt_slot = [&](int s) { return smem + plan.slot(s, 1); };  // K̂ for dQ
  auto v_slot = [&](int s) { return smem + plan.slot(s, 2); };   // V for dP
  auto load_scores = [&](int j, int s) {                         // what S and dP read
    load_natural<D, kThreads>(k_slot(s), ws.k, p.qk8, ws, bh, j);
    load_natural<D, kThreads>(v_slot(s), ws.v, p.dp8, ws, bh, j);
  };
  auto load_keys = [&](int j, int s) {
    load_scores(j, s);
    load_transposed<D, kThreads>(kt_slot(s), ws.k, p.dq8, ws, bh, j);
  };

  load_natural<D, kThreads, Tr::kRows>(q_slot, ws.q, p.qk8, ws, bh, q_tile * Tr::kBlocks);
  load_natural<D, kThreads, Tr::kRows>(do_slot, ws.dout, p.dp8, ws, bh, q_tile * Tr::kBlocks);
  const size_t scale0 = ws.head_block0(bh);
  const float s_q = ws.q.scale[scale0 + q_block], s_do = ws.dout.scale[scale0 + q_block];
  const float* bias = p.smooth_q ? ws.query_bias + (scale0 + q_block) * ws.Tp : nullptr;
  constexpr int kStat = Softmax::kStatFloats, kTerm = Softmax::kTermFloats;
  float* terms = p.row_terms + static_cast<size_t>(bh) * ws.Tp * kTerm;  // (Tp, kTerm)
  const Softmax softmax(p.softmax);

  typename Softmax::Row rows[2];  // with a row sweep the terms are made below
  load_rows<Softmax>(rows, p.stats + static_cast<size_t>(bh) * p.T * kStat, terms, q0 + row0, p.T);
  // score, dp (16 queries, 64 keys) = S and dP of key block j.
  auto scores_and_dp = [&](float(&score)[1][kTileN][4], float(&dp)[1][kTileN][4], int j, int s) {
    product_over_d<D, Tr::kRows>(score, p.qk8, q_slot, row0, k_slot(s),
                                 s_q * ws.k.scale[scale0 + j]);
    add_key_bias(score, bias, j * kTile);
    product_over_d<D, Tr::kRows>(dp, p.dp8, do_slot, row0, v_slot(s),
                                 s_do * ws.v.scale[scale0 + j]);
  };

  if constexpr (Softmax::kRowPass) {  // the row terms, before any dS is quantised
    typename Softmax::RowSums sums[2];
    pipelined(0, key_blocks, load_scores, [&](int j, int s) {
      float score[1][kTileN][4], dp[1][kTileN][4];
      scores_and_dp(score, dp, j, s);
      softmax.sweep(sums, score, dp, rows, j * kTile, q0 + row0, p.T);
    });
    softmax.make_terms(rows, sums, terms, q0 + row0, p.T, ws.Tp);
  }

  float dq_acc[1][D / 8][4];  // (16, d) rows of dQ owned by this warp
  zero(dq_acc);
  pipelined(0, key_blocks, load_keys, [&](int j, int s) {
    float score[1][kTileN][4], dp[1][kTileN][4];  // (16 queries, 64 keys): S, dP
    scores_and_dp(score, dp, j, s);
    float w[1][kTileN][4];  // (16 queries, 64 keys): dS
    score_grads(w, score, dp, softmax, rows, j * kTile, q0 + row0, p.T);
    product_over_t<D>(dq_acc, p.dq8, w, p.tile_scales, scratch, kt_slot(s),
                      ws.k.t_scale[scale0 + j]);
  });

  const SmemTile<Tr::kRows, D> dq_tile{reinterpret_cast<bf16*>(smem)};  // every slot is free now
  store_acc(dq_tile, dq_acc, row0, p.c);
  __syncthreads();
  const size_t ld = static_cast<size_t>(3) * p.H * D;
  store_rows<kThreads>(dq_tile,
                       p.dqkv + static_cast<size_t>(b) * p.T * ld + static_cast<size_t>(h) * D, ld,
                       q0, p.T);
}

// ---------------------------------------------------------------------------
// Launchers.

// The pre-passes write the quantised operands into the saved buffer (forward)
// and the scratch (backward), and the kernels read them with 16-byte copies:
// null or misaligned is a caller's bug. `what` names the buffer and the
// function that sizes it.
void require_buffer(const void* buffer, size_t bytes, const char* what) {
  if (buffer == nullptr || reinterpret_cast<uintptr_t>(buffer) % 256 != 0)
    throw std::invalid_argument("CUDA attention kind sage: " + std::string(what) + " " +
                                std::string(buffer ? "is not 256-byte aligned" : "is null") +
                                " (needs " + std::to_string(bytes) + " bytes, 256-byte aligned)");
}

// The kernels' parameters, once the options and the buffers are known to be
// usable; scratch null in the forward (which has none).
SageParams make_params(const SageOptions& opt, const AttentionShape& s, void* saved,
                       void* scratch) {
  sage_check_options(opt);
  const SageCopies copies = sage_copies(opt);
  require_buffer(saved, sage_saved_bytes(opt, s, copies), "saved buffer (attention_saved_bytes)");
  SageParams p{};
  p.ws = sage_workspace(opt, s, saved, scratch, copies);
  p.B = s.B, p.H = s.H, p.T = s.T;
  p.c = 1.0f / std::sqrt(static_cast<float>(s.d));
  const SagePrecision& pr = opt.precision;
  p.qk8 = pr.qk == Precision::int8, p.pv8 = pr.pv == Precision::int8,
  p.dv8 = pr.dv == Precision::int8;
  p.dp8 = pr.dp == Precision::int8, p.dq8 = pr.dq == Precision::int8,
  p.dk8 = pr.dk == Precision::int8;
  p.qk_fp8 = pr.qk == Precision::fp8, p.dp_fp8 = pr.dp == Precision::fp8;
  p.pv_fp8 = pr.pv == Precision::fp8, p.dv_fp8 = pr.dv == Precision::fp8;
  p.dq_fp8 = pr.dq == Precision::fp8, p.dk_fp8 = pr.dk == Precision::fp8;
  p.tile_scales = opt.bwd_granularity == BwdGranularity::tile;
  p.smooth_q = opt.smooth_q;
  p.row_terms = opt.softmax ? p.ws.row_terms : p.ws.delta;
  if (opt.softmax) {
    const KIntervalOptions& k = *opt.softmax;
    SoftmaxOptions& sm = p.softmax;
    sm.fwm = k.calibration == Calibration::fwm;
    sm.grid = {static_cast<float>(k.K), 1.0f / static_cast<float>(k.K), sm.fwm ? -INFINITY : 0.0f};
    sm.rule = kinterval::rule_of(k);
    sm.window = static_cast<float>(k.window);
    sm.mask_window = sm.fwm && k.ste_window_mask;
    sm.detach = k.detach_extrema;
  }
  return p;
}

// Calls run(warps) with warps as a compile-time 4 or 8 (checked by check_tiles).
template <class Run>
void with_warps(int warps, Run&& run) {
  if (warps == 8) return run(std::integral_constant<int, 8>{});
  run(std::integral_constant<int, 4>{});
}

void check_tiles(const SageTiles& tiles) {
  for (const auto& [kernel, warps] : {std::pair<const char*, int>{"forward", tiles.forward},
                                      {"dq", tiles.dq},
                                      {"dkdv", tiles.dkdv}})
    if (warps != 4 && warps != 8)
      throw std::invalid_argument(std::string("CUDA attention kind sage: SageTiles.") + kernel +
                                  " = " + std::to_string(warps) + " warps (allowed: 4, 8)");
}

// Dynamic shared memory of a kernel: its plan, and at least the output tiles
// staged through it at the end (nOut tiles of (kRows, d) bf16).
template <class Tr, int nOut, int R, int S>
int smem_bytes(const SmemPlan<R, S>& plan) {
  return std::max(plan.total, nOut * Tr::kRows * Tr::D * 2);
}
template <class Tr>
dim3 grid_of(const SageParams& p) {
  return dim3(ceil_div(p.ws.blocks, Tr::kBlocks), p.B * p.H);
}

// Whether a kernel runs on wgmma (SageTiles::forward_kernels, dq_kernels, dkdv_kernels; sage.cuh):
// `requested` where the wgmma kernel can run the options (`supported`), named
// by `field` and `allowed` when a wgmma request cannot be met.
bool on_wgmma(FpaKernels requested, bool supported, const char* field, const std::string& allowed) {
  if (requested == FpaKernels::wgmma && !supported)
    throw std::invalid_argument(std::string("CUDA attention kind sage: SageTiles.") + field +
                                " = wgmma: the wgmma kernel runs only " + allowed);
  return supported && resolve_kernels(requested, "CUDA attention kind sage") == FpaKernels::wgmma;
}

bool fp8(Precision x) { return x == Precision::fp8; }
bool eight_bit(Precision x) { return x != Precision::bf16; }  // int8 or fp8

// The keys of the products each kernel runs; the first of them at fp8, or null:
// the kernel then runs on wgmma, the fp8 products' only family.
using Key = std::pair<const char*, Precision SagePrecision::*>;
const char* fp8_key(const SagePrecision& pr, std::initializer_list<Key> keys) {
  for (const auto& [name, member] : keys)
    if (fp8(pr.*member)) return name;
  return nullptr;
}
constexpr Key kQk{"qk", &SagePrecision::qk}, kPv{"pv", &SagePrecision::pv},
    kDp{"dp", &SagePrecision::dp}, kDv{"dv", &SagePrecision::dv}, kDq{"dq", &SagePrecision::dq},
    kDk{"dk", &SagePrecision::dk};
const char* forward_fp8_key(const SagePrecision& pr) { return fp8_key(pr, {kQk, kPv}); }
const char* dq_fp8_key(const SagePrecision& pr) { return fp8_key(pr, {kQk, kDp, kDq}); }
const char* dkdv_fp8_key(const SagePrecision& pr) { return fp8_key(pr, {kQk, kDp, kDv, kDk}); }

std::string granularity_name(const SageOptions& opt) {
  return opt.bwd_granularity == BwdGranularity::tile ? "tile" : "rowcol";
}
// What each wgmma kernel runs (sage.cuh), and the options it was given.
std::string forward_allowed(const SageOptions& opt) {
  const SagePrecision& pr = opt.precision;
  return "attention.sage.precision.qk and pv each int8 or fp8 (got qk = " + to_string(pr.qk) +
         ", pv = " + to_string(pr.pv) + ")";
}
std::string dq_allowed(const SageOptions& opt) {
  const SagePrecision& pr = opt.precision;
  return "attention.sage.precision.qk = int8 or fp8, and dq = fp8 or dq = int8 with "
         "bwd_granularity rowcol (got qk = " +
         to_string(pr.qk) + ", dq = " + to_string(pr.dq) + ", bwd_granularity " +
         granularity_name(opt) + ")";
}
std::string dkdv_allowed(const SageOptions& opt) {
  const SagePrecision& pr = opt.precision;
  return "attention.sage.precision.qk, dv and dk each int8 or fp8, dk = fp8 only with dv = fp8, "
         "and bwd_granularity rowcol unless dv = dk = fp8 (got qk = " +
         to_string(pr.qk) + ", dv = " + to_string(pr.dv) + ", dk = " + to_string(pr.dk) +
         ", bwd_granularity " + granularity_name(opt) + ")";
}

// The fp8 products run on the wgmma kernels only.
void require_wgmma_for_fp8(const char* key) {
  if (resolve_kernels(FpaKernels::automatic, "CUDA attention kind sage") != FpaKernels::wgmma)
    throw std::invalid_argument(std::string("attention.sage.precision.") + key +
                                " = \"fp8\" runs on the wgmma kernels only (an sm_90a build on a "
                                "device of compute capability 9.x); allowed here: \"int8\" | "
                                "\"bf16\"");
}

bool forward_on_wgmma(const SageOptions& opt, const SageTiles& tiles) {
  if (const char* key = forward_fp8_key(opt.precision)) {
    require_wgmma_for_fp8(key);
    return true;
  }
  return on_wgmma(tiles.forward_kernels, sage_wgmma_forward_runs(opt), "forward_kernels",
                  forward_allowed(opt));
}
bool dq_on_wgmma(const SageOptions& opt, const SageTiles& tiles) {
  if (const char* key = dq_fp8_key(opt.precision)) {
    require_wgmma_for_fp8(key);
    return true;
  }
  return on_wgmma(tiles.dq_kernels, sage_wgmma_dq_runs(opt), "dq_kernels", dq_allowed(opt));
}
bool dkdv_on_wgmma(const SageOptions& opt, const SageTiles& tiles) {
  if (const char* key = dkdv_fp8_key(opt.precision)) {
    require_wgmma_for_fp8(key);
    return true;
  }
  return on_wgmma(tiles.dkdv_kernels, sage_wgmma_dkdv_runs(opt), "dkdv_kernels", dkdv_allowed(opt));
}

// Calls run(x) with x the compile-time form of a run-time choice: a bool, or
// the Precision of a product over d on wgmma (S: int8 or fp8; dP: any, fp8
// where kFp8 allows it).
template <class Run>
void with_flag(bool on, Run&& run) {
  if (on) return run(std::true_type{});
  run(std::false_type{});
}
template <class Run>
void with_qk(bool fp8_, Run&& run) {
  if (fp8_) return run(std::integral_constant<Precision, Precision::fp8>{});
  run(std::integral_constant<Precision, Precision::int8>{});
}
template <bool kFp8, class Run>
void with_dp(bool int8, bool fp8_, Run&& run) {
  if constexpr (kFp8)
    if (fp8_) return run(std::integral_constant<Precision, Precision::fp8>{});
  if (int8) return run(std::integral_constant<Precision, Precision::int8>{});
  run(std::integral_constant<Precision, Precision::bf16>{});
}

// Tensor maps over the pre-pass's 8-bit copies for the wgmma kernels: a natural
// copy (B·H·Tp, d) in (64, d) boxes, a transposed one (B·H·d, Tp) in boxes of
// 64 rows by one quantisation block.
template <int D>
struct WorkspaceMaps {
  const SageWorkspace& ws;
  uint64_t heads;
  explicit WorkspaceMaps(const SageParams& p) : ws(p.ws), heads(static_cast<uint64_t>(p.B) * p.H) {}
  CUtensorMap natural(const int8_t* x) const {
    return sm90::make_int8_tensor_map(x, heads * ws.Tp, D, D, D);
  }
  CUtensorMap transposed(const int8_t* x) const {
    return sm90::make_int8_tensor_map(x, heads * D, ws.Tp, ws.Tp, kTile);
  }
};

// V and dO as the backward gets them, (B·T, 3·H·d) and (B·T, H·d) in 64 x 64
// boxes: at dp = bf16 the wgmma kernels read them in place, so the pre-pass
// writes no bf16 copy for them. Rows past a batch's T are the next batch's or
// zeros: finite, and they fall on masked keys and queries (weights 0) or on
// rows never stored.
CUtensorMap qkv_map(const SageParams& p, int d) {
  const uint64_t cols = 3ull * p.H * d;
  return sm90::make_tensor_map(p.qkv, static_cast<uint64_t>(p.B) * p.T, cols, cols);
}
CUtensorMap dout_map(const SageParams& p, int d) {
  const uint64_t cols = static_cast<uint64_t>(p.H) * d;
  return sm90::make_tensor_map(p.dout, static_cast<uint64_t>(p.B) * p.T, cols, cols);
}

// The wgmma forward: tensor maps over the pre-pass's 8-bit copies.
template <int D, class Softmax, Precision kQk, bool kPvFp8>
void forward_sm90(const SageParams& p, cudaStream_t stream) {
  const SageWorkspace& ws = p.ws;
  const WorkspaceMaps<D> maps(p);
  SageForwardSm90Params f{};
  f.ws = ws;
  f.stats = p.stats_out;
  f.o = p.o;
  f.softmax = p.softmax;
  f.B = p.B, f.H = p.H, f.T = p.T;
  f.smooth_q = p.smooth_q;
  f.q = maps.natural(ws.q.i8);
  f.k = maps.natural(ws.k.i8);
  f.vt = maps.transposed(ws.v.i8t);
  constexpr int kWarpgroups =
      SageForwardSm90Layout<D, Softmax, kPvFp8>::kWarpgroups;  // one 64-row block each
  launch(sage_forward_sm90_kernel<D, Softmax, kQk, kPvFp8>,
         dim3(ceil_div(ws.blocks, kWarpgroups), p.B * p.H), sm90::block_threads<kWarpgroups>(),
         SageForwardSm90Layout<D, Softmax, kPvFp8>::kBytes + scale_table_bytes(2, ws.blocks),
         stream, f);
}

template <int D, class Softmax>
void forward(const SageParams& p, const SageTiles& tiles, bool on_wgmma, cudaStream_t stream) {
  if (on_wgmma) {
    if constexpr (Softmax::kExact)  // fp8 runs with the exact softmax only (sage_check_options)
      return with_qk(p.qk_fp8, [&](auto qk) {
        with_flag(p.pv_fp8, [&](auto pv_fp8) {
          forward_sm90<D, Softmax, std::decay_t<decltype(qk)>::value,
                       std::decay_t<decltype(pv_fp8)>::value>(p, stream);
        });
      });
    else
      return forward_sm90<D, Softmax, Precision::int8, false>(p, stream);
  }
  with_warps(tiles.forward, [&](auto warps) {
    using Tr = SageTraits<D, decltype(warps)::value>;
    launch(sage_forward_kernel<Tr, Softmax>, grid_of<Tr>(p), Tr::kThreads,
           smem_bytes<Tr, 1>(forward_plan<Tr>(p)), stream, p);
  });
}

// The backward kernels' parameters besides their tensor maps.
SageBackwardSm90Common backward_sm90_common(const SageParams& p) {
  return {p.ws, p.stats, p.row_terms, p.dqkv, p.softmax, p.B, p.H, p.T, p.c, p.smooth_q};
}

// The tensor maps both wgmma backward kernels read, encoded once per backward:
// Q̂ and K̂ (the pre-pass's natural copies), V and dO in place (dp = bf16) or
// V̂ and dÔ (their natural copies, dp = int8 or fp8).
template <int D>
struct BackwardMaps {
  CUtensorMap q, k, v, dout;
  explicit BackwardMaps(const SageParams& p) {
    const WorkspaceMaps<D> maps(p);
    q = maps.natural(p.ws.q.i8);
    k = maps.natural(p.ws.k.i8);
    const bool dp_copies = p.dp8 || p.dp_fp8;
    v = dp_copies ? maps.natural(p.ws.v.i8) : qkv_map(p, D);
    dout = dp_copies ? maps.natural(p.ws.dout.i8) : dout_map(p, D);
  }
};

// The wgmma dQ: also K̂ᵀ.
template <int D, class Softmax, Precision kQk, Precision kDp, bool kDqFp8>
void dq_sm90(const SageParams& p, const BackwardMaps<D>& maps, cudaStream_t stream) {
  const SageWorkspace& ws = p.ws;
  SageDqSm90Params f{backward_sm90_common(p)};
  f.q = maps.q;
  f.k = maps.k;
  f.kt = WorkspaceMaps<D>(p).transposed(ws.k.i8t);
  f.dout = maps.dout;
  f.v = maps.v;
  using Layout = SageDqSm90Layout<D, Softmax, kDp>;
  constexpr int kWarpgroups = Layout::kWarpgroups;  // one 64-row block each
  launch(sage_dq_sm90_kernel<D, Softmax, kQk, kDp, kDqFp8>,
         dim3(ceil_div(ws.blocks, kWarpgroups), p.B * p.H), sm90::block_threads<kWarpgroups>(),
         Layout::kBytes + scale_table_bytes(3, ws.blocks), stream, f);
}

// The wgmma dK/dV kernel: also Q̂ᵀ and dÔᵀ.
template <int D, class Softmax, Precision kQk, Precision kDp, bool kDvFp8, bool kDkFp8>
void dkdv_sm90(const SageParams& p, const BackwardMaps<D>& maps, cudaStream_t stream) {
  const SageWorkspace& ws = p.ws;
  const WorkspaceMaps<D> copies(p);
  SageDkDvSm90Params f{backward_sm90_common(p)};
  f.k = maps.k;
  f.q = maps.q;
  f.qt = copies.transposed(ws.q.i8t);
  f.dot = copies.transposed(ws.dout.i8t);
  f.v = maps.v;
  f.dout = maps.dout;
  using Layout = SageDkDvSm90Layout<D, Softmax, kDp>;
  constexpr int kWarpgroups = Layout::kWarpgroups;  // one 64-row block each
  launch(sage_dkdv_sm90_kernel<D, Softmax, kQk, kDp, kDvFp8, kDkFp8>,
         dim3(ceil_div(ws.blocks, kWarpgroups), p.B * p.H), sm90::block_threads<kWarpgroups>(),
         Layout::kBytes, stream, f);
}

// dQ first: with a row sweep it writes the row terms the dK/dV kernel reads.
// The fp8 instantiations are the exact softmax's alone (sage_check_options).
template <int D, class Softmax>
void backward(const SageParams& p, const SageTiles& tiles, bool dq_wgmma, bool dkdv_wgmma,
              cudaStream_t stream, PhaseRecorder* phases) {
  std::optional<BackwardMaps<D>> maps;
  if (dq_wgmma || dkdv_wgmma) maps.emplace(p);
  // run(qk, dp) with their compile-time Precisions
  auto with_products = [&](auto run) {
    if constexpr (Softmax::kExact)
      with_qk(p.qk_fp8,
              [&](auto qk) { with_dp<true>(p.dp8, p.dp_fp8, [&](auto dp) { run(qk, dp); }); });
    else
      with_dp<false>(p.dp8, false, [&](auto dp) {
        run(std::integral_constant<Precision, Precision::int8>{}, dp);
      });
  };
  const AttentionShape s{p.B, p.H, p.T, D};
  // S, dP and dQ; a row sweep makes S and dP once more first.
  in_phase(phases, "dq", {0, causal_product_flops(s, Softmax::kRowPass ? 5 : 3)}, stream, [&] {
    if (dq_wgmma)
      return with_products([&](auto qk, auto dp) {
        with_flag(Softmax::kExact && p.dq_fp8, [&](auto dq_fp8) {
          if constexpr (Softmax::kExact || !std::decay_t<decltype(dq_fp8)>::value)
            dq_sm90<D, Softmax, std::decay_t<decltype(qk)>::value,
                    std::decay_t<decltype(dp)>::value, std::decay_t<decltype(dq_fp8)>::value>(
                p, *maps, stream);
        });
      });
    with_warps(tiles.dq, [&](auto warps) {
      using Tr = SageTraits<D, decltype(warps)::value>;
      launch(sage_backward_dq_kernel<Tr, Softmax>, grid_of<Tr>(p), Tr::kThreads,
             smem_bytes<Tr, 1>(dq_plan<Tr>(p)), stream, p);
    });
  });
  // S, dP, dV and dK.
  in_phase(phases, "dkdv", {0, causal_product_flops(s, 4)}, stream, [&] {
    if (dkdv_wgmma)
      return with_products([&](auto qk, auto dp) {
        constexpr Precision kQk = std::decay_t<decltype(qk)>::value,
                            kDp = std::decay_t<decltype(dp)>::value;
        if constexpr (Softmax::kExact) {
          if (p.dk_fp8) return dkdv_sm90<D, Softmax, kQk, kDp, true, true>(p, *maps, stream);
          if (p.dv_fp8) return dkdv_sm90<D, Softmax, kQk, kDp, true, false>(p, *maps, stream);
        }
        dkdv_sm90<D, Softmax, kQk, kDp, false, false>(p, *maps, stream);
      });
    with_warps(tiles.dkdv, [&](auto warps) {
      using Tr = SageTraits<D, decltype(warps)::value>;
      launch(sage_backward_dkdv_kernel<Tr, Softmax>, grid_of<Tr>(p), Tr::kThreads,
             smem_bytes<Tr, 2>(dkdv_plan<Tr, Softmax>(p)), stream, p);
    });
  });
}

template <class T>
struct TypeTag {
  using type = T;
};
// Calls run(head dim, softmax policy tag) with the kernels' instantiation for the call.
template <class Run>
void dispatch(const SageOptions& opt, const AttentionShape& s, Run&& run) {
  auto with_head_dim = [&](auto softmax) {
    if (s.d == 64) return run(std::integral_constant<int, 64>{}, softmax);
    return run(std::integral_constant<int, 128>{}, softmax);
  };
  if (opt.softmax) return with_head_dim(TypeTag<KIntervalSoftmax>{});
  return with_head_dim(TypeTag<ExactSoftmax>{});
}

}  // namespace

bool sage_wgmma_forward_runs(const SageOptions& opt) {
  const SagePrecision& pr = opt.precision;
  return eight_bit(pr.qk) && eight_bit(pr.pv);
}
bool sage_wgmma_dq_runs(const SageOptions& opt) {
  const SagePrecision& pr = opt.precision;
  return eight_bit(pr.qk) && (fp8(pr.dq) || (pr.dq == Precision::int8 &&
                                             opt.bwd_granularity == BwdGranularity::rowcol));
}
bool sage_wgmma_dkdv_runs(const SageOptions& opt) {
  const SagePrecision& pr = opt.precision;
  return eight_bit(pr.qk) && eight_bit(pr.dv) && eight_bit(pr.dk) && (!fp8(pr.dk) || fp8(pr.dv)) &&
         ((fp8(pr.dv) && fp8(pr.dk)) || opt.bwd_granularity == BwdGranularity::rowcol);
}

void sage_check_options(const SageOptions& opt) {
  const SagePrecision& pr = opt.precision;
  // fp8 products run on the wgmma kernels (sage.cuh), each kernel on its own
  // products: a key at fp8 needs the kernels that run it to take the other
  // keys as they are. The folds and dS's bounds take the exact softmax's
  // weights (P̃, P <= 1; §4.12), so no fp8 runs with a softmax block.
  if (opt.softmax)
    if (const char* key = fp8_key(pr, {kQk, kPv, kDp, kDv, kDq, kDk}))
      throw std::invalid_argument(std::string("attention.sage.precision.") + key +
                                  " = \"fp8\": the CUDA kernels run fp8 with the exact softmax "
                                  "only, not with a softmax block (allowed there: \"int8\" | "
                                  "\"bf16\")");
  auto require = [](const char* key, bool runs, const char* kernel, const std::string& allowed) {
    if (key && !runs)
      throw std::invalid_argument(std::string("attention.sage.precision.") + key +
                                  " = \"fp8\" runs on the wgmma " + kernel + ", which runs only " +
                                  allowed);
  };
  require(forward_fp8_key(pr), sage_wgmma_forward_runs(opt), "forward", forward_allowed(opt));
  require(dq_fp8_key(pr), sage_wgmma_dq_runs(opt), "dQ kernel", dq_allowed(opt));
  require(dkdv_fp8_key(pr), sage_wgmma_dkdv_runs(opt), "dK/dV kernel", dkdv_allowed(opt));
  if (opt.block_q != kSageBlock || opt.block_k != kSageBlock)
    throw std::invalid_argument("attention.sage.block_q/block_k = " + std::to_string(opt.block_q) +
                                "/" + std::to_string(opt.block_k) +
                                ": the CUDA kernels quantise per tile of " +
                                std::to_string(kSageBlock) + " rows (allowed: 64/64)");
  if (opt.softmax && opt.softmax->K < 1)
    throw std::invalid_argument("attention.sage.softmax.K = " + std::to_string(opt.softmax->K) +
                                " is not allowed (allowed: K >= 1)");
  if (opt.softmax && opt.softmax->calibration == Calibration::fwm && !(opt.softmax->window > 0.0))
    throw std::invalid_argument(
        "attention.sage.softmax.window = " + std::to_string(opt.softmax->window) +
        " is not allowed (allowed: > 0 with calibration fwm)");
}

int sage_row_stats(const SageOptions& opt) {
  return opt.softmax ? KIntervalSoftmax::kStatFloats : ExactSoftmax::kStatFloats;
}

SageTiles sage_default_tiles(const AttentionShape& s) {
  const int d = s.d;
  // d = 64: the 4-warp forward and dQ fit three CTAs (12 warps) per SM by
  // registers, 8-warp CTAs one; the dK/dV kernel holds 8 warps per SM either
  // way and with 8 warps loads each query block once per 128 keys.
  // d = 128: every kernel holds 8 warps per SM at most (registers), and the
  // 4-warp dK/dV kernel only 4 (116 KB of shared memory).
  SageTiles tiles = d == 64 ? SageTiles{4, 4, 8} : SageTiles{8, 8, 8};
  // The family of each kernel is the faster one by build-gpu/sage_tiles
  // (tools/dev/sage_tiles.cu times every choice, each kernel with its pre-pass;
  // docs/sage.md, "Design decisions"): wgmma for dQ and dK/dV at every shape
  // (e.g. backward 3.507 ms with the wgmma dK/dV against 4.603 with mma.sync at
  // (4, 16, 4096, 128)), and for the forward at d = 128 and at d = 64 from
  // T = 2048 (0.253 vs 0.268 ms at (8, 12, 2048, 64)); below T = 2048 the d = 64
  // forward is faster on mma.sync (0.099 vs 0.102 ms at (8, 12, 1024, 64)).
  tiles.forward_kernels = d == 128 || s.T >= 2048 ? FpaKernels::automatic : FpaKernels::mma_sync;
  tiles.dq_kernels = tiles.dkdv_kernels = FpaKernels::automatic;
  return tiles;
}

size_t sage_saved_bytes(const SageOptions& opt, const AttentionShape& s) {
  sage_check_options(opt);  // a backend sizes its buffers first: it refuses what cannot run then
  return sage_saved_bytes(opt, s, sage_copies(opt));
}

size_t sage_workspace_bytes(const SageOptions& opt, const AttentionShape& s) {
  return sage_workspace_bytes(opt, s, sage_copies(opt));
}

void sage_forward(const SageOptions& opt, const AttentionShape& s, const bf16* qkv, bf16* o,
                  float* stats, void* saved, cudaStream_t stream, const SageTiles& tiles,
                  PhaseRecorder* phases) {
  check_tiles(tiles);
  SageParams p = make_params(opt, s, saved, nullptr);
  p.stats_out = stats;
  p.o = o;
  const bool on_wgmma = forward_on_wgmma(opt, tiles);
  sage_quantise_inputs(opt, s, qkv, p.ws, sage_forward_copies(opt), stream, phases);
  dispatch(opt, s, [&](auto d, auto softmax) {
    using Softmax = typename decltype(softmax)::type;
    // S and P̂V̂; a calibrating softmax makes S once more first.
    in_phase(phases, "forward", {0, causal_product_flops(s, Softmax::kCalibrates ? 3 : 2)}, stream,
             [&] { forward<decltype(d)::value, Softmax>(p, tiles, on_wgmma, stream); });
  });
}

void sage_backward(const SageOptions& opt, const AttentionShape& s, const bf16* qkv, const bf16* o,
                   const bf16* dout, const float* stats, const void* saved, bf16* dqkv,
                   void* workspace, cudaStream_t stream, const SageTiles& tiles,
                   PhaseRecorder* phases) {
  check_tiles(tiles);
  // The kernels only read the forward's buffers; SageWorkspace's pointers are
  // non-const because the forward's pre-pass writes through the same view.
  SageParams p = make_params(opt, s, const_cast<void*>(saved), workspace);
  require_buffer(workspace, sage_workspace_bytes(opt, s), "workspace (attention_workspace_bytes)");
  p.stats = stats;
  p.dqkv = dqkv;
  p.qkv = qkv;
  p.dout = dout;
  const bool dq_wgmma = dq_on_wgmma(opt, tiles);
  const bool dkdv_wgmma = dkdv_on_wgmma(opt, tiles);
  sage_quantise_gradient(opt, s, qkv, o, dout, p.ws,
                         sage_backward_copies(opt, dq_wgmma && dkdv_wgmma), stream, phases);
  dispatch(opt, s, [&](auto d, auto softmax) {
    backward<decltype(d)::value, typename decltype(softmax)::type>(p, tiles, dq_wgmma, dkdv_wgmma,
                                                                   stream, phases);
  });
}

void sage_forward(const SageOptions& opt, const AttentionShape& s, const bf16* qkv, bf16* o,
                  float* stats, void* saved, cudaStream_t stream) {
  sage_forward(opt, s, qkv, o, stats, saved, stream, sage_default_tiles(s));
}

void sage_backward(const SageOptions& opt, const AttentionShape& s, const bf16* qkv, const bf16* o,
                   const bf16* dout, const float* stats, const void* saved, bf16* dqkv,
                   void* workspace, cudaStream_t stream) {
  sage_backward(opt, s, qkv, o, dout, stats, saved, dqkv, workspace, stream, sage_default_tiles(s));
}

}  // namespace qattn::cuda
