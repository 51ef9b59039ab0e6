// AdamW on fp32 master weights; the bf16 copy used by the model is written in
// the same pass.
#pragma once
#include <cstddef>

#include "common.cuh"

namespace qattn::cuda {

struct AdamWArgs {
  float lr, beta1, beta2, eps, weight_decay;
  float grad_mult;                    // clipping factor applied to the gradient first
  float bias_correction1, bias_correction2;  // 1 - beta^t
};

// n elements: m, v, master (fp32) updated in place, params (bf16) = master.
void adamw_update(bf16* params, float* master, float* m, float* v, const float* grads, size_t n,
                  const AdamWArgs& a, cudaStream_t stream);

// params (bf16) = master (fp32), n elements.
void copy_master_to_params(bf16* params, const float* master, size_t n, cudaStream_t stream);

}  // namespace qattn::cuda
