// Sum of squares of an fp32 vector, deterministic: a fixed grid writes one
// partial per block, one block adds them in order.
#pragma once
#include <cstddef>

#include "common.cuh"

namespace qattn::cuda {

// Floats of scratch global_norm_squared needs.
size_t global_norm_scratch_floats();

// *out (device) = sum of x[i]^2 over n elements.
void global_norm_squared(float* out, const float* x, size_t n, float* scratch,
                         cudaStream_t stream);

}  // namespace qattn::cuda
