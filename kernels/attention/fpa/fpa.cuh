// FPA (docs/attention-maths.md §2) on the flash skeleton: launchers called by dispatch.cu.
#pragma once
#include <cuda_runtime.h>

#include "attention/attention.cuh"
#include "common.cuh"

namespace qattn::cuda {

// Which kernel family runs: automatic picks wgmma (Hopper, sm_90a) where the
// device and the build have it, else mma_sync (sm_80 and up). Tests and
// benchmarks name one to check or time both on the same device.
enum class FpaKernels { automatic, mma_sync, wgmma };
// Whether this device and build run the wgmma kernels.
bool fpa_wgmma_available();
// The family that runs for a request: automatic -> wgmma where available, else
// mma_sync. A wgmma request where it is not available throws, naming kind (the
// caller, e.g. "FPA attention"). K-interval's kernels are chosen the same way.
FpaKernels resolve_kernels(FpaKernels requested, const char* kind);

// qkv (B, T, 3C) -> o (B, T, C), lse (B, H, T) = L = c m + log l per row.
// `phases` (phases.cuh), where given, times its one launch, "forward".
void fpa_forward(const AttentionShape& s, const bf16* qkv, bf16* o, float* lse, cudaStream_t stream,
                 FpaKernels kernels = FpaKernels::automatic, PhaseRecorder* phases = nullptr);

// dout (B, T, C) -> dqkv (B, T, 3C); delta (B, H, T) fp32 is scratch for δ = rowsum(dO ∘ O).
// `phases`: "delta" (attention_delta), then "dkdv+dq", dK/dV and dQ blocks in one launch.
void fpa_backward(const AttentionShape& s, const bf16* qkv, const bf16* o, const bf16* dout,
                  const float* lse, float* delta, bf16* dqkv, cudaStream_t stream,
                  FpaKernels kernels = FpaKernels::automatic, PhaseRecorder* phases = nullptr);

// FPA's dQ pass alone, into the q slot of dqkv (B, T, 3C), from lse and delta
// (B, H, T) already computed: K-interval's probability STE takes the exact
// softmax's gradient for dQ.
void fpa_backward_dq(const AttentionShape& s, const bf16* qkv, const bf16* dout, const float* lse,
                     float* delta, bf16* dqkv, cudaStream_t stream, FpaKernels kernels);

}  // namespace qattn::cuda
