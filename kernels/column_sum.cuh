// Deterministic column sums: the bias gradient of a matmul, and the second
// stage that adds per-block partial sums (layernorm, QK-norm gains) into a
// gradient. No atomics: every sum runs in a fixed order.
#pragma once
#include "common.cuh"

namespace qattn::cuda {

// Floats of scratch bias_backward needs for N rows and OC columns.
size_t bias_backward_scratch_floats(int N, int OC);

// dbias (OC) fp32 += sum over rows of dout (N, OC) bf16. OC % 8 == 0.
void bias_backward(float* dbias, const bf16* dout, int N, int OC, float* scratch,
                   cudaStream_t stream);

// dst (n) += sum over p of partials[p * ld + i], p = 0 .. parts-1 in order.
void add_partial_sums(float* dst, const float* partials, int parts, int n, int ld,
                      cudaStream_t stream);

}  // namespace qattn::cuda
