// K-interval quantised-softmax attention (docs/attention-maths.md §5) on the
// GPU: launchers called by dispatch.cu.
#pragma once
#include <cuda_runtime.h>

#include "attention/attention.cuh"
#include "attention/fpa/fpa.cuh"
#include "common.cuh"

namespace qattn::cuda {

// fp32 per (b, h, row) saved by the forward: the grid (kinterval_softmax.cuh,
// RowStats) and, for the probability STE, the exact softmax's L and output row.
int kinterval_row_stats(const KIntervalOptions& opt, int head_dim);
// Scratch of the backward: δ, dL/dm, dL/dℓ per row.
size_t kinterval_workspace_bytes(const KIntervalOptions& opt, const AttentionShape& s);

// The kernel family is chosen as FPA's (fpa.cuh, FpaKernels): automatic runs
// wgmma on Hopper; tests name one to check both on the same device.

// qkv (B, T, 3C) -> o (B, T, C), stats (B, H, T, kinterval_row_stats(opt, d)).
// `phases` (phases.cuh), where given, times its one launch, "forward".
void kinterval_forward(const KIntervalOptions& opt, const AttentionShape& s, const bf16* qkv,
                       bf16* o, float* stats, cudaStream_t stream,
                       FpaKernels kernels = FpaKernels::automatic, PhaseRecorder* phases = nullptr);

// dout (B, T, C) -> dqkv (B, T, 3C), deterministic. `phases`: "delta" where the
// δ pre-pass runs, then "dq" and "dkdv", or "dkdv+dq" as one launch (kinterval.cu).
void kinterval_backward(const KIntervalOptions& opt, const AttentionShape& s, const bf16* qkv,
                        const bf16* o, const bf16* dout, const float* stats, bf16* dqkv,
                        void* workspace, cudaStream_t stream,
                        FpaKernels kernels = FpaKernels::automatic,
                        PhaseRecorder* phases = nullptr);

}  // namespace qattn::cuda
