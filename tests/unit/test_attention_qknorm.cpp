// QK-norm (docs/attention-maths.md §3): y = gamma * x / sqrt(mean(x^2) + 1e-6)
// per row of head_dim;
// the gradients of L = <dout, y> for x and gamma by finite differences (double).
#include <catch2/catch.hpp>

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
  const auto fd = [&](std::vector<double>& t) {
    std::vector<double> g;
    for (double& e : t) {
      const double keep = e;
      e = keep + 1e-6;
      const double up = loss();
      e = keep - 1e-6;
      const double down = loss();
      e = keep;
      g.push_back((up - down) / 2e-6);
    }
    return g;
  };
  CHECK(max_rel(dx, fd(x)) < 1e-8);
  CHECK(max_rel(dgamma, fd(gamma)) < 1e-8);
  // The backward accumulates: a second call doubles the gradients.
  std::vector<double> dx2 = dx, dgamma2 = dgamma;
  cpu::qk_norm_backward(dx2.data(), dgamma2.data(), dout.data(), x.data(), gamma.data(),
                        rrms.data(), rows, d);
  for (size_t e = 0; e < n; e++) CHECK(dx2[e] == Approx(2 * dx[e]).epsilon(1e-14));
}
