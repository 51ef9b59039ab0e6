// FPA, full-precision causal attention (docs/attention-maths.md §2): the baseline every other kind
// is measured against. S = c Q K^T, P = softmax_row(S), O = P V;
// dS = P o (dP - delta), delta_i = sum_j P_ij dP_ij (= dO_i . O_i).
#include <algorithm>
#include <cmath>

#include "rowwise.hpp"
#include "softmax.hpp"

namespace qattn::cpu {

template <typename F>
void softmax_row(int n, const F* s, F* p) {
  const F m = *std::max_element(s, s + n);
  F sum = 0;
  for (int j = 0; j < n; j++) {
    p[j] = std::exp(s[j] - m);
    sum += p[j];
  }
  for (int j = 0; j < n; j++) p[j] /= sum;
}

template <typename F>
void softmax_row_grad(int n, const F* p, const F* g, F* ds) {
  F delta = 0;
  for (int j = 0; j < n; j++) delta += p[j] * g[j];
  for (int j = 0; j < n; j++) ds[j] = p[j] * (g[j] - delta);
}

namespace {
template <typename F>
struct SoftmaxRows {
  void probs(int n, const F* s, F* p) const { softmax_row(n, s, p); }
  void grad(int n, const F*, const F* p, const F* g, F* ds) const { softmax_row_grad(n, p, g, ds); }
};
}  // namespace

template <typename F>
void fpa_forward(int T, int d, const F* q, const F* k, const F* v, F* o) {
  rowwise_forward(SoftmaxRows<F>{}, T, d, q, k, v, o);
}

template <typename F>
void fpa_backward(int T, int d, const F* q, const F* k, const F* v, const F* dout, F* dq, F* dk,
                  F* dv, AttentionInternals<F>* keep) {
  rowwise_backward(SoftmaxRows<F>{}, T, d, q, k, v, dout, dq, dk, dv, keep);
}

#define QATTN_INSTANTIATE(F)                                                                     \
  template void softmax_row<F>(int, const F*, F*);                                             \
  template void softmax_row_grad<F>(int, const F*, const F*, F*);                              \
  template void fpa_forward<F>(int, int, const F*, const F*, const F*, F*);                    \
  template void fpa_backward<F>(int, int, const F*, const F*, const F*, const F*, F*, F*, F*, \
                                AttentionInternals<F>*);
QATTN_INSTANTIATE(float)
QATTN_INSTANTIATE(double)
#undef QATTN_INSTANTIATE

}  // namespace qattn::cpu
