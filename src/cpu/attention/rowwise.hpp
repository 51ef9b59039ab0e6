// Causal attention computed one query row at a time, for the kinds that differ
// from FPA only in the map from a row of scores s_j = c q.k_j to a row of
// probabilities (FPA's softmax, K-interval's quantised softmax). `Rows` provides
//   void probs(int n, const F* s, F* p) const;                       p = map(s)
//   void grad(int n, const F* s, const F* p, const F* g, F* ds) const;
// where g = dL/dp and ds = dL/ds, over the n = i + 1 visible keys of row i.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "kinds.hpp"

namespace qattn::cpu {

// sum_x a_x b_x over one row of n entries.
template <typename F>
F row_dot(const F* a, const F* b, int n) {
  F acc = 0;
  for (int x = 0; x < n; x++) acc += a[x] * b[x];
  return acc;
}

// s (i + 1) = c q_i . k_j for the visible keys j <= i.
template <typename F>
void causal_scores_row(int i, int d, const F* q, const F* k, F* s) {
  const F c = F(1) / std::sqrt(F(d));
  for (int j = 0; j <= i; j++) s[j] = c * row_dot(q + (size_t)i * d, k + (size_t)j * d, d);
}

template <typename F, typename Rows>
void rowwise_forward(const Rows& rows, int T, int d, const F* q, const F* k, const F* v, F* o) {
  std::vector<F> s(T), p(T);  // one row of scores and probabilities
  for (int i = 0; i < T; i++) {
    const int n = i + 1;
    causal_scores_row(i, d, q, k, s.data());
    rows.probs(n, s.data(), p.data());
    F* oi = o + (size_t)i * d;  // (d)
    std::fill(oi, oi + d, F(0));
    for (int j = 0; j < n; j++)
      for (int x = 0; x < d; x++) oi[x] += p[j] * v[(size_t)j * d + x];
  }
}

template <typename F, typename Rows>
void rowwise_backward(const Rows& rows, int T, int d, const F* q, const F* k, const F* v,
                      const F* dout, F* dq, F* dk, F* dv, AttentionInternals<F>* keep) {
  const F c = F(1) / std::sqrt(F(d));
  const size_t Td = (size_t)T * d;
  std::fill(dq, dq + Td, F(0));
  std::fill(dk, dk + Td, F(0));
  std::fill(dv, dv + Td, F(0));
  if (keep) {
    keep->p.assign((size_t)T * T, F(0));
    keep->ds.assign((size_t)T * T, F(0));
  }
  std::vector<F> s(T), p(T), g(T), ds(T);  // one row each; g = dL/dp
  for (int i = 0; i < T; i++) {
    const int n = i + 1;
    const F* qi = q + (size_t)i * d;
    const F* doi = dout + (size_t)i * d;
    causal_scores_row(i, d, q, k, s.data());
    rows.probs(n, s.data(), p.data());
    for (int j = 0; j < n; j++) g[j] = row_dot(doi, v + (size_t)j * d, d);
    rows.grad(n, s.data(), p.data(), g.data(), ds.data());
    F* dqi = dq + (size_t)i * d;
    for (int j = 0; j < n; j++) {
      const F* kj = k + (size_t)j * d;
      F* dkj = dk + (size_t)j * d;
      F* dvj = dv + (size_t)j * d;
      for (int x = 0; x < d; x++) {
        dqi[x] += c * ds[j] * kj[x];
        dkj[x] += c * ds[j] * qi[x];
        dvj[x] += p[j] * doi[x];
      }
    }
    if (keep) {
      std::copy(p.begin(), p.begin() + n, keep->p.begin() + (size_t)i * T);
      std::copy(ds.begin(), ds.begin() + n, keep->ds.begin() + (size_t)i * T);
    }
  }
}

}  // namespace qattn::cpu
