// K-interval attention (SPEC §4) on the GPU against the fp64 CPU reference on
// the same bf16 inputs: every combination of calibration x rounding x ste x
// detach_extrema x ste_window_mask, at K in {2, 4, 16, 32}, T in {64, 1000,
// 1024} (1000: a tail tile), d in {64, 128}; long sequences compare a subsample
// of (b, h) heads; K in {1, 3, 7} (1/K inexact; lerp at T = 1000 too). Also: the
// forward saves the argmax / argmin (lowest index) wherever the backward routes
// a calibration term to it; dS rows sum to zero (through Σ_j dK_j = c Σ_i q_i Σ_j dS_ij),
// except with detach_extrema; the calibration terms reach the argmax / argmin
// key with the lowest index when scores tie; the backward is deterministic;
// detach changes nothing under the probability STE.
// Kernel families: every case runs on the automatic one (wgmma on Hopper); on
// Hopper the mma.sync kernels also run every option combination at K = 4,
// T = 1000 and the tie, argmax, row-sum and detach checks.
// Inputs are fresh random each run (seed printed), the compared query rows kept
// off the softmax's discontinuities (softmax_discontinuities.hpp); outputs are
// poisoned with NaN.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "attention/attention.cuh"
#include "attention/fpa/fpa.cuh"
#include "attention/kinterval/kinterval.cuh"
#include "attention/reference_check.hpp"
#include "gpu_test_util.hpp"
#include "qattn/cpu/attention.hpp"
#include "softmax_discontinuities.hpp"

namespace {

using qattn::AttentionConfig;
using qattn::AttentionKind;
using qattn::Calibration;
using qattn::KIntervalOptions;
using qattn::Rounding;
using qattn::Ste;
using qattn::cuda::AttentionShape;
using qattn::cuda::FpaKernels;
using qattn::cuda::head_slice;
using qattn::test::bf16;
using qattn::test::DeviceBuffer;

// Rel. L2 of O, dQ, dK, dV against the fp64 reference. bf16 operands with
// fp32 accumulation (FPA lands near 3e-3); the inputs keep every score off the
// quantised softmax's discontinuities (keep_scores_off_discontinuities, below;
// softmax_discontinuities.hpp), where fp32 and fp64 scores could fall on two sides.
constexpr double kTol = 1e-2;
// The forward's saved state starts with (B, H, T, 8) RowStats (kinterval_softmax.cuh).
constexpr int kRowStatFloats = 8;
// dQ and dK of lerp: 2.5e-2. Lerp's ŵ is continuous in the score but its
// derivative jumps by e^Δ at every grid point; the inputs keep scores off those
// too, but the rule still amplifies the bf16 rounding of its inputs: at K = 1
// minmax the calibration terms carry the bf16 O's rounding through ḡ = dO·O,
// summed over the row onto the argmax and argmin keys (1.0–1.6e-2 measured on an
// H200 before the inputs kept off the grid points; tools/kinterval_sensitivity.cpp
// measures the rule's amplification on the CPU in fp64). O and dV keep kTol.
// Before 2026-12-01's fourth session nearest rounding's weight-STE dQ and dK had
// 2.5e-2 too, and three GPU runs had missed 1e-2 (seeds 2527159404, 2609948017,
// 4059917141 in docs/kinterval.md), most likely by flips at rounding boundaries
// (none of the three was replayed to show it).
constexpr double kTolLerpGrad = 2.5e-2;
// |Σ_j dK_j| / sqrt(Σ_j |dK_j|²): 0 in exact arithmetic when every dS row sums to 0.
constexpr double kTolRowSum = 1e-2;

// The 32 combinations of the options that change the maths.
std::vector<KIntervalOptions> every_option_combination(int K) {
  std::vector<KIntervalOptions> all;
  for (Calibration cal : {Calibration::minmax, Calibration::fwm})
    for (Rounding rounding : {Rounding::nearest, Rounding::lerp})
      for (Ste ste : {Ste::weight, Ste::prob})
        for (bool detach : {false, true})
          for (bool mask : {false, true}) {
            KIntervalOptions o;
            o.K = K, o.calibration = cal, o.rounding = rounding, o.ste = ste;
            o.detach_extrema = detach, o.ste_window_mask = mask;
            all.push_back(o);
          }
  return all;
}

// A kernel family and its name in messages.
struct Family {
  FpaKernels kernels;
  const char* name;
};
// What automatic runs on this device.
Family automatic_family() {
  return {FpaKernels::automatic, qattn::cuda::fpa_wgmma_available() ? "wgmma" : "mma.sync"};
}
// The automatic family, and mma.sync where automatic is wgmma (Hopper).
std::vector<Family> every_family() {
  if (qattn::cuda::fpa_wgmma_available())
    return {automatic_family(), {FpaKernels::mma_sync, "mma.sync"}};
  static bool said = false;
  if (!said)
    std::printf("kinterval: no sm_90a device or build, the wgmma kernels are not checked\n");
  said = true;
  return {automatic_family()};
}

std::string describe(const KIntervalOptions& o, const AttentionShape& s) {
  return "K=" + std::to_string(o.K) + " " + qattn::to_string(o.calibration) + " " +
         qattn::to_string(o.rounding) + " ste=" + qattn::to_string(o.ste) +
         (o.detach_extrema ? " detach" : "") + (o.ste_window_mask ? " mask" : "") + " (B,H,T,d)=(" +
         std::to_string(s.B) + "," + std::to_string(s.H) + "," + std::to_string(s.T) + "," +
         std::to_string(s.d) + ")";
}

// Inputs (B, T, 3, H, d) with q of standard deviation 2 (scores of standard
// deviation 2, so fwm's 8-nat window cuts some keys off) and k, v, dout of 1.
struct Inputs {
  std::vector<bf16> qkv, dout;
};
Inputs random_inputs(const AttentionShape& s) {
  const size_t n_o = static_cast<size_t>(s.B) * s.T * s.H * s.d;
  std::vector<float> qkv = qattn::test::randn(3 * n_o);
  for (size_t i = 0; i < qkv.size(); ++i)
    if ((i / (static_cast<size_t>(s.H) * s.d)) % 3 == 0) qkv[i] *= 2.0f;
  return {qattn::test::to_bf16(qkv), qattn::test::to_bf16(qattn::test::randn(n_o))};
}

// Every later token's key repeats one of tokens 0-3 (which keep their own), so
// every row's max and min are shared by many keys.
void repeat_first_four_keys(Inputs& in, const AttentionShape& s) {
  const size_t row = static_cast<size_t>(s.H) * s.d;  // one token's q, k or v
  std::uniform_int_distribution<int> pick(0, 3);
  for (size_t b = 0; b < static_cast<size_t>(s.B); ++b)
    for (int t = 4; t < s.T; ++t) {
      const size_t src = b * s.T + pick(qattn::test::rng()), dst = b * s.T + t;
      std::memcpy(&in.qkv[(dst * 3 + 1) * row], &in.qkv[(src * 3 + 1) * row], row * sizeof(bf16));
    }
}

// The forward and backward of one family: automatic through the attention API
// (as training and the benchmark call it), a named family through kinterval.cuh.
void forward_gpu(const Family& f, const AttentionConfig& cfg, const AttentionShape& s,
                 const bf16* qkv, bf16* o, float* stats) {
  if (f.kernels == FpaKernels::automatic)  // K-interval saves nothing beyond the statistics
    return qattn::cuda::attention_forward(cfg, s, qkv, o, stats, nullptr, nullptr);
  qattn::cuda::kinterval_forward(cfg.kinterval, s, qkv, o, stats, nullptr, f.kernels);
}
void backward_gpu(const Family& f, const AttentionConfig& cfg, const AttentionShape& s,
                  const bf16* qkv, const bf16* o, const bf16* dout, const float* stats,
                  bf16* dqkv, void* work) {
  if (f.kernels == FpaKernels::automatic)
    return qattn::cuda::attention_backward(cfg, s, qkv, o, dout, stats, nullptr, dqkv, work, nullptr);
  qattn::cuda::kinterval_backward(cfg.kinterval, s, qkv, o, dout, stats, dqkv, work, nullptr,
                                  f.kernels);
}

struct Outputs {
  std::vector<bf16> o, dqkv;
};
// Forward, then backward twice: the two gradients must agree bit for bit.
Outputs run_gpu(const Family& f, const AttentionConfig& cfg, const AttentionShape& s,
                const Inputs& in) {
  const size_t n_o = static_cast<size_t>(s.B) * s.T * s.H * s.d;
  DeviceBuffer<bf16> qkv(3 * n_o), o(n_o), dout(n_o), dqkv(3 * n_o), dqkv2(3 * n_o);
  DeviceBuffer<float> stats(static_cast<size_t>(s.B) * s.H * s.T *
                            qattn::cuda::attention_row_stats(cfg, s.d));
  DeviceBuffer<unsigned char> work(qattn::cuda::attention_workspace_bytes(cfg, s));
  qkv.upload(in.qkv);
  dout.upload(in.dout);
  o.poison(), stats.poison(), dqkv.poison(), dqkv2.poison(), work.poison();
  forward_gpu(f, cfg, s, qkv.get(), o.get(), stats.get());
  backward_gpu(f, cfg, s, qkv.get(), o.get(), dout.get(), stats.get(), dqkv.get(), work.get());
  work.poison();
  backward_gpu(f, cfg, s, qkv.get(), o.get(), dout.get(), stats.get(), dqkv2.get(), work.get());
  Outputs out{o.download(), dqkv.download()};
  const auto again = dqkv2.download();
  CHECK(std::memcmp(out.dqkv.data(), again.data(), again.size() * sizeof(bf16)) == 0);
  return out;
}

struct Case {
  Family family;
  AttentionConfig cfg;
  AttentionShape s;
  Inputs in;
  Outputs out;
  std::vector<int> heads;  // b * H + h of the heads compared with the CPU
};

Case make_case(const KIntervalOptions& opt, const AttentionShape& s, std::vector<int> heads,
               Family family = automatic_family()) {
  Case c;
  c.family = family;
  c.cfg.kind = AttentionKind::kinterval;
  c.cfg.kinterval = opt;
  c.s = s;
  c.in = random_inputs(s);
  c.heads = std::move(heads);
  return c;
}

// Draws again (as random_inputs does) each compared query row near a discontinuity
// of its softmax (softmax_discontinuities.hpp).
void keep_scores_off_discontinuities(std::vector<Case>& cases) {
  struct Row {
    size_t c;
    int b, h, t;
  };
  std::vector<std::vector<Row>> near(cases.size());
#pragma omp parallel for schedule(dynamic)
  for (size_t i = 0; i < cases.size(); ++i)
    for (int bh : cases[i].heads)
      for (int t = 0; t < cases[i].s.T; ++t)
        if (qattn::test::near_discontinuity(cases[i].cfg.kinterval, cases[i].s, cases[i].in.qkv,
                                            bh / cases[i].s.H, bh % cases[i].s.H, t))
          near[i].push_back({i, bh / cases[i].s.H, bh % cases[i].s.H, t});
  for (const auto& rows : near)
    for (const Row& r : rows) {
      Case& c = cases[r.c];
      const size_t token = static_cast<size_t>(3) * c.s.H * c.s.d;
      bf16* q = &c.in.qkv[(static_cast<size_t>(r.b) * c.s.T + r.t) * token + static_cast<size_t>(r.h) * c.s.d];
      int draws = 0;
      do {
        REQUIRE(++draws <= 1000);  // a row that never clears its margin: the inputs are degenerate
        const std::vector<bf16> fresh = qattn::test::to_bf16(qattn::test::randn(c.s.d, 2.0f));
        std::copy(fresh.begin(), fresh.end(), q);
      } while (qattn::test::near_discontinuity(c.cfg.kinterval, c.s, c.in.qkv, r.b, r.h, r.t));
    }
}

// Runs the cases on the GPU one after another, then checks them against the
// CPU reference in parallel.
void check_cases(std::vector<Case>& cases) {
  keep_scores_off_discontinuities(cases);
  for (auto& c : cases) c.out = run_gpu(c.family, c.cfg, c.s, c.in);
  std::vector<qattn::cuda::AttentionErrors> errors(cases.size());
#pragma omp parallel for schedule(dynamic)
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    qattn::cuda::AttentionErrorSums sums;
    for (int bh : c.heads)
      sums.add(qattn::cuda::compare_head_with_cpu(c.cfg, c.s, bh / c.s.H, bh % c.s.H, c.in.qkv,
                                                  c.in.dout, c.out.o, c.out.dqkv, nullptr));
    errors[i] = qattn::cuda::relative_errors(sums);
  }
  double worst = 0, worst_nearest_grad = 0, worst_lerp_grad = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& e = errors[i];
    worst = std::max({worst, e.o, e.dv});
    const bool lerp = cases[i].cfg.kinterval.rounding == Rounding::lerp;
    double& worst_grad = lerp ? worst_lerp_grad : worst_nearest_grad;
    worst_grad = std::max({worst_grad, e.dq, e.dk});
    INFO(cases[i].family.name << " " << describe(cases[i].cfg.kinterval, cases[i].s)
         << ": rel L2 o " << e.o << " dq " << e.dq << " dk " << e.dk << " dv " << e.dv);
    const double grad_tol = lerp ? kTolLerpGrad : kTol;
    CHECK(e.o < kTol);
    CHECK(e.dq < grad_tol);
    CHECK(e.dk < grad_tol);
    CHECK(e.dv < kTol);
  }
  std::printf("kinterval: %zu cases (%s), worst rel L2 of o/dv %.2e, of dq/dk %.2e (nearest) %.2e (lerp)\n",
              cases.size(), cases.empty() ? "-" : cases.front().family.name, worst, worst_nearest_grad,
              worst_lerp_grad);
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

TEST_CASE("K-interval attention: every option combination and K at T = 64", "[kinterval]") {
  std::vector<Case> cases;
  for (int d : {64, 128})
    for (int K : {2, 4, 16, 32})
      for (const auto& opt : every_option_combination(K))
        cases.push_back(make_case(opt, {2, 2, 64, d}, {0, 1, 2, 3}));
  check_cases(cases);
}

TEST_CASE("K-interval attention: K = 1, 3, 7 (1/K inexact), every option combination",
          "[kinterval]") {
  // Nearest rounding at K = 1 is left out: one grid boundary whose fp32 / fp64
  // flip moves a weight by e^Δ (Δ = the whole window) would fail on rounding alone.
  std::vector<Case> cases;
  for (int d : {64, 128})
    for (int K : {1, 3, 7})
      for (const auto& opt : every_option_combination(K)) {
        const bool lerp = opt.rounding == Rounding::lerp;
        if (!lerp && K == 1) continue;
        cases.push_back(make_case(opt, {2, 2, 64, d}, {0, 1, 2, 3}));
        if (lerp && !opt.ste_window_mask) cases.push_back(make_case(opt, {1, 2, 1000, d}, {1}));
      }
  check_cases(cases);
}

TEST_CASE("K-interval attention: long sequences, every option combination", "[kinterval]") {
  // Each (T, d, K) takes two of the 32 combinations in turn: all 32 appear at T >= 1000.
  // Heads 1 (batch 0) and 4 (batch 1): at T = 1000 batch 0's last tile reaches
  // into batch 1's rows, which the TMA feed reads (the cp.async feed zero-fills).
  std::vector<Case> cases;
  int next = 0;
  for (int T : {1000, 1024})
    for (int d : {64, 128})
      for (int K : {2, 4, 16, 32}) {
        const auto all = every_option_combination(K);
        for (int r = 0; r < 2; ++r)
          cases.push_back(make_case(all[next++ % all.size()], {2, 3, T, d}, {1, 4}));
      }
  check_cases(cases);
}

TEST_CASE("K-interval attention: many heads, blocks ranked over all heads", "[kinterval]") {
  // The kernels launch every head's longest block first (block_by_rank, pipeline.cuh):
  // a block's head and place come from its rank. Several waves of blocks; the first
  // and the last head are compared, for each rule (the probability STE and
  // detached lerp run the one-launch backward on Hopper).
  std::vector<Case> cases;
  for (const AttentionShape& s : {AttentionShape{8, 12, 512, 64}, AttentionShape{4, 16, 512, 128}})
    for (const auto& opt : every_option_combination(4)) {
      const bool lerp = opt.rounding == Rounding::lerp;
      const bool wanted = (lerp && opt.calibration == Calibration::minmax && opt.ste == Ste::weight) ||
                          (!lerp && !opt.detach_extrema && opt.calibration == Calibration::fwm);
      if (!wanted || opt.ste_window_mask) continue;
      cases.push_back(make_case(opt, s, {0, s.B * s.H - 1}));
    }
  // Per shape: lerp minmax attached and detached, the weight and the probability STE (fwm).
  REQUIRE(cases.size() == 8);
  check_cases(cases);
}

TEST_CASE("K-interval attention: the mma.sync kernels on Hopper, every option combination",
          "[kinterval]") {
  // Where automatic is mma.sync, the cases above have checked it.
  if (!qattn::cuda::fpa_wgmma_available()) return;
  std::vector<Case> cases;
  for (int d : {64, 128})
    for (const auto& opt : every_option_combination(4))
      cases.push_back(make_case(opt, {1, 2, 1000, d}, {1}, {FpaKernels::mma_sync, "mma.sync"}));
  check_cases(cases);
}

TEST_CASE("K-interval attention: dS rows sum to zero on the GPU, except with detach_extrema",
          "[kinterval]") {
  const AttentionShape s{1, 2, 1000, 64};
  for (const Family& family : every_family())
    for (const auto& opt : every_option_combination(4)) {
      Case c = make_case(opt, s, {}, family);
      c.out = run_gpu(family, c.cfg, s, c.in);
      const double gpu = dk_sum_ratio(head_slice(c.out.dqkv, s, 3, 1, 0, 1), s.T, s.d);
      // The reference's ratio on the same head: 0 up to rounding, or the detached terms.
      const auto q = head_slice(c.in.qkv, s, 3, 0, 0, 1), k = head_slice(c.in.qkv, s, 3, 1, 0, 1),
                 v = head_slice(c.in.qkv, s, 3, 2, 0, 1), dy = head_slice(c.in.dout, s, 1, 0, 0, 1);
      std::vector<double> o(q.size()), dq(q.size()), dk(q.size()), dv(q.size());
      qattn::cpu::attention_forward(c.cfg, s.T, s.d, q.data(), k.data(), v.data(), o.data());
      qattn::cpu::attention_backward(c.cfg, s.T, s.d, q.data(), k.data(), v.data(), o.data(),
                                     dy.data(), dq.data(), dk.data(), dv.data());
      const double cpu = dk_sum_ratio(dk, s.T, s.d);
      std::printf("kinterval row sums: %-8s %-40s |sum dK| / |dK|: gpu %.2e cpu %.2e\n",
                  family.name, describe(opt, s).c_str(), gpu, cpu);
      INFO(family.name << " " << describe(opt, s) << ": gpu " << gpu << " cpu " << cpu);
      CHECK(std::abs(gpu - cpu) < kTolRowSum);
      if (!opt.detach_extrema) CHECK(gpu < kTolRowSum);
    }
}

TEST_CASE("K-interval attention: ties route the calibration terms to the lowest index",
          "[kinterval]") {
  // Tokens 0-3 keep their keys and every later key repeats one of them, so every
  // row's max and min are shared by many keys; the reference takes the lowest
  // index, and dK shows where the terms went (a wrong key gets them in full).
  // (Keys all equal would make every dQ zero: tokens 0-3 keep four distinct keys.)
  const AttentionShape s{1, 2, 256, 64};
  for (const Family& family : every_family()) {
    std::vector<Case> cases;
    for (int K : {2, 4})
      for (const auto& opt : every_option_combination(K)) {
        Case c = make_case(opt, s, {0, 1}, family);
        repeat_first_four_keys(c.in, s);
        cases.push_back(std::move(c));
      }
    check_cases(cases);
  }
}

TEST_CASE("K-interval attention: detach_extrema changes nothing under the probability STE",
          "[kinterval]") {
  const AttentionShape s{1, 2, 1000, 128};
  for (const Family& family : every_family()) {
    KIntervalOptions opt;
    opt.rounding = Rounding::nearest, opt.ste = Ste::prob, opt.calibration = Calibration::fwm;
    Case attached = make_case(opt, s, {}, family);
    opt.detach_extrema = true;
    Case detached = make_case(opt, s, {}, family);
    detached.in = attached.in;
    const Outputs a = run_gpu(family, attached.cfg, s, attached.in),
                  b = run_gpu(family, detached.cfg, s, detached.in);
    INFO(family.name);
    CHECK(std::memcmp(a.dqkv.data(), b.dqkv.data(), a.dqkv.size() * sizeof(bf16)) == 0);
  }
}

TEST_CASE("K-interval attention: the forward saves the lowest argmax / argmin it routes to",
          "[kinterval]") {
  // Row statistics (B, H, T, 8): argmax and argmin are the int bits of floats 6
  // and 7. Indices are tracked where the backward routes a calibration term:
  // argmax unless detached or under the probability STE, argmin for lerp minmax.
  for (const Family& family : every_family())
    for (int d : {64, 128})
      for (const auto& opt : every_option_combination(4)) {
        if (opt.ste_window_mask) continue;  // no effect on the forward
        const AttentionShape sd{1, 2, 1000, d};
        Case c = make_case(opt, sd, {}, family);
        repeat_first_four_keys(c.in, sd);
        const size_t n_o = static_cast<size_t>(sd.B) * sd.T * sd.H * sd.d;
        const int n_stats = qattn::cuda::attention_row_stats(c.cfg, sd.d);
        DeviceBuffer<bf16> qkv(3 * n_o), o(n_o);
        DeviceBuffer<float> stats(static_cast<size_t>(sd.B) * sd.H * sd.T * n_stats);
        qkv.upload(c.in.qkv);
        o.poison(), stats.poison();
        forward_gpu(family, c.cfg, sd, qkv.get(), o.get(), stats.get());
        const std::vector<float> st = stats.download();
        const bool lerp = opt.rounding == Rounding::lerp;
        const bool routes_max = !opt.detach_extrema && (lerp || opt.ste == Ste::weight);
        const bool routes_min = routes_max && lerp && opt.calibration == Calibration::minmax;
        if (!routes_max) continue;
        int wrong_max = 0, wrong_min = 0;
        for (int h = 0; h < sd.H; ++h) {
          const auto q = head_slice(c.in.qkv, sd, 3, 0, 0, h),
                     k = head_slice(c.in.qkv, sd, 3, 1, 0, h);
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
        INFO(family.name << " " << describe(opt, sd) << ": rows with a wrong argmax " << wrong_max
                         << ", argmin " << wrong_min);
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
  for (const Family& family : every_family())
    for (const Calibration calibration : {Calibration::minmax, Calibration::fwm})
      for (const AttentionShape sd :
           {AttentionShape{2, 3, 1000, 64}, AttentionShape{1, 2, 1024, 128}}) {
        opt.calibration = calibration;
        Case c = make_case(opt, sd, {}, family);
        const size_t rows = static_cast<size_t>(sd.B) * sd.H * sd.T, n_o = rows * sd.d;
        REQUIRE(qattn::cuda::attention_row_stats(c.cfg, sd.d) == kRowStatFloats + sd.d / 2 + 1);
        DeviceBuffer<bf16> qkv(3 * n_o), o(n_o), o_fpa(n_o);
        DeviceBuffer<float> stats(rows * qattn::cuda::attention_row_stats(c.cfg, sd.d)), lse(rows);
        qkv.upload(c.in.qkv);
        o.poison(), o_fpa.poison(), stats.poison(), lse.poison();
        forward_gpu(family, c.cfg, sd, qkv.get(), o.get(), stats.get());
        qattn::cuda::fpa_forward(sd, qkv.get(), o_fpa.get(), lse.get(), nullptr, family.kernels);
        const std::vector<float> st = stats.download(), lse_fpa = lse.download();
        std::vector<bf16> o_exact(n_o);
        std::memcpy(o_exact.data(), st.data() + rows * kRowStatFloats, n_o * sizeof(bf16));
        const float* lse_saved = st.data() + rows * kRowStatFloats + n_o / 2;
        double lse_err = 0;
        for (size_t r = 0; r < rows; ++r)
          lse_err = std::max(lse_err, std::abs(static_cast<double>(lse_saved[r]) - lse_fpa[r]) /
                                          std::max(1.0, std::abs(static_cast<double>(lse_fpa[r]))));
        const double o_err = qattn::test::rel_l2(qattn::test::to_float(o_exact),
                                                 qattn::test::to_float(o_fpa.download()));
        INFO(family.name << " " << describe(opt, sd) << ": L max rel err " << lse_err
                         << ", output rel L2 " << o_err);
        CHECK(lse_err < 1e-5);
        CHECK(o_err < 5e-3);
      }
}
