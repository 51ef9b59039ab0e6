// SageBwd INT8 attention (docs/attention-maths.md §4) on the GPU: launchers
// called by dispatch.cu.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "attention/attention.cuh"
#include "attention/fpa/fpa.cuh"  // FpaKernels: the tensor-core family of a kernel
#include "attention/sage/quant.cuh"
#include "common.cuh"

namespace qattn::cuda {

// Throws std::invalid_argument naming the option when the kernels cannot run it.
void sage_check_options(const SageOptions& opt);

// Bytes of the buffer the forward fills for the backward of the same call
// (the quantised Q, K, V and their terms, quant.cuh; a model keeps one per
// layer), and of the backward's scratch (dO's copies, δ, row terms; shared).
size_t sage_saved_bytes(const SageOptions& opt, const AttentionShape& s);
size_t sage_workspace_bytes(const SageOptions& opt, const AttentionShape& s);

// fp32 saved per (b, h, row) by the forward: 1 (L = m + log l of the quantised
// scores), or with the softmax block the row's K-interval grid (kinterval_softmax.cuh, RowStats).
int sage_row_stats(const SageOptions& opt);

// Whether each wgmma kernel can run the options (the list below); an fp8 key
// needs the kernels running its product to (sage_check_options).
bool sage_wgmma_forward_runs(const SageOptions& opt);
bool sage_wgmma_dq_runs(const SageOptions& opt);
bool sage_wgmma_dkdv_runs(const SageOptions& opt);

// Warps per CTA of each mma.sync kernel: 4 (64 resident rows: queries, or keys
// for dK/dV) or 8 (128 rows). Every shape computes the same outputs bit for bit;
// sage_default_tiles is the one expected fastest per shape, the others are
// there to be timed against it (tools/dev/sage_tiles.cu) and are tested alike.
//
// The family of each kernel is chosen at run time: on a device and build with
// sm_90a they run on wgmma (two or three 64-row warpgroups, sage_sm90.cuh, and a
// TMA producer; the warp counts are then not used) where the options allow, else on mma.sync
// (sage.cu):
//   forward  sage_forward_sm90.cuh: qk and pv each int8 (the defaults) or fp8
//   dQ       sage_dq_sm90.cuh: qk int8 or fp8, dp any, dq fp8 or int8 with
//            bwd_granularity rowcol
//   dK/dV    sage_dkdv_sm90.cuh: qk, dv, dk each int8 or fp8 (dk fp8 only
//            beside dv fp8), dp any, bwd_granularity rowcol unless dv = dk = fp8
// Any fp8 runs with the exact softmax only.
// *_kernels = mma_sync forces mma.sync; wgmma forces wgmma and throws where it
// cannot run (no sm_90a, other options); automatic is wgmma where it runs.
// sage_default_tiles, what training runs, names the family of each kernel
// (measured choices, sage.cu): wgmma wherever it runs, except the forward at
// d = 64 and T < 2048, where mma.sync measured faster.
struct SageTiles {
  int forward, dq, dkdv;
  FpaKernels forward_kernels = FpaKernels::automatic;
  FpaKernels dq_kernels = FpaKernels::automatic;
  FpaKernels dkdv_kernels = FpaKernels::automatic;
};
SageTiles sage_default_tiles(const AttentionShape& s);

// qkv (B, T, 3C) -> o (B, T, C), stats (B, H, T, sage_row_stats), and the
// quantised Q, K, V in `saved` (sage_saved_bytes). `phases` (phases.cuh), where
// given, times each launch: the pre-pass's (quant.cuh), then "forward".
void sage_forward(const SageOptions& opt, const AttentionShape& s, const bf16* qkv, bf16* o,
                  float* stats, void* saved, cudaStream_t stream);
void sage_forward(const SageOptions& opt, const AttentionShape& s, const bf16* qkv, bf16* o,
                  float* stats, void* saved, cudaStream_t stream, const SageTiles& tiles,
                  PhaseRecorder* phases = nullptr);

// dout (B, T, C) -> dqkv (B, T, 3C), deterministic. Reads Q̂, K̂, V̂ as the
// forward of the same call left them in `saved` (and its stats), V in bf16 from
// qkv; quantises dO into the scratch `workspace` (sage_workspace_bytes).
// `phases`: the pre-pass's "quantise_dout", then "dq" and "dkdv".
void sage_backward(const SageOptions& opt, const AttentionShape& s, const bf16* qkv, const bf16* o,
                   const bf16* dout, const float* stats, const void* saved, bf16* dqkv,
                   void* workspace, cudaStream_t stream);
void sage_backward(const SageOptions& opt, const AttentionShape& s, const bf16* qkv, const bf16* o,
                   const bf16* dout, const float* stats, const void* saved, bf16* dqkv,
                   void* workspace, cudaStream_t stream, const SageTiles& tiles,
                   PhaseRecorder* phases = nullptr);

}  // namespace qattn::cuda
