// What SageBwd's Hopper kernels (sage_forward_sm90.cuh, sage_dq_sm90.cuh,
// sage_dkdv_sm90.cuh) share: their block's rows, and the parameters of the two
// backward kernels besides their tensor maps (sage.cu fills them once).
#pragma once
#include "attention/flash_skeleton_sm90.cuh"
#include "attention/quant.cuh"
#include "attention/sage_softmax.cuh"

namespace qattn::cuda::sage {

// Consumer warpgroups of each Hopper kernel (64 resident rows each): plain
// SageBwd at d = 64 three, so that each warp scheduler has a third warp to
// switch to through the long per-entry work (dS, its levels, the folds), at
// 160 registers a thread; two otherwise, at 240 (at d = 128 dK and dV alone hold
// 128 fp32 a thread; the K-interval policy's dK/dV spilled 384 bytes at 160).
// A block's rows are then sage_sm90_rows: 192 or 128.
template <int D, class Softmax>
constexpr int sage_sm90_warpgroups() {
  return D == 64 && !Softmax::kRowPass ? 3 : 2;
}
template <int D, class Softmax>
constexpr int sage_sm90_rows() {
  return sage_sm90_warpgroups<D, Softmax>() * flash::sm90::kWarpgroupRows;
}

// A query warpgroup of the forward or the dQ kernel (64 rows at q0 + its
// offset in the block of sage_sm90_rows): its rows lie in one quantisation block, so
// its S has one scale s_Q s_K per key block (a block past the last: the last,
// as sage.cu) and one smooth_q bias row; key block j holds a key some row
// sees (uniform over the warpgroup, as wgmma needs; rows past T see none).
struct QueryWarpgroup {
  int wg_row0;           // the warpgroup's first row in the block's tiles
  int wg_first;          // its first query
  int first_query;       // the calling warp's first query
  float scale_q;         // s_Q of its quantisation block
  const float* scale_k;  // (blocks) s_K of the head's key blocks
  const float* bias;     // (Tp) the smooth_q bias of its block's queries, or null
  size_t scale0;         // the head's first block in the workspace's per-block arrays

  __device__ QueryWarpgroup(const SageWorkspace& ws, int bh, int q0, bool smooth_q)
      : wg_row0(flash::sm90::warpgroup_row0()),
        wg_first(q0 + wg_row0),
        first_query(q0 + flash::sm90::warp_row0()),
        scale0(static_cast<size_t>(bh) * ws.blocks) {
    const int q_block = min(wg_first / kSageBlock, ws.blocks - 1);
    scale_q = ws.q.scale[scale0 + q_block];
    scale_k = ws.k.scale + scale0;
    bias = smooth_q ? ws.query_bias + (scale0 + q_block) * ws.Tp : nullptr;
  }
  __device__ bool sees(int j, int T) const {
    return wg_first < T && j * kSageBlock <= wg_first + flash::sm90::kWarpgroupRows - 1;
  }
};

struct SageBackwardSm90Common {
  SageWorkspace ws;
  const float* stats;      // (B, H, T, Softmax::kStatFloats): the forward's L, or RowStats
  float* row_terms;        // (B, H, Tp, Softmax::kTermFloats): δ, or the K-interval row sweep's
                           // terms (written by dQ, read by dK/dV)
  bf16* dqkv;              // (B, T, 3, H, d): dQ writes the q slot, dK/dV the k and v slots
  SoftmaxOptions softmax;  // the K-interval block's
  int B, H, T;
  float c;                 // 1 / sqrt(d)
  bool smooth_q;
};

}  // namespace qattn::cuda::sage
