// CUDA attention: one entry point per direction, dispatching on the kind.
// Layouts avoid permutes: q, k, v are read in place from the fused QKV
// activation (B, T, 3, H, d) = (B, T, 3C); o is written as (B, T, H, d) = (B, T, C);
// dqkv is written as (B, T, 3C). Per-row softmax statistics are fp32 (B, H, T, n).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "qattn/attention.hpp"

namespace qattn::cuda {

struct AttentionShape {
  int B, H, T, d;  // d in {64, 128}
};

class PhaseRecorder;  // phases.cuh: times each launch of a call (null: none)

// Floats saved per (b, h, row) by the forward for the backward (FPA: 1, the LSE;
// the layout inside is the kind's).
int attention_row_stats(const AttentionConfig& cfg, int head_dim);
// Bytes the forward fills for the backward of the same call beyond the row
// statistics (sage: the quantised Q, K, V; 0 for the other kinds). A model
// keeps one such buffer per layer, as it keeps the statistics.
size_t attention_saved_bytes(const AttentionConfig& cfg, const AttentionShape& s);
// Bytes of the backward's scratch (δ, quantised dO, fp32 accumulators); any
// number of layers may share one.
size_t attention_workspace_bytes(const AttentionConfig& cfg, const AttentionShape& s);

// qkv (B, T, 3C) bf16 -> o (B, T, C) bf16; stats: attention_row_stats(cfg, d) fp32 per
// (b, h, row), laid out by the kind; saved: attention_saved_bytes (may be null when 0).
void attention_forward(const AttentionConfig& cfg, const AttentionShape& s,
                       const __nv_bfloat16* qkv, __nv_bfloat16* o, float* stats, void* saved,
                       cudaStream_t stream, PhaseRecorder* phases = nullptr);

// dout (B, T, C) -> dqkv (B, T, 3C) (overwritten), from the stats and the saved
// buffer the forward of the same qkv left. Deterministic: no atomics whose
// order changes the result.
void attention_backward(const AttentionConfig& cfg, const AttentionShape& s,
                        const __nv_bfloat16* qkv, const __nv_bfloat16* o, const __nv_bfloat16* dout,
                        const float* stats, const void* saved, __nv_bfloat16* dqkv, void* workspace,
                        cudaStream_t stream, PhaseRecorder* phases = nullptr);

}  // namespace qattn::cuda
