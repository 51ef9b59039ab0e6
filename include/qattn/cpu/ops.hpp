// CPU reference ops of GPT-2, llm.c style: one function per op, plain loops,
// shapes beside every pointer. Templated on the scalar (float for training,
// double for finite-difference tests). Backward functions ACCUMULATE (+=) into
// their gradient outputs, so a tensor used twice gets both contributions.
#pragma once
#include <cstddef>
#include <cstdint>

namespace qattn::cpu {

// out (N, C) = wte[inp] + wpe[pos]; N = B*T, inp (B, T).
template <typename F>
void encoder_forward(F* out, const int32_t* inp, const F* wte, const F* wpe, int B, int T, int C);
template <typename F>
void encoder_backward(F* dwte, F* dwpe, const F* dout, const int32_t* inp, int B, int T, int C);

// LayerNorm over the last dim; mean, rstd (N) saved for the backward. eps 1e-5.
template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* w, const F* b, int N,
                       int C);
template <typename F>
void layernorm_backward(F* dinp, F* dw, F* db, const F* dout, const F* inp, const F* w,
                        const F* mean, const F* rstd, int N, int C);

// out (N, OC) = inp (N, IC) . w (OC, IC)^T + bias (OC); bias may be null.
template <typename F>
void matmul_forward(F* out, const F* inp, const F* w, const F* bias, int N, int IC, int OC);
template <typename F>
void matmul_backward(F* dinp, F* dw, F* dbias, const F* dout, const F* inp, const F* w, int N,
                     int IC, int OC);

// GELU, tanh approximation.
template <typename F>
void gelu_forward(F* out, const F* inp, size_t n);
template <typename F>
void gelu_backward(F* dinp, const F* inp, const F* dout, size_t n);

// out = a + b
template <typename F>
void residual_forward(F* out, const F* a, const F* b, size_t n);

// QK-norm, form gain (docs/attention-maths.md §3.1) over rows of length d:
// out = gamma * x / sqrt(mean(x^2) + 1e-6).
// rrms (rows) saved for the backward. The backward accumulates into dinp and dgamma.
template <typename F>
void qk_norm_forward(F* out, F* rrms, const F* inp, const F* gamma, int rows, int d);
template <typename F>
void qk_norm_backward(F* dinp, F* dgamma, const F* dout, const F* inp, const F* gamma,
                      const F* rrms, int rows, int d);

// QK-norm, form logit_scale (docs/attention-maths.md §3.4) of one layer's q and
// k, each (B, H, T, d), with g (H) the logit scale of each head:
// q_out = (g_h / sqrt(d)) * q * r_q, k_out = k * r_k, r = (mean(x^2) + 1e-6)^(-1/2),
// so that attention's (1/sqrt(d)) q_out . k_out is g_h times the product of the unit rows
// q / sqrt(|q|^2 + d * 1e-6) and k / sqrt(|k|^2 + d * 1e-6).
// q_rrms, k_rrms (B, H, T) saved for the backward, which accumulates into dq, dk and dg.
template <typename F>
void qk_logit_scale_forward(F* q_out, F* k_out, F* q_rrms, F* k_rrms, const F* q, const F* k,
                            const F* g, int B, int H, int T, int d);
template <typename F>
void qk_logit_scale_backward(F* dq, F* dk, F* dg, const F* dq_out, const F* dk_out, const F* q,
                             const F* k, const F* g, const F* q_rrms, const F* k_rrms, int B,
                             int H, int T, int d);

// Fused softmax + cross-entropy over logits (N, V). losses (N). Returns mean loss.
// The backward writes (not accumulates) dlogits = (softmax - onehot) * dloss.
template <typename F>
F crossentropy_forward(F* losses, const F* logits, const int32_t* targets, int N, int V);
template <typename F>
void crossentropy_backward(F* dlogits, const F* logits, const int32_t* targets, F dloss, int N,
                           int V);

}  // namespace qattn::cpu
