// The public CPU attention entry points: dispatch on AttentionConfig::kind, and
// the comparison of a kind (docs/attention-maths.md §7) against FPA on the same inputs.
#include <cmath>
#include <vector>

#include "kinds.hpp"
#include "qattn/cpu/attention.hpp"
#include "rowwise.hpp"

namespace qattn::cpu {

template <typename F>
void attention_forward(const AttentionConfig& cfg, int T, int d, const F* q, const F* k,
                       const F* v, F* o) {
  switch (cfg.kind) {
    case AttentionKind::fpa: return fpa_forward(T, d, q, k, v, o);
    case AttentionKind::sage: return sage_forward(cfg.sage, T, d, q, k, v, o);
    case AttentionKind::kinterval: return kinterval_forward(cfg.kinterval, T, d, q, k, v, o);
  }
}

namespace {
template <typename F>
void backward_keeping(const AttentionConfig& cfg, int T, int d, const F* q, const F* k,
                      const F* v, const F* o, const F* dout, F* dq, F* dk, F* dv,
                      AttentionInternals<F>* keep) {
  switch (cfg.kind) {
    case AttentionKind::fpa: return fpa_backward(T, d, q, k, v, dout, dq, dk, dv, keep);
    case AttentionKind::sage:
      return sage_backward(cfg.sage, T, d, q, k, v, o, dout, dq, dk, dv, keep);
    case AttentionKind::kinterval:
      return kinterval_backward(cfg.kinterval, T, d, q, k, v, dout, dq, dk, dv, keep);
  }
}

// Cosine similarity and relative L2 error of x against the reference r.
struct Agreement {
  double cos, rel;
};
Agreement agreement(const std::vector<double>& x, const std::vector<double>& r) {
  double xr = 0, xx = 0, rr = 0, ee = 0;
  for (size_t n = 0; n < x.size(); n++) {
    xr += x[n] * r[n];
    xx += x[n] * x[n];
    rr += r[n] * r[n];
    ee += (x[n] - r[n]) * (x[n] - r[n]);
  }
  // Two zero tensors agree exactly; a zero against a non-zero does not at all.
  const double cos = (xx == 0 || rr == 0) ? (xx == rr ? 1.0 : 0.0) : xr / std::sqrt(xx * rr);
  const double rel = rr == 0 ? (ee == 0 ? 0.0 : INFINITY) : std::sqrt(ee / rr);
  return {cos, rel};
}

// Everything one kind produces on one head, in double.
struct HeadResult {
  std::vector<double> o, dq, dk, dv;  // (T, d) each
  AttentionInternals<double> inner;   // P, dS (T, T)
};
HeadResult run_head(const AttentionConfig& cfg, int T, int d, const std::vector<double>& q,
                    const std::vector<double>& k, const std::vector<double>& v,
                    const std::vector<double>& dout) {
  const size_t Td = (size_t)T * d;
  HeadResult r{std::vector<double>(Td), std::vector<double>(Td), std::vector<double>(Td),
               std::vector<double>(Td), {}};
  attention_forward(cfg, T, d, q.data(), k.data(), v.data(), r.o.data());
  backward_keeping(cfg, T, d, q.data(), k.data(), v.data(), r.o.data(), dout.data(), r.dq.data(),
                   r.dk.data(), r.dv.data(), &r.inner);
  return r;
}
}  // namespace

template <typename F>
void attention_backward(const AttentionConfig& cfg, int T, int d, const F* q, const F* k,
                        const F* v, const F* o, const F* dout, F* dq, F* dk, F* dv) {
  backward_keeping<F>(cfg, T, d, q, k, v, o, dout, dq, dk, dv, nullptr);
}

AttentionComparison compare_to_fpa(const AttentionConfig& cfg, int T, int d, const float* q,
                                   const float* k, const float* v, const float* dout) {
  const size_t Td = (size_t)T * d;
  const std::vector<double> qd(q, q + Td), kd(k, k + Td), vd(v, v + Td), dod(dout, dout + Td);
  AttentionConfig fpa;
  fpa.kind = AttentionKind::fpa;
  const HeadResult ref = run_head(fpa, T, d, qd, kd, vd, dod);
  const HeadResult got = run_head(cfg, T, d, qd, kd, vd, dod);

  AttentionComparison c{};
  const auto set = [](double& cos, double& rel, Agreement a) { cos = a.cos, rel = a.rel; };
  set(c.cos_o, c.rel_o, agreement(got.o, ref.o));
  set(c.cos_p, c.rel_p, agreement(got.inner.p, ref.inner.p));
  set(c.cos_ds, c.rel_ds, agreement(got.inner.ds, ref.inner.ds));
  set(c.cos_dq, c.rel_dq, agreement(got.dq, ref.dq));
  set(c.cos_dk, c.rel_dk, agreement(got.dk, ref.dk));
  set(c.cos_dv, c.rel_dv, agreement(got.dv, ref.dv));
  std::vector<double> s(T);
  c.max_abs_score = 0;
  for (int i = 0; i < T; i++) {
    causal_scores_row(i, d, qd.data(), kd.data(), s.data());
    for (int j = 0; j <= i; j++) c.max_abs_score = std::max(c.max_abs_score, std::abs(s[j]));
  }
  return c;
}

#define QATTN_INSTANTIATE(F)                                                                    \
  template void attention_forward<F>(const AttentionConfig&, int, int, const F*, const F*,     \
                                     const F*, F*);                                            \
  template void attention_backward<F>(const AttentionConfig&, int, int, const F*, const F*,    \
                                      const F*, const F*, const F*, F*, F*, F*);
QATTN_INSTANTIATE(float)
QATTN_INSTANTIATE(double)
#undef QATTN_INSTANTIATE

}  // namespace qattn::cpu
