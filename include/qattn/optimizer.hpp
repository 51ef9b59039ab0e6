// AdamW (decoupled weight decay) and the learning-rate schedules.
#pragma once
#include <cstddef>
#include <cstdint>

#include "qattn/backend.hpp"
#include "qattn/config.hpp"

namespace qattn {

// Learning rate at 0-based step `step` of `cfg.steps`: linear warmup over
// cfg.warmup steps, then cosine | linear | constant | wsd (warmup-stable-decay:
// constant, then a linear decay over the last wsd_decay_frac of the steps)
// down to lr * final_lr_frac.
double learning_rate(const TrainConfig& cfg, int64_t step);

// One AdamW update of n fp32 values (the CPU reference; the CUDA kernel in
// kernels/adamw.cu implements the same formula). grad is multiplied by
// grad_mult first (clipping); t is the 1-based step.
void adamw_update(float* param, const float* grad, float* m, float* v, size_t n,
                  const AdamWHyper& h, bool decay, float grad_mult, int64_t t);

}  // namespace qattn
