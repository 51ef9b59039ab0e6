// How far the exact (fp64) K-interval gradients move when the inputs move by
// about the GPU's own rounding: the reason the GPU tests allow lerp's dQ and dK
// more than the other outputs (kKIntervalLerp, tests/gpu/attention_harness.hpp).
//
// Per setting and draw: the GPU tests' inputs (T = 1000, q ~ N(0, 2²), k, v, dO
// ~ N(0, 1), all rounded to bf16), the CPU reference in fp64 on them, and again
// with every q multiplied by (1 + 1e-6 ξ), ξ ~ N(0, 1) (a relative change of
// the scores near fp32's rounding of a d-term sum). A smooth function moves by
// about 1e-6; a rule whose gradient jumps where a score crosses a grid point
// moves by far more. Prints the worst and mean relative L2 change of O, dQ, dK,
// dV over the draws; FPA is the smooth control.
//
//   cmake --build build --target kinterval_sensitivity && build/kinterval_sensitivity [draws]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cpu/attention/quant.hpp"  // round_to_bf16
#include "qattn/cpu/attention.hpp"

using namespace qattn;

namespace {

struct Setting {
  std::string name;
  AttentionConfig cfg;
};

Setting kinterval(int K, Calibration cal, Rounding rounding, Ste ste, bool detach) {
  AttentionConfig cfg;
  cfg.kind = AttentionKind::kinterval;
  KIntervalOptions& o = cfg.kinterval;
  o.K = K, o.calibration = cal, o.rounding = rounding, o.ste = ste, o.detach_extrema = detach;
  return {"kinterval K=" + std::to_string(K) + " " + to_string(cal) + " " + to_string(rounding) +
              " ste=" + to_string(ste) + (detach ? " detach" : ""),
          cfg};
}

double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return std::sqrt(num / den);
}

// O, dQ, dK, dV of one head in fp64.
std::vector<std::vector<double>> outputs(const AttentionConfig& cfg, int T, int d,
                                         const std::vector<double>& q, const std::vector<double>& k,
                                         const std::vector<double>& v,
                                         const std::vector<double>& dout) {
  std::vector<std::vector<double>> out(4, std::vector<double>(q.size()));
  cpu::attention_forward(cfg, T, d, q.data(), k.data(), v.data(), out[0].data());
  cpu::attention_backward(cfg, T, d, q.data(), k.data(), v.data(), out[0].data(), dout.data(),
                          out[1].data(), out[2].data(), out[3].data());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const int draws = argc > 1 ? std::atoi(argv[1]) : 8, T = 1000;
  if (draws < 1) {
    std::fprintf(stderr, "kinterval_sensitivity: draws must be a positive integer (got '%s')\n",
                 argv[1]);
    return 2;
  }
  AttentionConfig fpa;
  fpa.kind = AttentionKind::fpa;
  const std::vector<Setting> settings = {
      {"fpa (smooth control)", fpa},
      kinterval(4, Calibration::minmax, Rounding::lerp, Ste::prob, false),
      kinterval(7, Calibration::minmax, Rounding::lerp, Ste::prob, true),
      kinterval(16, Calibration::fwm, Rounding::lerp, Ste::prob, false),
      kinterval(4, Calibration::minmax, Rounding::nearest, Ste::weight, false),
      kinterval(4, Calibration::minmax, Rounding::nearest, Ste::prob, false),
  };
  std::printf(
      "fp64 reference, q x (1 + 1e-6 xi) against q; T = %d, %d draws; rel L2 change, worst "
      "(mean)\n",
      T, draws);
  for (const int d : {64, 128})
    for (const Setting& st : settings) {
      std::vector<double> worst(4, 0.0), mean(4, 0.0);
#pragma omp parallel for schedule(dynamic)
      for (int draw = 0; draw < draws; ++draw) {
        std::mt19937_64 gen(1000 + draw);
        std::normal_distribution<double> normal;
        const size_t n = static_cast<size_t>(T) * d;
        std::vector<double> q(n), k(n), v(n), dout(n);
        auto bf16 = [&](double sigma) {
          return double(cpu::round_to_bf16(float(sigma * normal(gen))));
        };
        for (size_t i = 0; i < n; ++i)
          q[i] = bf16(2.0), k[i] = bf16(1.0), v[i] = bf16(1.0), dout[i] = bf16(1.0);
        std::vector<double> q_moved(q);
        for (double& x : q_moved) x *= 1.0 + 1e-6 * normal(gen);
        const auto base = outputs(st.cfg, T, d, q, k, v, dout),
                   moved = outputs(st.cfg, T, d, q_moved, k, v, dout);
#pragma omp critical
        for (int i = 0; i < 4; ++i) {
          const double change = rel_l2(moved[i], base[i]);
          worst[i] = std::max(worst[i], change);
          mean[i] += change / draws;
        }
      }
      std::printf("d=%3d %-42s O %.1e (%.1e)  dQ %.1e (%.1e)  dK %.1e (%.1e)  dV %.1e (%.1e)\n", d,
                  st.name.c_str(), worst[0], mean[0], worst[1], mean[1], worst[2], mean[2],
                  worst[3], mean[3]);
    }
  return 0;
}
