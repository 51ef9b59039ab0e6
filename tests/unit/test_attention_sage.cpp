// SageBwd INT8 (docs/attention-maths.md §4): the quantisers, the all-bf16
// self-check, smoothing, the Gaussian accuracy of SageBwd Table 1 against the
// simulated figures of §4.10,
// the dp = int8 ablation, block shapes, the composition with K-interval, and the
// causality leak of per-block scales.
#include <catch2/catch.hpp>
#include <cmath>

#include "../../src/cpu/attention/quant.hpp"
#include "test_attention_common.hpp"

using namespace qattn;
using namespace qattn::test;

namespace {

AttentionConfig sage_config() {
  AttentionConfig cfg;
  cfg.kind = AttentionKind::sage;
  return cfg;
}
void all_bf16(SagePrecision& p) {
  p.qk = p.pv = p.dv = p.dp = p.dq = p.dk = Precision::bf16;
}


}  // namespace

TEST_CASE("sage quantisers: psi rounds half away from zero, bf16 ties to even", "[attention][sage]") {
  const std::vector<double> x = {127.0, -63.5, 0.5, -0.5, 2.49};
  const auto op = cpu::quantise(Precision::int8, cpu::ScaleGroup::whole, x.data(), 1, 5, 5);
  CHECK(op.scale[0] == 1.0);
  CHECK(op.value == std::vector<double>{127, -64, 1, -1, 2});
  const std::vector<double> zeros(4, 0.0);  // max|X| = 0: scale 1
  CHECK(cpu::quantise(Precision::int8, cpu::ScaleGroup::whole, zeros.data(), 2, 2, 2).scale[0] == 1.0);
  // Per-row and per-column scales of a (2, 2) tile.
  const std::vector<double> t = {254.0, 1.0, -127.0, 0.0};
  const auto rows = cpu::quantise(Precision::int8, cpu::ScaleGroup::per_row, t.data(), 2, 2, 2);
  CHECK(rows.scale == std::vector<double>{2.0, 1.0});
  CHECK(rows.value == std::vector<double>{127, 1, -127, 0});  // 0.5 rounds away from zero
  const auto cols = cpu::quantise(Precision::int8, cpu::ScaleGroup::per_col, t.data(), 2, 2, 2);
  CHECK(cols.scale == std::vector<double>{2.0, 1.0 / 127});
  CHECK(cpu::round_to_bf16(1.0f + 0x1p-8f) == 1.0f);                  // tie: to even
  CHECK(cpu::round_to_bf16(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);    // tie: to even (up)
  CHECK(cpu::round_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);
}

TEST_CASE("sage with all six precisions bf16 equals fpa within bf16 rounding", "[attention][sage]") {
  const Head h(256, 64, 1.0, 21);
  const Grads<double> fpa = run_kind<double>(AttentionConfig{}, h);
  for (bool smooth_k : {false, true})
    for (bool smooth_q : {false, true}) {
      AttentionConfig cfg = sage_config();
      all_bf16(cfg.sage.precision);
      cfg.sage.smooth_k = smooth_k, cfg.sage.smooth_q = smooth_q;
      const Cosines c = cosines_vs_fpa(cfg, h, fpa);
      INFO("smooth_k " << smooth_k << " smooth_q " << smooth_q << ": " << show(c));
      CHECK(c.o >= 0.99999);
      CHECK(c.dq >= 0.99999);
      CHECK(c.dk >= 0.99999);
      CHECK(c.dv >= 0.99999);
    }
}

TEST_CASE("K-smoothing leaves fpa unchanged in real arithmetic", "[attention][sage]") {
  // Quantisation off is FPA itself: K - 1 mu_K^T gives the same O, dQ, dK, dV (double).
  const Head h(48, 16, 1.0, 31);
  Head smoothed = h;
  for (int x = 0; x < h.d; x++) {
    double mu = 0;
    for (int t = 0; t < h.T; t++) mu += h.k[(size_t)t * h.d + x];
    mu /= h.T;
    for (int t = 0; t < h.T; t++) smoothed.k[(size_t)t * h.d + x] -= mu;
  }
  const Grads<double> a = run_kind<double>(AttentionConfig{}, h);
  const Grads<double> b = run_kind<double>(AttentionConfig{}, smoothed);
  CHECK(max_rel(b.o, a.o) < 1e-12);
  CHECK(max_rel(b.dq, a.dq) < 1e-12);
  CHECK(max_rel(b.dk, a.dk) < 1e-12);
  CHECK(max_rel(b.dv, a.dv) < 1e-12);
}

TEST_CASE("sage smoothing removes the int8 error of a common offset", "[attention][sage]") {
  Head h(256, 32, 1.0, 5);
  for (double& x : h.k) x += 4.0;  // a shared key component, as in real activations
  for (double& x : h.q) x += 2.0;
  const Grads<double> fpa = run_kind<double>(AttentionConfig{}, h);
  AttentionConfig cfg = sage_config();
  cfg.sage.smooth_k = false;
  const Cosines off = cosines_vs_fpa(cfg, h, fpa);
  cfg.sage.smooth_k = true;
  const Cosines k_on = cosines_vs_fpa(cfg, h, fpa);
  cfg.sage.smooth_q = true;
  const Cosines kq_on = cosines_vs_fpa(cfg, h, fpa);
  INFO("no smoothing: " << show(off) << "\nsmooth_k: " << show(k_on) << "\nsmooth_k + smooth_q: "
                        << show(kq_on));
  CHECK(1 - k_on.dq < (1 - off.dq) / 5);
  CHECK(k_on.dq >= 0.9995);
  // smooth_q (its fp32 bias on S and the c (dS^T 1) mu_Q^T correction of dK) helps
  // when Q has a common component; a missing correction would ruin dK.
  CHECK(kq_on.dk > k_on.dk);
  CHECK(kq_on.o > k_on.o);
  CHECK(kq_on.dk >= 0.9998);
}

TEST_CASE("sage accuracy on Gaussian inputs (SageBwd Table 1)", "[attention][sage]") {
  const int T = 1024, d = 64;
  const Head h1(T, d, 1.0, 1), h3(T, d, 3.0, 1), h5(T, d, 5.0, 1), h8(T, d, 8.0, 1);
  const Grads<double> fpa1 = run_kind<double>(AttentionConfig{}, h1);
  const Grads<double> fpa5 = run_kind<double>(AttentionConfig{}, h5);
  AttentionConfig cfg = sage_config();  // defaults: int8, dp bf16, smooth_k, rowcol
  const Cosines s1 = cosines_vs_fpa(cfg, h1, fpa1);
  const Cosines s3 = cosines_vs_fpa(cfg, h3, run_kind<double>(AttentionConfig{}, h3));
  const Cosines s5 = cosines_vs_fpa(cfg, h5, fpa5);
  const Cosines s8 = cosines_vs_fpa(cfg, h8, run_kind<double>(AttentionConfig{}, h8));
  cfg.sage.precision.dp = Precision::int8;
  const Cosines dp8 = cosines_vs_fpa(cfg, h1, fpa1);
  cfg.sage.precision.dp = Precision::bf16;
  cfg.sage.bwd_granularity = BwdGranularity::tile;
  const Cosines tile = cosines_vs_fpa(cfg, h1, fpa1);
  WARN("sage vs fp64 fpa, T = 1024, d = 64, cosine:\n  sigma 1 rowcol:        "
       << show(s1) << "\n  sigma 3 rowcol:        " << show(s3) << "\n  sigma 5 rowcol:        "
       << show(s5) << "\n  sigma 8 rowcol:        " << show(s8) << "\n  sigma 1 rowcol dp int8: "
       << show(dp8) << "\n  sigma 1 tile:          " << show(tile));

  // sigma = 1: the bar of the issue, and §4.10's simulated figures within 1e-4.
  for (double c : {s1.o, s1.dq, s1.dk, s1.dv}) CHECK(c >= 0.9995);
  CHECK(s1.o == Approx(0.99987).margin(1e-4));
  CHECK(s1.dq == Approx(0.99980).margin(1e-4));
  CHECK(s1.dk == Approx(0.99981).margin(1e-4));
  CHECK(s1.dv == Approx(0.99986).margin(1e-4));
  // sigma = 5: SageBwd reports dQ, dK ~ 0.98; accuracy falls with sigma.
  for (double c : {s5.o, s5.dq, s5.dk, s5.dv}) CHECK(c >= 0.95);
  CHECK(s5.o < s1.o);
  CHECK(s5.dq < s1.dq);
  CHECK(s5.dk < s1.dk);
  CHECK(s5.dv < s1.dv);
  // The gradients' cosines fall step by step with sigma (the table of docs/attention.md).
  CHECK(s8.dq < s5.dq);
  CHECK(s5.dq < s3.dq);
  CHECK(s3.dq < s1.dq);
  CHECK(s8.dk < s5.dk);
  CHECK(s5.dk < s3.dk);
  CHECK(s3.dk < s1.dk);
  // dp = int8 quantises the one product SageBwd keeps in 16 bit: dQ measurably worse.
  CHECK(1 - dp8.dq > 1.2 * (1 - s1.dq));
  CHECK(dp8.dq == Approx(0.99973).margin(1e-4));
  // One scale per tile for P and dS is coarser than one per row/column.
  CHECK(tile.dq < s1.dq);
  CHECK(tile.dk < s1.dk);
  CHECK(tile.dv < s1.dv);
  CHECK(tile.dv == Approx(0.99922).margin(1e-4));
}

TEST_CASE("sage with blocks that do not divide T, and block_q != block_k", "[attention][sage]") {
  const Head h(100, 16, 1.0, 41);
  const Grads<double> fpa = run_kind<double>(AttentionConfig{}, h);
  for (auto [bq, bk] : {std::pair{64, 32}, {32, 64}, {7, 13}, {1, 1}, {128, 128}}) {
    AttentionConfig cfg = sage_config();
    cfg.sage.block_q = bq, cfg.sage.block_k = bk;
    cfg.sage.smooth_q = true;
    const Cosines c = cosines_vs_fpa(cfg, h, fpa);
    all_bf16(cfg.sage.precision);
    const Cosines b = cosines_vs_fpa(cfg, h, fpa);
    INFO("block_q " << bq << " block_k " << bk << ": int8 " << show(c) << ", bf16 " << show(b));
    for (double x : {c.o, c.dq, c.dk, c.dv}) CHECK(x >= 0.999);
    for (double x : {b.o, b.dq, b.dk, b.dv}) CHECK(x >= 0.9999);  // small T, d: fewer terms to average
  }
  AttentionConfig bad = sage_config();
  bad.sage.block_k = 0;
  CHECK_THROWS_WITH(run_kind<float>(bad, h), Catch::Contains("block_k"));
}

// The quantised softmax makes the gradient jump where a score crosses a grid
// cell, so bf16 noise on the scores alone moves it far. On inputs whose scores
// bf16 represents exactly (multiples of 1/8, d = 16 so c = 1/4), the all-bf16
// composition must equal the K-interval kind up to the bf16 rounding of P and dS.
TEST_CASE("sage composed with a K-interval softmax", "[attention][sage]") {
  Head h(96, 16, 1.5, 51);
  for (std::vector<double>* t : {&h.q, &h.k, &h.v, &h.dout})
    for (double& x : *t) x = std::round(8 * x) / 8;
  for (Calibration cal : {Calibration::minmax, Calibration::fwm})
    for (Rounding rounding : {Rounding::nearest, Rounding::lerp}) {
      AttentionConfig kint;
      kint.kind = AttentionKind::kinterval;
      kint.kinterval.rounding = rounding, kint.kinterval.calibration = cal;
      kint.kinterval.ste = Ste::weight, kint.kinterval.window = 4.0;
      const Grads<double> ref = run_kind<double>(kint, h);
      AttentionConfig cfg = sage_config();
      cfg.sage.softmax = kint.kinterval;
      cfg.sage.smooth_k = false;  // K - mu_K is not exact in bf16
      all_bf16(cfg.sage.precision);
      const Grads<double> b = run_kind<double>(cfg, h);
      const Cosines c{cosine(b.o, ref.o), cosine(b.dq, ref.dq), cosine(b.dk, ref.dk),
                      cosine(b.dv, ref.dv)};
      INFO(to_string(cal) << " " << to_string(rounding) << ": all-bf16 sage vs kinterval " << show(c));
      for (double x : {c.o, c.dq, c.dk, c.dv}) CHECK(x >= 0.99999);
    }
  // With int8 matmuls and a fine lerp grid the composition stays close.
  const Head g(256, 64, 1.0, 52);
  AttentionConfig kint;
  kint.kind = AttentionKind::kinterval;
  kint.kinterval.K = 64;
  const Grads<double> ref = run_kind<double>(kint, g);
  AttentionConfig cfg = sage_config();
  cfg.sage.softmax = kint.kinterval;
  const Cosines c = cosines_vs_fpa(cfg, g, ref);
  INFO("int8 sage + lerp K = 64 vs kinterval: " << show(c));
  for (double x : {c.o, c.dq, c.dk, c.dv}) CHECK(x >= 0.999);
}

TEST_CASE("sage: later tokens change earlier outputs only through quantisation scales",
          "[attention][sage]") {
  const int T = 256, d = 64;
  const Head h(T, d, 1.0, 61);
  Head later = h;
  const size_t half = (size_t)(T / 2) * d;
  for (size_t n = half; n < h.size(); n++) later.k[n] = 3.0 * later.k[n] + 1.0, later.v[n] *= 3.0;
  const Grads<double> a = run_kind<double>(sage_config(), h), b = run_kind<double>(sage_config(), later);
  double change = 0, size = 0;
  for (size_t n = 0; n < half; n++) {
    change = std::max(change, std::abs(a.o[n] - b.o[n]));
    size = std::max(size, std::abs(a.o[n]));
  }
  WARN("sage causality: largest change of a first-half output " << change << " (largest output "
                                                               << size << ")");
  CHECK(change > 0);
  CHECK(change < 0.05 * size);
}
