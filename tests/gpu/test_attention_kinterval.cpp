// The special tests of K-interval attention (docs/attention-maths.md §5) on the GPU, which need
// code of their own; its comparisons with the CPU reference are cases of
// test_attention.cpp. dS rows sum to zero (through Σ_j dK_j = c Σ_i q_i Σ_j
// dS_ij), except with detach_extrema; detach changes nothing under the
// probability STE; the forward saves the argmax / argmin (lowest index)
// wherever the backward routes a calibration term to it; the probability STE's
// forward saves FPA's L and output. Each on the automatic family (wgmma on
// Hopper) and, on Hopper, the mma.sync kernels too. Inputs are fresh random
// each run (seed printed); outputs are poisoned with NaN.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "attention/attention.cuh"
#include "attention/fpa/fpa.cuh"
#include "attention/reference_check.hpp"
#include "attention_harness.hpp"
#include "qattn/cpu/attention.hpp"

namespace {

using qattn::AttentionConfig;
using qattn::Calibration;
using qattn::KIntervalOptions;
using qattn::Rounding;
using qattn::Ste;
using qattn::cuda::AttentionShape;
using qattn::cuda::FpaKernels;
using qattn::cuda::head_slice;
using qattn::test::bf16;
using qattn::test::DeviceBuffer;
using qattn::test::family_name;

// The forward's saved state starts with (B, H, T, 8) RowStats (kinterval_softmax.cuh).
constexpr int kRowStatFloats = 8;
// |Σ_j dK_j| / sqrt(Σ_j |dK_j|²): 0 in exact arithmetic when every dS row sums to 0.
// The direct parts of lerp and the probability STE take δ = dO·O of the bf16
// output in place of ḡ, so their rows sum to bf16's rounding of O (about 1e-3
// and 2e-3 here, by an fp64 model of those rows).
constexpr double kTolRowSum = 1e-2;

// Inputs (B, T, 3, H, d) with q of standard deviation 2 (scores of standard
// deviation 2, so fwm's 8-nat window cuts some keys off) and k, v, dout of 1.
qattn::test::AttentionInputs random_inputs(const AttentionShape& s) {
  return {qattn::test::normal_qkv(s, 2.0f, 1.0f, 0.0f, qattn::test::rng()),
          qattn::test::normal_heads(s, qattn::test::rng())};
}

// |Σ_j dK_j| / sqrt(Σ_j |dK_j|²) of one head's dK (T, d).
double dk_sum_ratio(const std::vector<double>& dk, int T, int d) {
  double num = 0, den = 0;
  for (int x = 0; x < d; ++x) {
    double col = 0;
    for (int t = 0; t < T; ++t) {
      const double v = dk[static_cast<size_t>(t) * d + x];
      col += v, den += v * v;
    }
    num += col * col;
  }
  return std::sqrt(num / den);
}

}  // namespace

TEST_CASE("K-interval attention: dS rows sum to zero on the GPU, except with detach_extrema",
          "[kinterval]") {
  const AttentionShape s{1, 2, 1000, 64};
  for (const FpaKernels family : qattn::test::every_family())
    for (const auto& opt : qattn::test::every_option_combination(4)) {
      const AttentionConfig cfg = qattn::test::kinterval_config(opt);
      const qattn::test::AttentionInputs in = random_inputs(s);
      const qattn::test::GpuRun run = qattn::test::run_gpu(cfg, s, in.qkv, in.dout, family);
      const double gpu = dk_sum_ratio(head_slice(run.dqkv, s, 3, 1, 0, 1), s.T, s.d);
      // The reference's ratio on the same head: 0 up to rounding, or the detached terms.
      const auto q = head_slice(in.qkv, s, 3, 0, 0, 1), k = head_slice(in.qkv, s, 3, 1, 0, 1),
                 v = head_slice(in.qkv, s, 3, 2, 0, 1), dy = head_slice(in.dout, s, 1, 0, 0, 1);
      std::vector<double> o(q.size()), dq(q.size()), dk(q.size()), dv(q.size());
      qattn::cpu::attention_forward(cfg, s.T, s.d, q.data(), k.data(), v.data(), o.data());
      qattn::cpu::attention_backward(cfg, s.T, s.d, q.data(), k.data(), v.data(), o.data(),
                                     dy.data(), dq.data(), dk.data(), dv.data());
      const double cpu = dk_sum_ratio(dk, s.T, s.d);
      const std::string what = qattn::test::describe(cfg, s);
      std::printf("kinterval row sums: %-14s %s  |sum dK| / |dK|: gpu %.2e cpu %.2e\n",
                  family_name(family), what.c_str(), gpu, cpu);
      INFO(family_name(family) << " " << what << ": gpu " << gpu << " cpu " << cpu);
      CHECK(std::abs(gpu - cpu) < kTolRowSum);
      if (!opt.detach_extrema) CHECK(gpu < kTolRowSum);
    }
}

TEST_CASE("K-interval attention: detach_extrema changes nothing under the probability STE",
          "[kinterval]") {
  const AttentionShape s{1, 2, 1000, 128};
  for (const FpaKernels family : qattn::test::every_family()) {
    KIntervalOptions opt;
    opt.rounding = Rounding::nearest, opt.ste = Ste::prob, opt.calibration = Calibration::fwm;
    const AttentionConfig attached = qattn::test::kinterval_config(opt);
    opt.detach_extrema = true;
    const AttentionConfig detached = qattn::test::kinterval_config(opt);
    const qattn::test::AttentionInputs in = random_inputs(s);
    const qattn::test::GpuRun a = qattn::test::run_gpu(attached, s, in.qkv, in.dout, family),
                              b = qattn::test::run_gpu(detached, s, in.qkv, in.dout, family);
    INFO(family_name(family));
    CHECK(std::memcmp(a.dqkv.data(), b.dqkv.data(), a.dqkv.size() * sizeof(bf16)) == 0);
  }
}

TEST_CASE("K-interval attention: the forward saves the lowest argmax / argmin it routes to",
          "[kinterval]") {
  // Row statistics (B, H, T, 8): argmax and argmin are the int bits of floats 6
  // and 7. Indices are tracked where the backward routes a calibration term:
  // argmax unless detached or under the probability STE, argmin for lerp minmax.
  for (const FpaKernels family : qattn::test::every_family())
    for (int d : {64, 128})
      for (const auto& opt : qattn::test::every_option_combination(4)) {
        if (opt.ste_window_mask) continue;  // no effect on the forward
        const AttentionShape sd{1, 2, 1000, d};
        const AttentionConfig cfg = qattn::test::kinterval_config(opt);
        qattn::test::AttentionInputs in = random_inputs(sd);
        qattn::test::repeat_first_four_keys(in.qkv, sd, qattn::test::rng());
        qattn::test::AttentionBuffers b(cfg, sd, in.qkv, in.dout);
        qattn::test::forward_gpu(cfg, sd, b, family);
        const std::vector<float> st = b.stats.download();
        const bool lerp = opt.rounding == Rounding::lerp;
        const bool routes_max = !opt.detach_extrema && (lerp || opt.ste == Ste::weight);
        const bool routes_min = routes_max && lerp && opt.calibration == Calibration::minmax;
        if (!routes_max) continue;
        int wrong_max = 0, wrong_min = 0;
        for (int h = 0; h < sd.H; ++h) {
          const auto q = head_slice(in.qkv, sd, 3, 0, 0, h), k = head_slice(in.qkv, sd, 3, 1, 0, h);
          for (int i = 0; i < sd.T; ++i) {
            int hi = 0, lo = 0;
            double s_hi = -INFINITY, s_lo = INFINITY;
            for (int j = 0; j <= i; ++j) {
              double dot = 0;
              for (int x = 0; x < sd.d; ++x)
                dot += q[static_cast<size_t>(i) * sd.d + x] * k[static_cast<size_t>(j) * sd.d + x];
              if (dot > s_hi) s_hi = dot, hi = j;
              if (dot < s_lo) s_lo = dot, lo = j;
            }
            const float* row = &st[(static_cast<size_t>(h) * sd.T + i) * kRowStatFloats];
            int gpu_hi, gpu_lo;
            std::memcpy(&gpu_hi, row + 6, sizeof(int));
            std::memcpy(&gpu_lo, row + 7, sizeof(int));
            wrong_max += gpu_hi != hi;
            if (routes_min) wrong_min += gpu_lo != lo;
          }
        }
        INFO(family_name(family) << " " << qattn::test::describe(cfg, sd)
                                 << ": rows with a wrong argmax " << wrong_max << ", argmin "
                                 << wrong_min);
        CHECK(wrong_max == 0);
        CHECK(wrong_min == 0);
      }
}

TEST_CASE("K-interval attention: the probability STE's forward saves the exact softmax",
          "[kinterval]") {
  // Its backward reads L and the output of softmax(S) from the saved state
  // (after the RowStats: the output (B, T, H, d) bf16, then L (B, H, T)), in
  // place of running FPA's forward: both must be FPA's, on the same device and
  // family, within the rounding of P to bf16 (output) and of fp32 sums (L).
  KIntervalOptions opt;
  opt.rounding = Rounding::nearest;
  opt.ste = Ste::prob;
  for (const FpaKernels family : qattn::test::every_family())
    for (const Calibration calibration : {Calibration::minmax, Calibration::fwm})
      for (const AttentionShape sd :
           {AttentionShape{2, 3, 1000, 64}, AttentionShape{1, 2, 1024, 128}}) {
        opt.calibration = calibration;
        const AttentionConfig cfg = qattn::test::kinterval_config(opt);
        const qattn::test::AttentionInputs in = random_inputs(sd);
        const size_t rows = static_cast<size_t>(sd.B) * sd.H * sd.T, n_o = rows * sd.d;
        REQUIRE(qattn::cuda::attention_row_stats(cfg, sd.d) == kRowStatFloats + sd.d / 2 + 1);
        qattn::test::AttentionBuffers b(cfg, sd, in.qkv, in.dout);
        DeviceBuffer<bf16> o_fpa(n_o);
        DeviceBuffer<float> lse(rows);
        o_fpa.poison(), lse.poison();
        qattn::test::forward_gpu(cfg, sd, b, family);
        qattn::cuda::fpa_forward(sd, b.qkv.get(), o_fpa.get(), lse.get(), nullptr, family);
        const std::vector<float> st = b.stats.download(), lse_fpa = lse.download();
        std::vector<bf16> o_exact(n_o);
        std::memcpy(o_exact.data(), st.data() + rows * kRowStatFloats, n_o * sizeof(bf16));
        const float* lse_saved = st.data() + rows * kRowStatFloats + n_o / 2;
        double lse_err = 0;
        for (size_t r = 0; r < rows; ++r)
          lse_err = std::max(lse_err, std::abs(static_cast<double>(lse_saved[r]) - lse_fpa[r]) /
                                          std::max(1.0, std::abs(static_cast<double>(lse_fpa[r]))));
        const double o_err = qattn::test::rel_l2(qattn::test::to_float(o_exact),
                                                 qattn::test::to_float(o_fpa.download()));
        INFO(family_name(family) << " " << qattn::test::describe(cfg, sd) << ": L max rel err "
                                 << lse_err << ", output rel L2 " << o_err);
        CHECK(lse_err < 1e-5);
        CHECK(o_err < 5e-3);
      }
}
