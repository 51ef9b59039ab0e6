// QK-norm (docs/attention-maths.md §3) on the q and k parts of the fused qkv activation, in place:
// x <- gamma * x / sqrt(mean(x^2) + 1e-6) per head row of d values, gamma_q for
// q and gamma_k for k (shared by heads). v is left alone.
#pragma once
#include "common.cuh"

namespace qattn::cuda {

// qkv (N, 3C) bf16: its q and k parts (the first 2C of each row, 2H rows of d)
// are normalised in place; raw (N, 2C) keeps them before normalisation and
// rrms (N, 2H) fp32 the reciprocal RMS, both for the backward. d % 8 == 0 and
// d / 8 a power of two <= 32.
void qk_norm_forward(bf16* qkv, bf16* raw, float* rrms, const bf16* gamma_q, const bf16* gamma_k,
                     int N, int H, int d, cudaStream_t stream);

// Floats of scratch qk_norm_backward needs.
size_t qk_norm_backward_scratch_floats(int N, int H, int d);

// dqkv (N, 3C): the q and k parts hold d(normalised) on entry and d(raw) on
// exit (in place); dgamma_q, dgamma_k (d) fp32 += their gradients.
void qk_norm_backward(bf16* dqkv, float* dgamma_q, float* dgamma_k, const bf16* raw,
                      const float* rrms, const bf16* gamma_q, const bf16* gamma_k, int N, int H,
                      int d, float* scratch, cudaStream_t stream);

}  // namespace qattn::cuda
