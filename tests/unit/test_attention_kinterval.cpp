// K-interval quantised softmax (docs/attention-maths.md §5): shift invariance, zero row sums of
// dL/dS (and detach_extrema breaking them), the lerp gradient by finite
// differences, the two STE formulas, the fwm window, and K -> infinity.
#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <string>

#include "../../src/cpu/attention/kinterval.hpp"
#include "../../src/cpu/attention/softmax.hpp"
#include "test_attention_common.hpp"

using namespace qattn;
using namespace qattn::test;

namespace {

// Every option combination §5 distinguishes (ste only with nearest,
// ste_window_mask only with weight STE under fwm).
std::vector<KIntervalOptions> all_combinations() {
  std::vector<KIntervalOptions> out;
  for (int K : {1, 4, 16})
    for (Calibration cal : {Calibration::minmax, Calibration::fwm})
      for (bool detach : {false, true}) {
        KIntervalOptions o;
        o.K = K, o.calibration = cal, o.window = 3.0, o.detach_extrema = detach;
        o.rounding = Rounding::lerp;
        out.push_back(o);
        o.rounding = Rounding::nearest;
        o.ste = Ste::prob;
        out.push_back(o);
        o.ste = Ste::weight;
        out.push_back(o);
        if (cal == Calibration::fwm) {
          o.ste_window_mask = true;
          out.push_back(o);
        }
      }
  return out;
}

std::string describe(const KIntervalOptions& o) {
  return "K=" + std::to_string(o.K) + " " + to_string(o.calibration) + " " + to_string(o.rounding) +
         " ste=" + to_string(o.ste) + (o.ste_window_mask ? " mask" : "") +
         (o.detach_extrema ? " detach" : "");
}

struct Row {
  std::vector<double> s, g;  // scores and dL/dp^ of one row
};
// Scores with spread ~ 2 sigma (wider than the window 3 used above, so fwm rows
// have entries below the window).
Row random_row(int n, uint64_t seed) {
  return {gaussian(n, 2.0, seed), gaussian(n, 1.0, seed + 9)};
}

std::vector<double> row_grad(const KIntervalOptions& o, const Row& r) {
  std::vector<double> ds(r.s.size());
  cpu::kinterval_grad(o, (int)r.s.size(), r.s.data(), r.g.data(), ds.data());
  return ds;
}
std::vector<double> row_probs(const KIntervalOptions& o, const std::vector<double>& s) {
  std::vector<double> p(s.size());
  cpu::kinterval_probs(o, (int)s.size(), s.data(), p.data());
  return p;
}

AttentionConfig kinterval_config(const KIntervalOptions& o) {
  AttentionConfig cfg;
  cfg.kind = AttentionKind::kinterval;
  cfg.kinterval = o;
  return cfg;
}

}  // namespace

TEST_CASE("kinterval forward and backward are shift invariant", "[attention][kinterval]") {
  for (const KIntervalOptions& o : all_combinations()) {
    INFO(describe(o));
    for (uint64_t seed = 1; seed <= 5; seed++) {
      const Row r = random_row(23, seed);
      Row shifted = r;
      for (double& s : shifted.s) s += 3.25;  // exact in binary: no new rounding in s
      CHECK(max_rel(row_probs(o, shifted.s), row_probs(o, r.s)) < 1e-12);
      CHECK(max_rel(row_grad(o, shifted), row_grad(o, r)) < 1e-9);
    }
  }
  // Whole attention: adding one vector to every key shifts each score row by a constant.
  const Head h(24, 8, 1.5, 3);
  Head shifted = h;
  for (int j = 0; j < h.T; j++)
    for (int x = 0; x < h.d; x++) shifted.k[(size_t)j * h.d + x] += 0.3 * (x + 1);
  for (const KIntervalOptions& o : all_combinations()) {
    if (o.detach_extrema)
      continue;  // dK = c dS^T Q is shift invariant only when rows of dS sum to 0
    INFO(describe(o));
    const Grads<double> a = run_kind<double>(kinterval_config(o), h);
    const Grads<double> b = run_kind<double>(kinterval_config(o), shifted);
    CHECK(max_rel(b.o, a.o) < 1e-9);
    CHECK(max_rel(b.dq, a.dq) < 1e-8);
    CHECK(max_rel(b.dk, a.dk) < 1e-8);
    CHECK(max_rel(b.dv, a.dv) < 1e-9);
  }
}

TEST_CASE("kinterval rows of dL/dS sum to zero, except under detach_extrema",
          "[attention][kinterval]") {
  for (const KIntervalOptions& o : all_combinations()) {
    INFO(describe(o));
    for (uint64_t seed = 1; seed <= 5; seed++) {
      const Row r = random_row(31, 40 + seed);
      const auto ds = row_grad(o, r);
      double sum = 0, abs_sum = 0;
      for (double x : ds) sum += x, abs_sum += std::abs(x);
      REQUIRE(abs_sum > 0);
      const bool calibration_free = o.rounding == Rounding::nearest && o.ste == Ste::prob;
      if (!o.detach_extrema || calibration_free)
        CHECK(std::abs(sum) <= 1e-6 * abs_sum);
      else
        CHECK(std::abs(sum) > 1e-4 * abs_sum);  // zero sums sit near 1e-16
    }
  }
  // The same through the whole attention backward (every row of the kept dS).
  const Head h(20, 8, 2.0, 5);
  KIntervalOptions o;  // defaults: minmax, lerp
  AttentionConfig cfg = kinterval_config(o);
  const size_t Td = h.size();
  std::vector<double> dq(Td), dk(Td), dv(Td);
  cpu::AttentionInternals<double> inner;
  cpu::kinterval_backward(o, h.T, h.d, h.q.data(), h.k.data(), h.v.data(), h.dout.data(), dq.data(),
                          dk.data(), dv.data(), &inner);
  for (int i = 0; i < h.T; i++) {
    double sum = 0, abs_sum = 0;
    for (int j = 0; j <= i; j++)
      sum += inner.ds[(size_t)i * h.T + j], abs_sum += std::abs(inner.ds[(size_t)i * h.T + j]);
    CHECK(std::abs(sum) <= 1e-6 * abs_sum + 1e-300);
  }
}

TEST_CASE("kinterval nearest + prob STE: detach_extrema changes nothing",
          "[attention][kinterval]") {
  for (Calibration cal : {Calibration::minmax, Calibration::fwm}) {
    KIntervalOptions o;
    o.rounding = Rounding::nearest, o.ste = Ste::prob, o.calibration = cal;
    KIntervalOptions detached = o;
    detached.detach_extrema = true;
    const Row r = random_row(17, 77);
    CHECK(row_grad(detached, r) == row_grad(o, r));
  }
}

TEST_CASE("kinterval lerp gradient equals finite differences (double)", "[attention][kinterval]") {
  for (Calibration cal : {Calibration::minmax, Calibration::fwm})
    for (int K : {1, 3, 8}) {
      KIntervalOptions o;
      o.rounding = Rounding::lerp, o.calibration = cal, o.K = K, o.window = 2.0;
      INFO(describe(o));
      // Row level: L = <g, p^(s)>, which exercises the paths through m and l directly.
      const Row r = random_row(15, 200 + K);
      const auto ds = row_grad(o, r);
      std::vector<double> fd(r.s.size());
      for (size_t j = 0; j < r.s.size(); j++) {
        const auto loss = [&](double step) {
          auto s = r.s;
          s[j] += step;
          const auto p = row_probs(o, s);
          return std::inner_product(p.begin(), p.end(), r.g.begin(), 0.0);
        };
        fd[j] = (loss(1e-6) - loss(-1e-6)) / 2e-6;
      }
      CHECK(max_rel(ds, fd) < 1e-7);
      // Whole attention.
      const Head h(8, 4, 1.5, 300 + K);
      const AttentionConfig cfg = kinterval_config(o);
      const Grads<double> g = run_kind<double>(cfg, h);
      const auto fdg = finite_difference_grads(
          h,
          [&](const double* q, const double* k, const double* v, double* out) {
            cpu::attention_forward(cfg, h.T, h.d, q, k, v, out);
          },
          1e-6);
      CHECK(max_rel(concat(g.dq, g.dk, g.dv), fdg) < 1e-6);
    }
}

TEST_CASE("kinterval prob STE is the exact softmax gradient", "[attention][kinterval]") {
  KIntervalOptions o;
  o.rounding = Rounding::nearest, o.ste = Ste::prob, o.K = 4;
  const Row r = random_row(19, 500);
  const int n = (int)r.s.size();
  // p = softmax(s); ds_j = p_j (g_j - sum_i p_i g_i), written out here.
  const double m = *std::max_element(r.s.begin(), r.s.end());
  std::vector<double> p(n), want(n);
  double z = 0, pg = 0;
  for (int j = 0; j < n; j++) z += (p[j] = std::exp(r.s[j] - m));
  for (int j = 0; j < n; j++) pg += (p[j] /= z) * r.g[j];
  for (int j = 0; j < n; j++) want[j] = p[j] * (r.g[j] - pg);
  CHECK(max_rel(row_grad(o, r), want) < 1e-14);
  // Through the whole attention, dQ and dK equal FPA's (dV uses the quantised p^).
  const Head h(16, 8, 1.5, 600);
  const Grads<double> got = run_kind<double>(kinterval_config(o), h);
  const Grads<double> fpa = run_kind<double>(AttentionConfig{}, h);
  CHECK(max_rel(got.dq, fpa.dq) < 1e-12);
  CHECK(max_rel(got.dk, fpa.dk) < 1e-12);
  CHECK(max_rel(got.dv, fpa.dv) > 1e-3);
}

TEST_CASE("kinterval weight STE is its formula with the argmax term", "[attention][kinterval]") {
  for (Calibration cal : {Calibration::minmax, Calibration::fwm})
    for (bool mask : {false, true}) {
      if (mask && cal == Calibration::minmax) continue;
      KIntervalOptions o;
      o.rounding = Rounding::nearest, o.ste = Ste::weight, o.K = 4, o.calibration = cal;
      o.window = 3.0, o.ste_window_mask = mask;
      INFO(describe(o));
      const Row r = random_row(21, 700);
      const int n = (int)r.s.size();
      std::vector<double> w_hat(n);
      cpu::kinterval_weights(o, n, r.s.data(), w_hat.data());
      const double Z = std::accumulate(w_hat.begin(), w_hat.end(), 0.0);
      double gbar = 0;
      for (int j = 0; j < n; j++) gbar += w_hat[j] / Z * r.g[j];
      const int argmax = (int)(std::max_element(r.s.begin(), r.s.end()) - r.s.begin());
      const double m = r.s[argmax];
      std::vector<double> want(n);
      double dm = 0;
      for (int j = 0; j < n; j++) {
        const bool below = r.s[j] < m - o.window;
        const double w = (mask && below) ? 0.0 : std::exp(r.s[j] - m);
        want[j] = w * (r.g[j] - gbar) / Z;
        dm -= want[j];
      }
      REQUIRE(std::abs(dm) > 1e-4);  // the argmax term matters at the tolerance below
      want[argmax] += dm;
      CHECK(max_rel(row_grad(o, r), want) < 1e-13);
    }
}

TEST_CASE("kinterval fwm gives weight exactly 0 below the window", "[attention][kinterval]") {
  for (Rounding rounding : {Rounding::nearest, Rounding::lerp}) {
    KIntervalOptions o;
    o.calibration = Calibration::fwm, o.window = 2.0, o.K = 4, o.rounding = rounding;
    // m = 1: the window is [-1, 1]; -1.2 is below it (nearest would round it up to
    // g_0 without the rule), -0.9 is inside.
    const std::vector<double> s = {1.0, -1.2, -0.9, -5.0, 0.2};
    std::vector<double> w(s.size());
    cpu::kinterval_weights(o, (int)s.size(), s.data(), w.data());
    CHECK(w[0] == 1.0);
    CHECK(w[1] == 0.0);
    CHECK(w[2] > 0.0);
    CHECK(w[3] == 0.0);
    CHECK(w[4] > 0.0);
  }
  // minmax keeps every entry: the minimum sits on g_0 with weight exp(-(m - l)).
  KIntervalOptions o;
  const std::vector<double> s = {1.0, -5.0, 0.0};
  std::vector<double> w(3);
  cpu::kinterval_weights(o, 3, s.data(), w.data());
  CHECK(w[1] == Approx(std::exp(-6.0)).epsilon(1e-12));
}

// The forward error of linear interpolation falls as 1/K^2, but the gradient
// uses the slope of each interpolation cell, whose error falls as 1/K.
TEST_CASE("kinterval lerp approaches fpa as K grows", "[attention][kinterval]") {
  const Head h(32, 8, 1.0, 900);
  const Grads<double> fpa = run_kind<double>(AttentionConfig{}, h);
  double previous = INFINITY;
  for (int K : {4, 32, 256, 2048}) {
    KIntervalOptions o;
    o.K = K, o.rounding = Rounding::lerp, o.calibration = Calibration::minmax;
    const Grads<double> g = run_kind<double>(kinterval_config(o), h);
    const double err = std::max(
        {rel_l2(g.o, fpa.o), rel_l2(g.dq, fpa.dq), rel_l2(g.dk, fpa.dk), rel_l2(g.dv, fpa.dv)});
    INFO("K = " << K << ": largest relative L2 error vs fpa " << err);
    CHECK(err < previous / 5);  // K grows 8x a step
    previous = err;
  }
  CHECK(previous < 1e-3);
}

// Scores far past where training starts (q, k of standard deviation σ give scores
// of standard deviation σ² at any d, rows spanning up to ~6σ² nats, so the grid
// spacing Δ reaches ~6σ²/K): the reference in float stays finite and agrees with
// double, for the rules of the detach_extrema sweep (lerp minmax K = 32, attached
// and detached) and nearest minmax with the probability STE.
TEST_CASE("kinterval stays finite and float agrees with double at large score magnitudes",
          "[attention][kinterval][large]") {
  KIntervalOptions lerp, nearest;
  lerp.K = nearest.K = 32;
  lerp.rounding = Rounding::lerp;
  nearest.rounding = Rounding::nearest, nearest.ste = Ste::prob;
  KIntervalOptions detached = lerp;
  detached.detach_extrema = true;
  for (const double sigma : {10.0, 30.0, 100.0, 300.0, 3000.0})
    for (const KIntervalOptions& o : {lerp, detached, nearest}) {
      const Head h(128, 64, sigma, 1000);
      const Grads<float> f = run_kind<float>(kinterval_config(o), h);
      const Grads<double> g = run_kind<double>(kinterval_config(o), h);
      const auto finite = [](const std::vector<float>& x) {
        return std::all_of(x.begin(), x.end(), [](float e) { return std::isfinite(e); });
      };
      const double err_o = rel_l2(f.o, g.o), err_dq = rel_l2(f.dq, g.dq),
                   err_dk = rel_l2(f.dk, g.dk), err_dv = rel_l2(f.dv, g.dv);
      INFO("sigma " << sigma << " " << describe(o) << ": float vs double rel L2 o " << err_o
                    << " dq " << err_dq << " dk " << err_dk << " dv " << err_dv);
      CHECK((finite(f.o) && finite(f.dq) && finite(f.dk) && finite(f.dv)));
      CHECK(err_o < 1e-4);
      // The probability STE's dS is FPA's, p (g − Σ p g): at the max it cancels in
      // float once the other entries' p are below 2^−24 (gaps past ~17 nats, which
      // these rows have), so its gradients are compared in double only (the other tests).
      if (o.rounding == Rounding::lerp) {
        CHECK(err_dq < 1e-3);
        CHECK(err_dk < 1e-3);
      }
      CHECK(err_dv < 1e-4);
    }
}
