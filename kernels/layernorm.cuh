// LayerNorm over channels (eps 1e-5), forward and backward. The residual adds
// live in the matmul epilogues (cuBLASLt C input), so the backward fuses the
// residual stream instead: it accumulates into dinp.
#pragma once
#include "common.cuh"

namespace qattn::cuda {

// out (N, C) bf16 = (inp - mean) * rstd * w + b; mean, rstd (N) fp32 saved. C % 8 == 0.
void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* w,
                       const bf16* b, int N, int C, cudaStream_t stream);

// Floats of scratch layernorm_backward needs.
size_t layernorm_backward_scratch_floats(int N, int C);

// dinp (N, C) bf16 += dx; dw, db (C) fp32 += their gradients (deterministic).
void layernorm_backward(bf16* dinp, float* dw, float* db, const bf16* dout, const bf16* inp,
                        const bf16* w, const float* mean, const float* rstd, int N, int C,
                        float* scratch, cudaStream_t stream);

}  // namespace qattn::cuda
