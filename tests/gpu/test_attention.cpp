// The GPU attention kernels of every kind against the fp64 CPU reference on
// the same bf16 inputs: the list of cases (attention_cases below) and the tests
// that run its groups through the harness (attention_harness.hpp). Each case
// names the kind and its options, the kernel families that run it, the shape,
// how its inputs are drawn, the heads compared and the tolerance of each output;
// its inputs come from the run's seed (printed; QATTN_TEST_SEED=<seed> replays
// them) and its place in the list.
//
// Then the special tests of the API that need code of their own; those of
// K-interval and sage are in test_attention_kinterval.cpp and
// test_attention_sage.cpp.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "attention/attention.cuh"
#include "attention_harness.hpp"

namespace {

using qattn::AttentionConfig;
using qattn::BwdGranularity;
using qattn::Calibration;
using qattn::KIntervalOptions;
using qattn::Precision;
using qattn::Rounding;
using qattn::SageOptions;
using qattn::Ste;
using qattn::cuda::AttentionShape;
using qattn::cuda::FpaKernels;
using qattn::test::AttentionCase;
using qattn::test::InputRecipe;
using qattn::test::kFpa;
using qattn::test::kKInterval;
using qattn::test::kKIntervalLerp;
using qattn::test::kSage;
using qattn::test::kSageKInterval;
using qattn::test::kSageSigma5;
using qattn::test::Tolerance;

// ---------------------------------------------------------------------------
// The cases, by the test that runs them.

enum class Group {
  fpa,
  kinterval_t64,
  kinterval_inexact_k,
  kinterval_long,
  kinterval_many_heads,
  kinterval_mma_sync,
  kinterval_ties,
  kinterval_large,
  sage,
  sage_subnormal,
  sage_kinterval,
  sage_fp8,
  sage_fp8_zero_head,
};

const std::vector<FpaKernels> kAutomatic{FpaKernels::automatic};
const std::vector<FpaKernels> kBothFamilies{FpaKernels::mma_sync, FpaKernels::wgmma};
// mma.sync runs beside automatic only where automatic is wgmma (check_cases).
const std::vector<FpaKernels> kAutomaticAndMmaSync{FpaKernels::automatic, FpaKernels::mma_sync};

Tolerance kinterval_tolerance(const KIntervalOptions& o) {
  return o.rounding == Rounding::lerp ? kKIntervalLerp : kKInterval;
}

// Inputs of K-interval: scores of standard deviation 2 (q ~ N(0, 2²)), so that
// fwm's 8-nat window cuts some keys off.
constexpr InputRecipe kKIntervalInputs{InputRecipe::normal, 2.0f, 1.0f, 0.0f};

std::vector<std::pair<Group, AttentionCase>> attention_cases() {
  std::vector<std::pair<Group, AttentionCase>> all;
  auto add = [&](Group g, const AttentionConfig& cfg, std::vector<FpaKernels> families,
                 AttentionShape s, InputRecipe inputs, std::vector<int> heads, Tolerance tol) {
    all.push_back({g, {cfg, std::move(families), s, inputs, std::move(heads), tol, all.size()}});
  };
  auto kinterval = [&](Group g, const KIntervalOptions& opt, AttentionShape s,
                       std::vector<int> heads, std::vector<FpaKernels> families = kAutomatic,
                       InputRecipe inputs = kKIntervalInputs) {
    add(g, qattn::test::kinterval_config(opt), std::move(families), s, inputs, std::move(heads),
        kinterval_tolerance(opt));
  };

  // FPA at T in {64, 1000, 1024, 4096} (1000: a tail tile) and d in {64, 128}
  // on both families; few heads at long T keep the O(T² d) fp64 reference fast.
  for (const AttentionShape& s : {AttentionShape{2, 3, 64, 64}, AttentionShape{2, 3, 64, 128},
                                  AttentionShape{2, 2, 1000, 64}, AttentionShape{2, 2, 1000, 128},
                                  AttentionShape{1, 3, 1024, 64}, AttentionShape{1, 3, 1024, 128},
                                  AttentionShape{1, 2, 4096, 64}, AttentionShape{1, 2, 4096, 128}})
    add(Group::fpa, AttentionConfig{}, kBothFamilies, s, {}, {}, kFpa);

  // K-interval: every combination of calibration x rounding x ste x
  // detach_extrema x ste_window_mask (every_option_combination) at each K, one
  // tile, on the family the API picks.
  for (int d : {64, 128})
    for (int K : {2, 4, 16, 32})
      for (const auto& opt : qattn::test::every_option_combination(K))
        kinterval(Group::kinterval_t64, opt, {2, 2, 64, d}, {});

  // K = 1, 3, 7: 1/K inexact; lerp on a tail tile too. Nearest rounding at K = 1
  // is left out: one grid boundary whose fp32 / fp64 flip moves a weight by e^Δ
  // (Δ = the whole window) would fail on rounding alone.
  for (int d : {64, 128})
    for (int K : {1, 3, 7})
      for (const auto& opt : qattn::test::every_option_combination(K)) {
        const bool lerp = opt.rounding == Rounding::lerp;
        if (!lerp && K == 1) continue;
        kinterval(Group::kinterval_inexact_k, opt, {2, 2, 64, d}, {});
        if (lerp && !opt.ste_window_mask)
          kinterval(Group::kinterval_inexact_k, opt, {1, 2, 1000, d}, {1});
      }

  // Long sequences: each (T, d, K) takes two of the 32 combinations in turn, so
  // all 32 appear at T >= 1000. Heads 1 (batch 0) and 4 (batch 1): at T = 1000
  // batch 0's last tile reaches into batch 1's rows, which the TMA feed reads
  // (the cp.async feed zero-fills).
  int next = 0;
  for (int T : {1000, 1024})
    for (int d : {64, 128})
      for (int K : {2, 4, 16, 32}) {
        const auto every = qattn::test::every_option_combination(K);
        for (int r = 0; r < 2; ++r)
          kinterval(Group::kinterval_long, every[next++ % every.size()], {2, 3, T, d}, {1, 4});
      }

  // Many heads: the kernels launch every head's longest block first
  // (block_by_rank, pipeline.cuh), so a block's head and place come from its
  // rank. Several waves of blocks; the first and the last head are compared.
  // Per shape: lerp minmax attached and detached, the weight and the
  // probability STE (fwm nearest): the probability STE and detached lerp run
  // the one-launch backward on Hopper.
  for (const AttentionShape& s : {AttentionShape{8, 12, 512, 64}, AttentionShape{4, 16, 512, 128}})
    for (const auto& opt : qattn::test::every_option_combination(4)) {
      const bool lerp = opt.rounding == Rounding::lerp;
      const bool wanted =
          (lerp && opt.calibration == Calibration::minmax && opt.ste == Ste::weight) ||
          (!lerp && !opt.detach_extrema && opt.calibration == Calibration::fwm);
      if (wanted && !opt.ste_window_mask)
        kinterval(Group::kinterval_many_heads, opt, s, {0, s.B * s.H - 1});
    }

  // The mma.sync kernels where automatic runs wgmma: every combination at K = 4
  // on a tail tile.
  for (int d : {64, 128})
    for (const auto& opt : qattn::test::every_option_combination(4))
      kinterval(Group::kinterval_mma_sync, opt, {1, 2, 1000, d}, {1}, {FpaKernels::mma_sync});

  // Ties: tokens 0-3 keep their keys and every later key repeats one of them,
  // so every row's max and min are shared by many keys; the reference takes the
  // lowest index, and dK shows where the calibration terms went (a wrong key
  // gets them in full). (Keys all equal would make every dQ zero.)
  const InputRecipe repeated{InputRecipe::repeated_keys, 2.0f, 1.0f, 0.0f};
  for (int K : {2, 4})
    for (const auto& opt : qattn::test::every_option_combination(K))
      kinterval(Group::kinterval_ties, opt, {1, 2, 256, 64}, {}, kAutomaticAndMmaSync, repeated);

  // Large scores (q, k of standard deviation σ give scores of standard deviation
  // σ², rows spanning up to ~6σ² nats at T = 1024): lerp minmax K = 32 attached and
  // detached (the detach_extrema sweep's cell) and nearest minmax with the
  // probability STE (up to σ = 100). σ = 10 keeps the grid spacing Δ = (m − ℓ)/K below the kernels'
  // cap of 32 nats on the grid values (docs/attention-maths.md §5.11); σ = 30 takes
  // it past 87, where ex2 flushes e^−Δ and expm1f overflows; σ = 300 and 3000 put the
  // scores past 2^16 and 2^23 nats. Every head and row is compared (the outputs
  // are poisoned, so a NaN fails). Attached lerp's dQ and dK meet lerp's usual
  // tolerance at every σ, as detached lerp's do: its terms through m and ℓ are
  // formed with ḡ, not with δ of the bf16 output, whose error they would carry
  // multiplied by Δ (docs/kinterval.md, "Backward: what is recomputed and why").
  for (const float sigma : {10.0f, 30.0f, 100.0f, 300.0f, 3000.0f})
    for (int d : {64, 128}) {
      KIntervalOptions lerp, detached, nearest;
      lerp.K = detached.K = nearest.K = 32;
      lerp.rounding = detached.rounding = Rounding::lerp;
      detached.detach_extrema = true;
      nearest.rounding = Rounding::nearest, nearest.ste = Ste::prob;
      const InputRecipe large{InputRecipe::normal, sigma, sigma, 0.0f};
      for (const KIntervalOptions& opt : {lerp, detached})
        kinterval(Group::kinterval_large, opt, {1, 2, 1024, d}, {}, kAutomaticAndMmaSync, large);
      // The probability STE's dS is FPA's: at the max it is p_max (dP − δ) with δ
      // from the bf16 output, whose rounding outweighs the true value once the
      // row's other p are small, so dQ and dK are held finite only (a NaN fails
      // "< inf"); past σ = 100 the fp64 reference's dQ can be exactly 0.
      if (sigma <= 100.0f)
        add(Group::kinterval_large, qattn::test::kinterval_config(nearest), kAutomaticAndMmaSync,
            {1, 2, 1024, d}, large, {}, {1e-2, -1, INFINITY, INFINITY, 1e-2});
    }

  // Sage: the default options on every shape (one tile, tail tiles, two
  // batches), the other option sets on a tail shape per head dim; T = 65 and
  // 1000 are multiples of neither 64 nor 128.
  SageOptions smooth_q_tile, dp_int8, all_bf16, no_smoothing, smooth_q;
  smooth_q_tile.smooth_q = true;
  smooth_q_tile.bwd_granularity = BwdGranularity::tile;
  dp_int8.precision.dp = Precision::int8;
  for (Precision* p : {&all_bf16.precision.qk, &all_bf16.precision.pv, &all_bf16.precision.dv,
                       &all_bf16.precision.dp, &all_bf16.precision.dq, &all_bf16.precision.dk})
    *p = Precision::bf16;
  no_smoothing.smooth_k = false;
  smooth_q.smooth_q = true;
  const InputRecipe sage_inputs{InputRecipe::normal, 1.0f, 1.0f, 0.3f};
  for (const AttentionShape& s :
       {AttentionShape{1, 2, 64, 64}, AttentionShape{1, 2, 1000, 64}, AttentionShape{1, 3, 65, 128},
        AttentionShape{1, 2, 1000, 128}, AttentionShape{2, 1, 1024, 128}})
    add(Group::sage, qattn::test::sage_config(), qattn::test::sage_families({}), s, sage_inputs, {},
        kSage);
  for (const SageOptions& opt : {smooth_q_tile, dp_int8, all_bf16, no_smoothing})
    for (const AttentionShape& s :
         {AttentionShape{1, 2, 1000, 64}, AttentionShape{1, 1, 1000, 128}})
      add(Group::sage, qattn::test::sage_config(opt), qattn::test::sage_families(opt), s,
          sage_inputs, {}, kSage);

  // fp8 (docs/attention-maths.md §4.12) on the CUDA kernels: pv (the wgmma
  // forward's e4m3 P̂ V̂), dv (the wgmma dK/dV's e4m3 P̂ᵀ dÔ), both, dq (the
  // wgmma dQ's e4m3 dŜ K̂), dv with dk (the dK/dV kernel's e4m3 dŜᵀ Q̂ beside
  // P̂ᵀ dÔ) and the four together (qk int8, dp bf16); qk alone (the e4m3 S =
  // Q̂ K̂ᵀ of all three kernels), dp alone (the e4m3 dP = dÔ V̂ᵀ of dQ and dK/dV),
  // qk = int8 with the other five fp8, all six fp8, and qk fp8 with dp int8
  // (the s8 dÔ V̂ᵀ beside an e4m3 S on the wgmma backward); on the shapes of the
  // defaults (T = 64: one block on the diagonal; T = 1000 and 1024: the causal
  // mask's full and diagonal blocks and a tail); then each with smooth_q, at
  // sigma = 5, and with V's and dO's 64-row blocks scaled 2^0 ... 2^-12 (the
  // folds span 2^-12, and ‖dO_i‖ and ‖V_j‖, so dS's per-row and per-key
  // exponents, with them).
  // The tolerances are the int8 ones: against the CPU reference (the
  // definition, in fp64) an fp8 operand differs only where the GPU's fp32 value
  // (hardware exp2 for P, bf16 dP summed in another order, fp32 norms in dS's
  // bound, fp32 c·(Q − μ_Q)) and the reference's fp64 one straddle an e4m3
  // rounding boundary (2^-4 relative apart) or a power of two of the bound
  // (§4.9); a flip moves that one entry by at most 2^-4 of itself, and the
  // entries flip independently, so the relative L2 of dQ and dK stays below that
  // of an int8 level flip of Q̂ or K̂, which moves a whole row of scores (what
  // kSage and kSageSigma5 are set by). The e4m3 S and dP are sums of exact
  // products in the tensor cores' accumulator, in their order and precision
  // (§4.9), against the reference's index-order fp64 sum: relative 2^-13 or
  // better of the sum's terms, far below a level flip.
  SageOptions pv_fp8, dv_fp8, both_fp8, dq_fp8, dv_dk_fp8, four_fp8, qk_fp8, dp_fp8, five_fp8,
      all_fp8, qk_fp8_dp_int8;
  pv_fp8.precision.pv = both_fp8.precision.pv = four_fp8.precision.pv = Precision::fp8;
  dv_fp8.precision.dv = both_fp8.precision.dv = dv_dk_fp8.precision.dv = Precision::fp8;
  dq_fp8.precision.dq = dv_dk_fp8.precision.dk = Precision::fp8;
  four_fp8.precision.dv = four_fp8.precision.dq = four_fp8.precision.dk = Precision::fp8;
  qk_fp8.precision.qk = qk_fp8_dp_int8.precision.qk = Precision::fp8;
  dp_fp8.precision.dp = Precision::fp8;
  qk_fp8_dp_int8.precision.dp = Precision::int8;
  for (Precision* p : {&five_fp8.precision.pv, &five_fp8.precision.dp, &five_fp8.precision.dv,
                       &five_fp8.precision.dq, &five_fp8.precision.dk})
    *p = Precision::fp8;
  all_fp8 = five_fp8;
  all_fp8.precision.qk = Precision::fp8;
  for (const SageOptions& opt : {pv_fp8, dv_fp8, both_fp8, dq_fp8, dv_dk_fp8, four_fp8, qk_fp8,
                                 dp_fp8, five_fp8, all_fp8, qk_fp8_dp_int8}) {
    const AttentionConfig cfg = qattn::test::sage_config(opt);
    const std::vector<FpaKernels> families = qattn::test::sage_families(opt);
    for (const AttentionShape& s : {AttentionShape{1, 2, 64, 64}, AttentionShape{1, 2, 1000, 64},
                                    AttentionShape{1, 3, 65, 128}, AttentionShape{1, 2, 1000, 128},
                                    AttentionShape{2, 1, 1024, 128}})
      add(Group::sage_fp8, cfg, families, s, sage_inputs, {}, kSage);
    SageOptions with_smooth_q = opt;
    with_smooth_q.smooth_q = true;
    for (const AttentionShape& s :
         {AttentionShape{1, 2, 1000, 64}, AttentionShape{1, 1, 1000, 128}}) {
      add(Group::sage_fp8, qattn::test::sage_config(with_smooth_q), families, s, sage_inputs, {},
          kSage);
      add(Group::sage_fp8, cfg, families, s, {InputRecipe::normal, 5.0f, 5.0f, 0.0f}, {},
          kSageSigma5);
      add(Group::sage_fp8, cfg, families, s, {InputRecipe::wide_values, 1.0f, 1.0f, 0.3f}, {},
          kSage);
    }
  }

  // c·Q and K near 1e-20, so that s_Q·s_K (about 1e-44) is below the smallest
  // normal float: the exact softmax's backward takes the scores in units of the
  // sums and smooth_q's bias in those units (HopperScores::backward_unit), whose
  // reciprocal of s_Q·s_K would be inf there, and the bias NaN.
  for (const SageOptions& opt : {SageOptions{}, smooth_q})
    for (const AttentionShape& s :
         {AttentionShape{1, 2, 1000, 64}, AttentionShape{1, 2, 1000, 128}})
      add(Group::sage_subnormal, qattn::test::sage_config(opt), qattn::test::sage_families(opt), s,
          {InputRecipe::normal, 1e-20f, 1e-20f, 3e-21f}, {}, kSage);

  // Sage with the K-interval block: every calibration x rounding x ste at K in
  // {4, 16}, d in {64, 128}, T = 64 (one tile, two heads) and 1000 (a tail
  // tile, one head: the fp64 reference costs O(T² d) per head); then the other
  // options once each on a tail shape (fwm + nearest + weight, where the window
  // mask and the path through m both act). Scores of standard deviation ~2 (Q,
  // K ~ N(0, 1.5²)): fwm's 8-nat window cuts keys off. Grid-exact Q, K, V: both
  // sides quantise them to the same levels.
  const InputRecipe grid_exact{InputRecipe::grid_exact, 1.5f, 1.5f, 0.0f};
  auto composed = [&](const AttentionConfig& cfg, AttentionShape s) {
    add(Group::sage_kinterval, cfg, qattn::test::sage_families(cfg.sage), s, grid_exact, {},
        kSageKInterval);
  };
  for (const int K : {4, 16})
    for (const Calibration cal : {Calibration::minmax, Calibration::fwm})
      for (const Rounding rounding : {Rounding::nearest, Rounding::lerp})
        for (const Ste ste : {Ste::weight, Ste::prob})
          for (const AttentionShape& s :
               {AttentionShape{1, 2, 64, 64}, AttentionShape{1, 1, 1000, 64},
                AttentionShape{1, 2, 64, 128}, AttentionShape{1, 1, 1000, 128}}) {
            KIntervalOptions k;
            k.K = K, k.calibration = cal, k.rounding = rounding, k.ste = ste;
            composed(qattn::test::composed_config(k), s);
          }
  KIntervalOptions fwm_weight;
  fwm_weight.K = 16, fwm_weight.calibration = Calibration::fwm,
  fwm_weight.rounding = Rounding::nearest;
  fwm_weight.ste = Ste::weight;
  KIntervalOptions detach = fwm_weight, mask = fwm_weight, minmax_lerp;
  detach.detach_extrema = true;
  mask.ste_window_mask = true;
  minmax_lerp.K = 4;  // the defaults: minmax, lerp (both calibration terms)
  SageOptions tile;
  tile.bwd_granularity = BwdGranularity::tile;
  using qattn::test::composed_config;
  for (const AttentionConfig& cfg :
       {composed_config(detach), composed_config(mask), composed_config(fwm_weight, dp_int8),
        composed_config(minmax_lerp, dp_int8), composed_config(fwm_weight, tile),
        composed_config(minmax_lerp, tile), composed_config(minmax_lerp, smooth_q)})
    composed(cfg, {1, 1, 1000, 64});

  // fp8 with one head's V or dO all zeros (the last head; the other random):
  // the fp8 kernels divide by a head's largest scale (s_V,top, s_dO,top, the
  // bound of dS), which such a head makes 0 or its floor, and the e4m3 dP's
  // blocks of zeros have scale 0. dv alone, the four fp8 products (qk int8, dp
  // bf16) and all six, on a tail shape and on one tile at d = 128. The test
  // below also requires exact zeros where the maths has them.
  for (const SageOptions& opt : {dv_fp8, four_fp8, all_fp8})
    for (const AttentionShape& s : {AttentionShape{1, 2, 1000, 64}, AttentionShape{1, 2, 64, 128}})
      for (const InputRecipe::Kind zeroed : {InputRecipe::zero_values, InputRecipe::zero_dout})
        add(Group::sage_fp8_zero_head, qattn::test::sage_config(opt),
            qattn::test::sage_families(opt), s, {zeroed, 1.0f, 1.0f, 0.3f}, {}, kSage);
  return all;
}

// The cases of one group, as check_cases takes them.
std::vector<AttentionCase> cases_of(Group group) {
  std::vector<AttentionCase> cases;
  for (auto& [g, c] : attention_cases())
    if (g == group) cases.push_back(std::move(c));
  return cases;
}

}  // namespace

TEST_CASE("FPA flash attention matches the CPU reference, forward and backward", "[attention]") {
  qattn::test::check_cases(cases_of(Group::fpa));
}

TEST_CASE("K-interval attention: every option combination and K at T = 64", "[kinterval]") {
  qattn::test::check_cases(cases_of(Group::kinterval_t64));
}

TEST_CASE("K-interval attention: K = 1, 3, 7 (1/K inexact), every option combination",
          "[kinterval]") {
  qattn::test::check_cases(cases_of(Group::kinterval_inexact_k));
}

TEST_CASE("K-interval attention: long sequences, every option combination", "[kinterval]") {
  qattn::test::check_cases(cases_of(Group::kinterval_long));
}

TEST_CASE("K-interval attention: many heads, blocks ranked over all heads", "[kinterval]") {
  qattn::test::check_cases(cases_of(Group::kinterval_many_heads));
}

TEST_CASE("K-interval attention: the mma.sync kernels on Hopper, every option combination",
          "[kinterval]") {
  // Where automatic is mma.sync, the cases above have checked it.
  if (!qattn::test::wgmma_available()) return;
  qattn::test::check_cases(cases_of(Group::kinterval_mma_sync));
}

TEST_CASE("K-interval attention: ties route the calibration terms to the lowest index",
          "[kinterval]") {
  qattn::test::check_cases(cases_of(Group::kinterval_ties));
}

TEST_CASE("sage on the GPU matches the CPU sage reference, forward and backward", "[sage]") {
  qattn::test::check_cases(cases_of(Group::sage));
}

TEST_CASE("sage with fp8 products (any of the six keys) matches the CPU sage reference (wgmma)",
          "[sage][fp8]") {
  qattn::test::check_cases(cases_of(Group::sage_fp8));
}

TEST_CASE("sage fp8 with one head's V or dO all zeros: the reference's values, its zeros exact",
          "[sage][fp8][zero-head]") {
  const std::vector<AttentionCase> cases = cases_of(Group::sage_fp8_zero_head);
  const std::vector<qattn::test::CaseRun> runs = qattn::test::check_cases(cases);
  // Beside the comparison with the reference (a NaN fails it), the zeroed head's
  // outputs that are exactly 0 in the maths (docs/attention-maths.md §4.5) must
  // be 0 on the GPU too. V = 0: O = P V = 0, so δ = rowsum(dO ∘ O) = 0 and
  // dP = dO Vᵀ = 0, dS = P ∘ (dP − δ) = 0, dQ = dS K = 0 and dK = dSᵀ Q = 0
  // (dV = Pᵀ dO is not). dO = 0: dV = Pᵀ dO = 0, dP = 0 and δ = 0, so dS = 0
  // and dQ = dK = 0 (O is not).
  struct Output {
    const char* name;
    bool of_dqkv;  // a slot of dQKV (B, T, 3, H, d), or O (B, T, H, d)
    int slot;
  };
  constexpr Output kO{"o", false, 0}, kDq{"dq", true, 0}, kDk{"dk", true, 1}, kDv{"dv", true, 2};
  for (const qattn::test::CaseRun& r : runs) {
    const AttentionCase& c = cases[r.c];
    const AttentionShape& s = c.shape;
    const int bh = qattn::test::zeroed_head(s), b = bh / s.H, h = bh % s.H;
    const bool zero_values = c.inputs.kind == InputRecipe::zero_values;
    const std::vector<Output> zero =
        zero_values ? std::vector<Output>{kO, kDq, kDk} : std::vector<Output>{kDq, kDk, kDv};
    for (const Output& out : zero) {
      const std::vector<__nv_bfloat16>& v = out.of_dqkv ? r.run.dqkv : r.run.o;
      int nonzero = 0;
      float first = 0.0f;
      for (int t = 0; t < s.T; ++t)
        for (int x = 0; x < s.d; ++x) {
          const float y = qattn::test::element(v, s, out.of_dqkv ? 3 : 1, b, t, out.slot, h, x);
          if (y != 0.0f && nonzero++ == 0) first = y;  // a NaN counts
        }
      INFO(qattn::test::describe(c.cfg, s)
           << " (" << qattn::test::family_name(r.family) << "), " << (zero_values ? "V" : "dO")
           << " of head " << bh << " all zeros: " << out.name << " has " << nonzero
           << " nonzero entries there, the first " << first);
      CHECK(nonzero == 0);
    }
  }
}

TEST_CASE("sage with c·Q and K so small that s_Q·s_K is subnormal matches the CPU reference",
          "[sage]") {
  qattn::test::check_cases(cases_of(Group::sage_subnormal));
}

TEST_CASE(
    "sage with the K-interval softmax block matches the CPU sage reference with the same block",
    "[sage][sage-kinterval]") {
  const std::vector<AttentionCase> cases = cases_of(Group::sage_kinterval);
  const std::vector<qattn::test::CaseRun> runs = qattn::test::check_cases(cases);
  // The families against each other on the same inputs. Their int8 scores are
  // the same integers times the same fp32 scale, so each row's grid (its max and
  // min, their indices, and what follows from them) must be the same bits, and
  // every weight the same; O then differs by the fp32 order of the sums (Ẑ, P̂V̂).
  for (size_t i = 1; i < runs.size(); ++i) {
    const qattn::test::CaseRun &a = runs[i - 1], &b = runs[i];
    if (a.c != b.c) continue;  // not two families of one case
    const AttentionCase& c = cases[b.c];
    const std::string what = qattn::test::describe(c.cfg, c.shape);
    INFO(what << ": " << qattn::test::family_name(a.family) << " against "
              << qattn::test::family_name(b.family));
    constexpr int kFields = 8;  // kinterval::RowStats, in this order:
    REQUIRE(qattn::cuda::attention_row_stats(c.cfg, c.shape.d) == kFields);
    static const char* const kField[kFields] = {"u_offset", "u_scale", "step",   "rho",
                                                "w_base",   "inv_z",   "argmax", "argmin"};
    int mismatched_rows = 0;
    for (size_t row = 0; row * kFields < a.run.stats.size(); ++row)
      for (int f = 0; f < kFields; ++f) {
        const float x = a.run.stats[row * kFields + f], y = b.run.stats[row * kFields + f];
        const bool same =
            f == 5 ? std::fabs(x - y) <= 1e-6f * std::fabs(x) : std::memcmp(&x, &y, 4) == 0;
        if (same) continue;
        if (++mismatched_rows <= 4)
          std::printf("sage+kinterval families  %s: row %zu %s %a against %a\n", what.c_str(), row,
                      kField[f], x, y);
        break;
      }
    const double o =
        qattn::test::rel_l2(qattn::test::to_float(b.run.o), qattn::test::to_float(a.run.o));
    const double dv = qattn::test::rel_l2(qattn::test::slot_of(b.run.dqkv, c.shape, 2),
                                          qattn::test::slot_of(a.run.dqkv, c.shape, 2));
    std::printf(
        "sage+kinterval families  %s  rel L2: o %.2e  dv %.2e, rows whose grid differs %d\n",
        what.c_str(), o, dv, mismatched_rows);
    CHECK(mismatched_rows == 0);
    CHECK(o < 1e-3);
  }
}

TEST_CASE("CUDA attention rejects unsupported head dims", "[attention]") {
  const AttentionShape bad_d{1, 1, 64, 96};
  CHECK_THROWS_AS(qattn::cuda::attention_forward(AttentionConfig{}, bad_d, nullptr, nullptr,
                                                 nullptr, nullptr, nullptr),
                  std::invalid_argument);
}

TEST_CASE("K-interval attention: finite and matching the reference at large scores",
          "[kinterval][large]") {
  qattn::test::check_cases(cases_of(Group::kinterval_large));
}
