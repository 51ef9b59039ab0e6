// K-interval quantised softmax (docs/attention-maths.md §5): each row's weights exp(s - m) are
// replaced by values on a grid of K + 1 points, by nearest rounding or linear
// interpolation, with the grid calibrated either on [min, max] of the row
// ("minmax") or on a fixed window [max - W, max] ("fwm").
#include <algorithm>
#include <cmath>
#include <vector>

#include "kinterval.hpp"
#include "rowwise.hpp"
#include "softmax.hpp"

namespace qattn::cpu {

namespace {

// The calibrated grid of one row: points g_a = g0 + a * delta, a = 0..K, g_K = m.
template <typename F>
struct Grid {
  int K;
  F g0, delta;
  F range;          // C = m - l (minmax only)
  bool flat;        // minmax with C < 1e-6: every weight is 1
  bool fwm;
  int argmax, argmin;  // ties: the lowest index

  Grid(const KIntervalOptions& opt, int n, const F* s) : K(opt.K), fwm(opt.calibration == Calibration::fwm) {
    argmax = argmin = 0;
    for (int j = 1; j < n; j++) {
      if (s[j] > s[argmax]) argmax = j;
      if (s[j] < s[argmin]) argmin = j;
    }
    const F m = s[argmax], l = s[argmin];
    range = m - l;
    if (fwm) {
      delta = F(opt.window) / F(K);
      g0 = m - F(opt.window);
      flat = false;
    } else {
      delta = range / F(K);
      g0 = l;
      flat = range < F(1e-6);
    }
  }
  // Grid value v_a = exp(g_a - m) = exp(-(K - a) delta).
  F level(int a) const { return std::exp(-F(K - a) * delta); }
  // Coordinate u = (s - g0) / delta, clamped to K (rounding can put the max a hair
  // above it) and, for minmax, to 0 (likewise the min). fwm: u < 0 is below the window.
  F coord(F s) const {
    const F u = std::min((s - g0) / delta, F(K));
    return fwm ? u : std::max(u, F(0));
  }
  // Lerp cell of u: a = min(floor(u), K - 1), t = u - a.
  int cell(F u) const { return std::min((int)std::floor(u), K - 1); }

  F weight(Rounding rounding, F s) const {
    if (flat) return 1;
    const F u = coord(s);
    if (u < 0) return 0;
    if (rounding == Rounding::nearest) return level((int)std::floor(u + F(0.5)));
    const int a = cell(u);
    const F t = u - F(a);
    return (1 - t) * level(a) + t * level(a + 1);
  }
};

template <typename F>
struct KIntervalRows {
  const KIntervalOptions& opt;
  void probs(int n, const F* s, F* p) const { kinterval_probs(opt, n, s, p); }
  void grad(int n, const F* s, const F*, const F* g, F* ds) const {
    kinterval_grad(opt, n, s, g, ds);
  }
};

}  // namespace

template <typename F>
void kinterval_weights(const KIntervalOptions& opt, int n, const F* s, F* w) {
  const Grid<F> grid(opt, n, s);
  for (int j = 0; j < n; j++) w[j] = grid.weight(opt.rounding, s[j]);
}

template <typename F>
void kinterval_probs(const KIntervalOptions& opt, int n, const F* s, F* p) {
  kinterval_weights(opt, n, s, p);
  F sum = 0;  // >= 1: the max entry has weight 1
  for (int j = 0; j < n; j++) sum += p[j];
  for (int j = 0; j < n; j++) p[j] /= sum;
}

template <typename F>
void kinterval_grad(const KIntervalOptions& opt, int n, const F* s, const F* g, F* ds) {
  if (opt.rounding == Rounding::nearest && opt.ste == Ste::prob) {
    // p^ = p + sg(p^ - p): the exact softmax gradient, no path through m or l.
    std::vector<F> p(n);
    softmax_row(n, s, p.data());
    softmax_row_grad(n, p.data(), g, ds);
    return;
  }
  const Grid<F> grid(opt, n, s);
  std::vector<F> h(n);  // h_j = dL/dw^_j = (g_j - gbar) / Z, through p^ = w^ / Z
  F Z = 0, gbar = 0;
  for (int j = 0; j < n; j++) {
    h[j] = grid.weight(opt.rounding, s[j]);
    Z += h[j];
    gbar += h[j] * g[j];
  }
  gbar /= Z;
  for (int j = 0; j < n; j++) h[j] = (g[j] - gbar) / Z;

  F dm = 0, dl = 0;  // dL/dm and dL/dl, landing on the argmax and argmin entries
  if (opt.rounding == Rounding::nearest) {
    // Weight STE: w^ = w + sg(w^ - w), w_j = exp(s_j - m).
    const F m = s[grid.argmax];
    for (int j = 0; j < n; j++) {
      const bool masked = opt.ste_window_mask && grid.fwm && grid.coord(s[j]) < 0;
      const F w = masked ? F(0) : std::exp(s[j] - m);
      ds[j] = w * h[j];
      dm -= w * h[j];
    }
  } else if (grid.flat) {
    std::fill(ds, ds + n, F(0));  // every weight is the constant 1
  } else {
    const F K = F(grid.K), C = grid.range;
    for (int j = 0; j < n; j++) {
      const F u = grid.coord(s[j]);
      if (u < 0) {  // below the fwm window: weight constant 0
        ds[j] = 0;
        continue;
      }
      const int a = grid.cell(u);
      const F t = u - F(a);
      const F va = grid.level(a), vb = grid.level(a + 1), dv = vb - va;
      ds[j] = h[j] * dv / grid.delta;
      if (grid.fwm) {
        dm -= h[j] * dv / grid.delta;
      } else {
        // Through the grid values v_a = exp(-(K - a) C / K): dv_a/dC = -(1 - a/K) v_a.
        const F dv_dC = -(1 - t) * (1 - F(a) / K) * va - t * (1 - F(a + 1) / K) * vb;
        dm += h[j] * (-(u / C) * dv + dv_dC);
        dl += h[j] * (-((K - u) / C) * dv - dv_dC);
      }
    }
  }
  if (!opt.detach_extrema) {
    ds[grid.argmax] += dm;
    ds[grid.argmin] += dl;
  }
}

template <typename F>
void kinterval_forward(const KIntervalOptions& opt, int T, int d, const F* q, const F* k,
                       const F* v, F* o) {
  rowwise_forward(KIntervalRows<F>{opt}, T, d, q, k, v, o);
}

template <typename F>
void kinterval_backward(const KIntervalOptions& opt, int T, int d, const F* q, const F* k,
                        const F* v, const F* dout, F* dq, F* dk, F* dv,
                        AttentionInternals<F>* keep) {
  rowwise_backward(KIntervalRows<F>{opt}, T, d, q, k, v, dout, dq, dk, dv, keep);
}

#define QATTN_INSTANTIATE(F)                                                                  \
  template void kinterval_weights<F>(const KIntervalOptions&, int, const F*, F*);             \
  template void kinterval_probs<F>(const KIntervalOptions&, int, const F*, F*);               \
  template void kinterval_grad<F>(const KIntervalOptions&, int, const F*, const F*, F*);      \
  template void kinterval_forward<F>(const KIntervalOptions&, int, int, const F*, const F*,   \
                                     const F*, F*);                                           \
  template void kinterval_backward<F>(const KIntervalOptions&, int, int, const F*, const F*,  \
                                      const F*, const F*, F*, F*, F*, AttentionInternals<F>*);
QATTN_INSTANTIATE(float)
QATTN_INSTANTIATE(double)
#undef QATTN_INSTANTIATE

}  // namespace qattn::cpu
