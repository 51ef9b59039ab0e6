// Where the K-interval softmax (docs/attention-maths.md §5) jumps, for the GPU tests that compare
// it with the fp64 CPU reference. Its weights are discontinuous in the scores:
// nearest rounding at every u = a + ½, lerp's derivative at every grid point,
// fwm's window edge at u = 0 (weights below it are 0), and the routing target
// where the max or min is nearly tied. A score within the GPU's fp32 rounding of
// one (scores are fp32 sums of d bf16 or int8 products, ~1e-6 nats off the fp64
// ones) may fall on the other side than in the reference and move a weight by
// e^Δ: a legitimate result that a tolerance cannot tell from a bug. So the tests
// draw again the query rows with a visible score within kDiscontinuityMargin
// nats of one (more at large scores), and keep the tolerances of rounding alone. Exact ties are
// kept: both sides break them alike, to the lowest index.
#pragma once
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "attention/attention.cuh"
#include "qattn/attention.hpp"

namespace qattn::test {

constexpr double kDiscontinuityMargin = 2e-5;  // nats
// At large scores the fp32 sums' rounding grows with c Σ_x |q_x k_x|: the margin
// is at least that times kRelativeMargin (2^-22, ~4 of the sums' typical
// rounding), which passes 2e-5 only once the row's scores pass ~100 nats.
constexpr double kRelativeMargin = 0x1p-22;

// Does query row t of head (b, h) of qkv (B, T, 3, H, d) have a visible score
// c q_t·k_j (j <= t) within the margin of a discontinuity of o's softmax?
inline bool near_discontinuity(const KIntervalOptions& o, const cuda::AttentionShape& s,
                               const std::vector<__nv_bfloat16>& qkv, int b, int h, int t) {
  const size_t token = static_cast<size_t>(3) * s.H * s.d;  // one token's q, k, v
  const __nv_bfloat16* q =
      &qkv[(static_cast<size_t>(b) * s.T + t) * token + static_cast<size_t>(h) * s.d];
  const double c = 1.0 / std::sqrt(static_cast<double>(s.d));
  std::vector<double> score(t + 1);
  double magnitude = 0;  // the largest c Σ_x |q_x k_x| of the row
  for (int j = 0; j <= t; ++j) {
    const __nv_bfloat16* k =
        q + (static_cast<ptrdiff_t>(j) - t) * static_cast<ptrdiff_t>(token) + s.H * s.d;
    double dot = 0, abs_dot = 0;
    for (int x = 0; x < s.d; ++x) {
      const double product = static_cast<double>(__bfloat162float(q[x])) * __bfloat162float(k[x]);
      dot += product, abs_dot += std::fabs(product);
    }
    score[j] = c * dot;
    magnitude = std::max(magnitude, c * abs_dot);
  }
  const double m = *std::max_element(score.begin(), score.end());
  const double l = *std::min_element(score.begin(), score.end());
  const bool fwm = o.calibration == Calibration::fwm;
  if (!fwm && m - l < 1e-6) return false;  // flat: every weight 1
  const double delta = fwm ? o.window / o.K : (m - l) / o.K, g0 = fwm ? m - o.window : l;
  const double margin = std::max(kDiscontinuityMargin, kRelativeMargin * magnitude);
  for (const double v : score) {
    if (v != m && m - v < margin) return true;  // nearly tied max (routing)
    if (v != l && v - l < margin) return true;  // nearly tied min
    const double u = (v - g0) / delta;
    if (fwm && std::fabs(u) * delta < margin) return true;  // the window's edge
    if (u > 0 && u < o.K) {  // nearest: between grid points; lerp: at them (its derivative)
      const double boundary = o.rounding == Rounding::nearest ? std::floor(u) + 0.5 : std::round(u);
      if (std::fabs(u - boundary) * delta < margin) return true;
    }
  }
  return false;
}

}  // namespace qattn::test
