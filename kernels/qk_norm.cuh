// QK-norm (docs/attention-maths.md §3) on the q and k parts of the fused qkv activation, in
// place: x <- w ∘ x / sqrt(mean(x^2) + 1e-6) per head row of d values, where the multiplier w
// is the form's. gain (§3.1): w = gamma_q for q, gamma_k for k (shared by heads). logit_scale
// (§3.4): w = g_h / sqrt(d) for q of head h, 1 for k, so that attention's (1/sqrt(d)) q.k is
// g_h times the product of the unit rows. v is left alone.
#pragma once
#include "common.cuh"
#include "qattn/qk_norm.hpp"

namespace qattn::cuda {

// One layer's QK-norm parameters (bf16, the model's copy), by form: gain reads
// gamma_q, gamma_k (d each); logit_scale reads scale (H), the logit scale g of each head.
struct QkNormParams {
  QkNormForm form;
  const bf16* gamma_q = nullptr;
  const bf16* gamma_k = nullptr;
  const bf16* scale = nullptr;
};
// Their fp32 gradients, added to (+=): gain dgamma_q, dgamma_k (d each); logit_scale dscale (H).
struct QkNormGrads {
  float* dgamma_q = nullptr;
  float* dgamma_k = nullptr;
  float* dscale = nullptr;
};

// qkv (N, 3C) bf16: its q and k parts (the first 2C of each row, 2H rows of d)
// are normalised in place; raw (N, 2C) keeps them before normalisation and
// rrms (N, 2H) fp32 the reciprocal RMS, both for the backward. d % 8 == 0 and
// d / 8 a power of two <= 32. p.form is gain or logit_scale.
void qk_norm_forward(bf16* qkv, bf16* raw, float* rrms, const QkNormParams& p, int N, int H, int d,
                     cudaStream_t stream);

// Floats of scratch qk_norm_backward needs.
size_t qk_norm_backward_scratch_floats(QkNormForm form, int N, int H, int d);

// dqkv (N, 3C): the q and k parts hold d(normalised) on entry and d(raw) on
// exit (in place); the parameters' gradients are added to `grads`.
void qk_norm_backward(bf16* dqkv, const QkNormGrads& grads, const bf16* raw, const float* rrms,
                      const QkNormParams& p, int N, int H, int d, float* scratch,
                      cudaStream_t stream);

}  // namespace qattn::cuda
