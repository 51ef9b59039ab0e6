// What SageBwd's Hopper kernels (sage_forward_sm90.cuh, sage_dq_sm90.cuh,
// sage_dkdv_sm90.cuh) share: their block's rows, and the parameters of the two
// backward kernels besides their tensor maps (sage.cu fills them once).
#pragma once
#include "attention/flash_skeleton_sm90.cuh"
#include "attention/quant.cuh"
#include "attention/sage_softmax.cuh"

namespace qattn::cuda::sage {

constexpr int kSm90Rows = 2 * flash::sm90::kWarpgroupRows;  // rows per block: two warpgroups

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
