// CPU reference ops of GPT-2 (see include/qattn/cpu/ops.hpp). Plain loops;
// OpenMP over independent rows; `omp simd` reductions keep a fixed order, so
// results are deterministic for a given build and thread count.
#include "qattn/cpu/ops.hpp"

#include <algorithm>
#include <cmath>

namespace qattn::cpu {

template <typename F>
void encoder_forward(F* out, const int32_t* inp, const F* wte, const F* wpe, int B, int T, int C) {
#pragma omp parallel for collapse(2)
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      F* o = out + (static_cast<size_t>(b) * T + t) * C;       // (C)
      const F* e = wte + static_cast<size_t>(inp[b * T + t]) * C;
      const F* p = wpe + static_cast<size_t>(t) * C;
      for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
    }
}

template <typename F>
void encoder_backward(F* dwte, F* dwpe, const F* dout, const int32_t* inp, int B, int T, int C) {
  // Serial over tokens: two positions may share a token id.
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const F* d = dout + (static_cast<size_t>(b) * T + t) * C;
      F* e = dwte + static_cast<size_t>(inp[b * T + t]) * C;
      F* p = dwpe + static_cast<size_t>(t) * C;
      for (int c = 0; c < C; ++c) {
        e[c] += d[c];
        p[c] += d[c];
      }
    }
}

template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* w, const F* b, int N, int C) {
  const F eps = F(1e-5);
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    const F* x = inp + static_cast<size_t>(n) * C;
    F m = 0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    F v = 0;
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= C;
    const F s = F(1) / std::sqrt(v + eps);
    F* o = out + static_cast<size_t>(n) * C;
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * w[c] + b[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

template <typename F>
void layernorm_backward(F* dinp, F* dw, F* db, const F* dout, const F* inp, const F* w,
                        const F* mean, const F* rstd, int N, int C) {
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {  // dinp: rows are independent
    const F* d = dout + static_cast<size_t>(n) * C;
    const F* x = inp + static_cast<size_t>(n) * C;
    F dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int c = 0; c < C; ++c) {
      const F xhat = (x[c] - mean[n]) * rstd[n];
      const F dnorm = w[c] * d[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * xhat;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    F* di = dinp + static_cast<size_t>(n) * C;
    for (int c = 0; c < C; ++c) {
      const F xhat = (x[c] - mean[n]) * rstd[n];
      di[c] += (w[c] * d[c] - dnorm_mean - xhat * dnorm_norm_mean) * rstd[n];
    }
  }
#pragma omp parallel for
  for (int c = 0; c < C; ++c) {  // dw, db: reduce over rows, per channel
    F sw = 0, sb = 0;
    for (int n = 0; n < N; ++n) {
      const size_t i = static_cast<size_t>(n) * C + c;
      sw += (inp[i] - mean[n]) * rstd[n] * dout[i];
      sb += dout[i];
    }
    dw[c] += sw;
    db[c] += sb;
  }
}

// The matmuls work on blocks of kRows rows (forward, dinp) or kCols output
// channels (dw) so that each weight row or input row loaded from cache is used
// several times. Summation order is fixed: results do not depend on threads.
constexpr int kRows = 4, kCols = 8;

template <typename F>
void matmul_forward(F* out, const F* inp, const F* w, const F* bias, int N, int IC, int OC) {
#pragma omp parallel for
  for (int n0 = 0; n0 < N; n0 += kRows) {
    const int rows = std::min(kRows, N - n0);
    for (int oc = 0; oc < OC; ++oc) {
      const F* wr = w + static_cast<size_t>(oc) * IC;  // (IC)
      F acc[kRows] = {};
      for (int r = 0; r < rows; ++r) {
        const F* x = inp + static_cast<size_t>(n0 + r) * IC;
        F a = 0;
#pragma omp simd reduction(+ : a)
        for (int i = 0; i < IC; ++i) a += x[i] * wr[i];
        acc[r] = a;
      }
      for (int r = 0; r < rows; ++r) out[static_cast<size_t>(n0 + r) * OC + oc] = acc[r] + (bias ? bias[oc] : F(0));
    }
  }
}

template <typename F>
void matmul_backward(F* dinp, F* dw, F* dbias, const F* dout, const F* inp, const F* w, int N,
                     int IC, int OC) {
#pragma omp parallel for
  for (int n0 = 0; n0 < N; n0 += kRows) {  // dinp (N, IC) += dout (N, OC) . w (OC, IC)
    const int rows = std::min(kRows, N - n0);
    for (int oc = 0; oc < OC; ++oc) {
      const F* wr = w + static_cast<size_t>(oc) * IC;
      for (int r = 0; r < rows; ++r) {
        const F g = dout[static_cast<size_t>(n0 + r) * OC + oc];
        F* di = dinp + static_cast<size_t>(n0 + r) * IC;
#pragma omp simd
        for (int i = 0; i < IC; ++i) di[i] += g * wr[i];
      }
    }
  }
#pragma omp parallel for
  for (int o0 = 0; o0 < OC; o0 += kCols) {  // dw (OC, IC) += dout^T (OC, N) . inp (N, IC)
    const int cols = std::min(kCols, OC - o0);
    F db[kCols] = {};
    for (int n = 0; n < N; ++n) {
      const F* x = inp + static_cast<size_t>(n) * IC;
      for (int c = 0; c < cols; ++c) {
        const F g = dout[static_cast<size_t>(n) * OC + o0 + c];
        db[c] += g;
        F* dwr = dw + static_cast<size_t>(o0 + c) * IC;
#pragma omp simd
        for (int i = 0; i < IC; ++i) dwr[i] += g * x[i];
      }
    }
    if (dbias)
      for (int c = 0; c < cols; ++c) dbias[o0 + c] += db[c];
  }
}

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <typename F>
void gelu_forward(F* out, const F* inp, size_t n) {
  const F s = std::sqrt(F(2) / F(M_PI));
#pragma omp parallel for
  for (size_t i = 0; i < n; ++i) {
    const F x = inp[i];
    out[i] = F(0.5) * x * (F(1) + std::tanh(s * (x + F(0.044715) * x * x * x)));
  }
}

template <typename F>
void gelu_backward(F* dinp, const F* inp, const F* dout, size_t n) {
  const F s = std::sqrt(F(2) / F(M_PI));
#pragma omp parallel for
  for (size_t i = 0; i < n; ++i) {
    const F x = inp[i];
    const F u = s * (x + F(0.044715) * x * x * x);
    const F th = std::tanh(u);
    const F sech2 = F(1) - th * th;
    const F grad = F(0.5) * (F(1) + th) + F(0.5) * x * sech2 * s * (F(1) + F(3 * 0.044715) * x * x);
    dinp[i] += grad * dout[i];
  }
}

template <typename F>
void residual_forward(F* out, const F* a, const F* b, size_t n) {
#pragma omp parallel for
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

namespace {

// One row of QK-norm (docs/attention-maths.md §3.1, §3.4): y = w ∘ x·r with
// r = (mean(x²) + ε)^(−1/2). The form's multiplier of entry i is w[i·w_step]:
// w_step 1 for the gain form's γ, 0 for one multiplier of the whole row.
// Returns r.
template <typename F>
F qk_norm_row_forward(F* y, const F* x, const F* w, int w_step, int d) {
  F ms = 0;
  for (int i = 0; i < d; ++i) ms += x[i] * x[i];
  const F r = F(1) / std::sqrt(ms / d + F(1e-6));
  for (int i = 0; i < d; ++i) y[i] = w[i * w_step] * x[i] * r;
  return r;
}

// Its backward to x (§3.2): dx += r·(w ∘ dy) − x·r³·⟨w ∘ dy, x⟩ / d.
template <typename F>
void qk_norm_row_backward(F* dx, const F* dy, const F* x, const F* w, int w_step, F r, int d) {
  F dot = 0;
  for (int i = 0; i < d; ++i) dot += w[i * w_step] * dy[i] * x[i];
  for (int i = 0; i < d; ++i) dx[i] += r * w[i * w_step] * dy[i] - x[i] * r * r * r * dot / d;
}

}  // namespace

template <typename F>
void qk_norm_forward(F* out, F* rrms, const F* inp, const F* gamma, int rows, int d) {
#pragma omp parallel for
  for (int r = 0; r < rows; ++r) {
    const size_t o = static_cast<size_t>(r) * d;
    rrms[r] = qk_norm_row_forward(out + o, inp + o, gamma, 1, d);
  }
}

template <typename F>
void qk_norm_backward(F* dinp, F* dgamma, const F* dout, const F* inp, const F* gamma,
                      const F* rrms, int rows, int d) {
#pragma omp parallel for
  for (int r = 0; r < rows; ++r) {
    const size_t o = static_cast<size_t>(r) * d;
    qk_norm_row_backward(dinp + o, dout + o, inp + o, gamma, 1, rrms[r], d);
  }
  for (int r = 0; r < rows; ++r)  // serial: every row adds into the same d gains
    for (int i = 0; i < d; ++i) {
      const size_t k = static_cast<size_t>(r) * d + i;
      dgamma[i] += dout[k] * inp[k] * rrms[r];
    }
}

template <typename F>
void qk_logit_scale_forward(F* q_out, F* k_out, F* q_rrms, F* k_rrms, const F* q, const F* k,
                            const F* g, int B, int H, int T, int d) {
  const F c = F(1) / std::sqrt(F(d));
  const F one = 1;
#pragma omp parallel for collapse(2)
  for (int bh = 0; bh < B * H; ++bh)
    for (int t = 0; t < T; ++t) {
      const size_t r = static_cast<size_t>(bh) * T + t, o = r * d;
      const F w_q = g[bh % H] * c;  // the fold: (1/√d)·q'·k' = g_h·q̂·k̂
      q_rrms[r] = qk_norm_row_forward(q_out + o, q + o, &w_q, 0, d);
      k_rrms[r] = qk_norm_row_forward(k_out + o, k + o, &one, 0, d);
    }
}

template <typename F>
void qk_logit_scale_backward(F* dq, F* dk, F* dg, const F* dq_out, const F* dk_out, const F* q,
                             const F* k, const F* g, const F* q_rrms, const F* k_rrms, int B,
                             int H, int T, int d) {
  const F c = F(1) / std::sqrt(F(d));
  const F one = 1;
#pragma omp parallel for collapse(2)
  for (int bh = 0; bh < B * H; ++bh)
    for (int t = 0; t < T; ++t) {
      const size_t r = static_cast<size_t>(bh) * T + t, o = r * d;
      const F w_q = g[bh % H] * c;
      qk_norm_row_backward(dq + o, dq_out + o, q + o, &w_q, 0, q_rrms[r], d);
      qk_norm_row_backward(dk + o, dk_out + o, k + o, &one, 0, k_rrms[r], d);
    }
  // dg_h = c·Σ over the rows of head h of ⟨dq', q·r⟩ (§3.5); serial, in row order.
  for (int bh = 0; bh < B * H; ++bh)
    for (int t = 0; t < T; ++t) {
      const size_t r = static_cast<size_t>(bh) * T + t, o = r * d;
      F dot = 0;
      for (int i = 0; i < d; ++i) dot += dq_out[o + i] * q[o + i];
      dg[bh % H] += c * dot * q_rrms[r];
    }
}

template <typename F>
F crossentropy_forward(F* losses, const F* logits, const int32_t* targets, int N, int V) {
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    const F* z = logits + static_cast<size_t>(n) * V;
    F m = z[0];
    for (int v = 1; v < V; ++v) m = z[v] > m ? z[v] : m;
    F sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(z[v] - m);
    losses[n] = std::log(sum) + m - z[targets[n]];
  }
  F total = 0;
  for (int n = 0; n < N; ++n) total += losses[n];
  return total / N;
}

template <typename F>
void crossentropy_backward(F* dlogits, const F* logits, const int32_t* targets, F dloss, int N, int V) {
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    const F* z = logits + static_cast<size_t>(n) * V;
    F* dz = dlogits + static_cast<size_t>(n) * V;
    F m = z[0];
    for (int v = 1; v < V; ++v) m = z[v] > m ? z[v] : m;
    F sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(z[v] - m);
    for (int v = 0; v < V; ++v) dz[v] = (std::exp(z[v] - m) / sum - (v == targets[n] ? F(1) : F(0))) * dloss;
  }
}

#define QATTN_INSTANTIATE_OPS(F)                                                                 \
  template void encoder_forward<F>(F*, const int32_t*, const F*, const F*, int, int, int);       \
  template void encoder_backward<F>(F*, F*, const F*, const int32_t*, int, int, int);            \
  template void layernorm_forward<F>(F*, F*, F*, const F*, const F*, const F*, int, int);        \
  template void layernorm_backward<F>(F*, F*, F*, const F*, const F*, const F*, const F*,        \
                                      const F*, int, int);                                       \
  template void matmul_forward<F>(F*, const F*, const F*, const F*, int, int, int);              \
  template void matmul_backward<F>(F*, F*, F*, const F*, const F*, const F*, int, int, int);     \
  template void gelu_forward<F>(F*, const F*, size_t);                                           \
  template void gelu_backward<F>(F*, const F*, const F*, size_t);                                \
  template void residual_forward<F>(F*, const F*, const F*, size_t);                             \
  template void qk_norm_forward<F>(F*, F*, const F*, const F*, int, int);                        \
  template void qk_norm_backward<F>(F*, F*, const F*, const F*, const F*, const F*, int, int);   \
  template void qk_logit_scale_forward<F>(F*, F*, F*, F*, const F*, const F*, const F*, int, int, \
                                          int, int);                                             \
  template void qk_logit_scale_backward<F>(F*, F*, F*, const F*, const F*, const F*, const F*,   \
                                           const F*, const F*, const F*, int, int, int, int);    \
  template F crossentropy_forward<F>(F*, const F*, const int32_t*, int, int);                    \
  template void crossentropy_backward<F>(F*, const F*, const int32_t*, F, int, int);

QATTN_INSTANTIATE_OPS(float)
QATTN_INSTANTIATE_OPS(double)

}  // namespace qattn::cpu
