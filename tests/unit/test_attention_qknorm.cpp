// QK-norm (docs/attention-maths.md §3). Form gain: y = gamma * x / sqrt(mean(x^2) + 1e-6)
// per row of head_dim. Form logit_scale: q' = (g_h / sqrt(d)) q r_q, k' = k r_k, so that
// attention's scores are g_h q̂·k̂. The gradients of L = <dout, y> by finite
// differences (double), the fold against its definition.
#include <catch2/catch.hpp>
#include <cmath>

#include "fd.hpp"
#include "qattn/cpu/ops.hpp"
#include "test_attention_common.hpp"

using namespace qattn;
using namespace qattn::test;

TEST_CASE("qk_norm gradient equals finite differences (double)", "[attention][qknorm]") {
  const int rows = 6, d = 8;
  const size_t n = (size_t)rows * d;
  std::vector<double> x = gaussian(n, 2.0, 81), gamma = gaussian(d, 1.0, 82),
                      dout = gaussian(n, 1.0, 83);
  x[3] = 0.0;  // a row with a zero entry is still smooth
  std::vector<double> y(n), rrms(rows), dx(n, 0.0), dgamma(d, 0.0);
  cpu::qk_norm_forward(y.data(), rrms.data(), x.data(), gamma.data(), rows, d);
  // Forward against the formula, and the normalisation itself.
  for (int r = 0; r < rows; r++) {
    double ms = 0;
    for (int i = 0; i < d; i++) ms += x[r * d + i] * x[r * d + i] / d;
    for (int i = 0; i < d; i++)
      CHECK(y[r * d + i] == Approx(gamma[i] * x[r * d + i] / std::sqrt(ms + 1e-6)).epsilon(1e-14));
  }
  cpu::qk_norm_backward(dx.data(), dgamma.data(), dout.data(), x.data(), gamma.data(), rrms.data(),
                        rows, d);
  const auto loss = [&] {
    std::vector<double> out(n), rr(rows);
    cpu::qk_norm_forward(out.data(), rr.data(), x.data(), gamma.data(), rows, d);
    double l = 0;
    for (size_t e = 0; e < n; e++) l += dout[e] * out[e];
    return l;
  };
  const auto fd = [&](std::vector<double>& t) { return numeric_gradient(t, loss); };
  CHECK(max_rel(dx, fd(x)) < 1e-8);
  CHECK(max_rel(dgamma, fd(gamma)) < 1e-8);
  // The backward accumulates: a second call doubles the gradients.
  std::vector<double> dx2 = dx, dgamma2 = dgamma;
  cpu::qk_norm_backward(dx2.data(), dgamma2.data(), dout.data(), x.data(), gamma.data(),
                        rrms.data(), rows, d);
  for (size_t e = 0; e < n; e++) CHECK(dx2[e] == Approx(2 * dx[e]).epsilon(1e-14));
}

namespace {

// One layer's q and k (B, H, T, d) through the logit-scale form.
struct LogitScaleCase {
  int B = 2, H = 3, T = 4, d = 8;
  size_t n() const { return static_cast<size_t>(B) * H * T * d; }
  size_t rows() const { return static_cast<size_t>(B) * H * T; }
  std::vector<double> q = gaussian(n(), 2.0, 91), k = gaussian(n(), 0.5, 92), g = {4.3, -0.7, 1.9};
  std::vector<double> q_out = std::vector<double>(n()), k_out = std::vector<double>(n()),
                      q_rrms = std::vector<double>(rows()), k_rrms = std::vector<double>(rows());
  void forward() {
    cpu::qk_logit_scale_forward(q_out.data(), k_out.data(), q_rrms.data(), k_rrms.data(), q.data(),
                                k.data(), g.data(), B, H, T, d);
  }
};

}  // namespace

TEST_CASE("qk_norm logit_scale: (1/sqrt(d)) q'.k' equals g_h times the unit rows' product", "[attention][qknorm]") {
  LogitScaleCase c;
  c.q[5] = 0.0;  // a zero entry changes nothing
  c.forward();
  const int d = c.d;
  const double eps_l2 = d * 1e-6;  // the unit normalisation's epsilon (§3.4)
  auto unit = [&](const std::vector<double>& x, size_t row) {
    double ss = 0;
    for (int i = 0; i < d; i++) ss += x[row * d + i] * x[row * d + i];
    std::vector<double> u(d);
    for (int i = 0; i < d; i++) u[i] = x[row * d + i] / std::sqrt(ss + eps_l2);
    return u;
  };
  for (int bh = 0; bh < c.B * c.H; bh++)
    for (int i = 0; i < c.T; i++)
      for (int j = 0; j < c.T; j++) {
        const size_t qi = static_cast<size_t>(bh) * c.T + i, kj = static_cast<size_t>(bh) * c.T + j;
        double folded = 0;
        for (int e = 0; e < d; e++) folded += c.q_out[qi * d + e] * c.k_out[kj * d + e];
        folded /= std::sqrt(static_cast<double>(d));
        const auto uq = unit(c.q, qi), uk = unit(c.k, kj);
        double cosine = 0;
        for (int e = 0; e < d; e++) cosine += uq[e] * uk[e];
        INFO("head " << bh % c.H << " i " << i << " j " << j);
        CHECK(folded == Approx(c.g[bh % c.H] * cosine).epsilon(1e-13).margin(1e-15));
        CHECK(std::abs(folded) <= std::abs(c.g[bh % c.H]) * (1 + 1e-15));  // |S| <= |g_h|
      }
  // k' is k with RMS 1 (the gain form with gamma = 1).
  std::vector<double> ones(d, 1.0), k_gain(c.n()), rr(c.rows());
  cpu::qk_norm_forward(k_gain.data(), rr.data(), c.k.data(), ones.data(), static_cast<int>(c.rows()), d);
  CHECK(k_gain == c.k_out);
  CHECK(rr == c.k_rrms);
}

TEST_CASE("qk_norm logit_scale gradient equals finite differences (double)", "[attention][qknorm]") {
  LogitScaleCase c;
  const std::vector<double> dq_out = gaussian(c.n(), 1.0, 93), dk_out = gaussian(c.n(), 1.0, 94);
  c.forward();
  std::vector<double> dq(c.n(), 0.0), dk(c.n(), 0.0), dg(c.H, 0.0);
  auto backward = [&] {
    cpu::qk_logit_scale_backward(dq.data(), dk.data(), dg.data(), dq_out.data(), dk_out.data(),
                                 c.q.data(), c.k.data(), c.g.data(), c.q_rrms.data(),
                                 c.k_rrms.data(), c.B, c.H, c.T, c.d);
  };
  backward();
  const auto loss = [&] {
    c.forward();
    double l = 0;
    for (size_t e = 0; e < c.n(); e++) l += dq_out[e] * c.q_out[e] + dk_out[e] * c.k_out[e];
    return l;
  };
  const auto fd = [&](std::vector<double>& t) { return numeric_gradient(t, loss); };
  CHECK(max_rel(dq, fd(c.q)) < 1e-7);
  CHECK(max_rel(dk, fd(c.k)) < 1e-7);
  CHECK(max_rel(dg, fd(c.g)) < 1e-8);
  // The backward accumulates: a second call doubles every gradient.
  const std::vector<double> dq1 = dq, dk1 = dk, dg1 = dg;
  c.forward();
  backward();
  for (size_t e = 0; e < c.n(); e++) CHECK(dq[e] == Approx(2 * dq1[e]).epsilon(1e-14));
  for (size_t e = 0; e < c.n(); e++) CHECK(dk[e] == Approx(2 * dk1[e]).epsilon(1e-14));
  for (int h = 0; h < c.H; h++) CHECK(dg[h] == Approx(2 * dg1[h]).epsilon(1e-14));
}
