// SageBwd with e4m3 operands (docs/attention-maths.md §4.12): the scale
// exponents, the CPU reference against an independent simulation of §4.12
// bit for bit, accuracy against FPA (all fp8 and mixed), and no saturation on
// sigma = 5 inputs or on inputs of extreme range.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>

#include "../../src/cpu/attention/quant.hpp"
#include "test_attention_common.hpp"

using namespace qattn;
using namespace qattn::test;

namespace {

AttentionConfig sage_with(const SagePrecision& p) {
  AttentionConfig cfg;
  cfg.kind = AttentionKind::sage;
  cfg.sage.precision = p;
  return cfg;
}
SagePrecision all_fp8() {
  SagePrecision p;
  p.qk = p.pv = p.dv = p.dp = p.dq = p.dk = Precision::fp8;
  return p;
}
SagePrecision int8_qk_fp8_rest() {  // the scores in int8, the five other products in fp8
  SagePrecision p = all_fp8();
  p.qk = Precision::int8;
  return p;
}

// ---------------------------------------------------------------------------
// An independent simulation of §4.1-§4.5 and §4.12 in double with plain loops,
// for qk in {int8, fp8} and the other five products in fp8, smooth_k on,
// smooth_q off. It shares no code with the reference: e4m3 rounding by search
// over the code values, exponents by counting.

// The e4m3 value of the code's low 7 bits c (0 ... 126), from §1.2.
double e4m3_value(int c) { return c < 8 ? std::ldexp(c, -9) : std::ldexp(8 + c % 8, c / 8 - 10); }

// Nearest e4m3 value of float(x), ties to the even code, saturating at 448.
double sim_e4m3(double x) {
  const double a = std::abs(double(float(x)));
  int c = 0;
  if (a >= 448) {
    c = 126;
  } else {
    while (e4m3_value(c + 1) <= a) c++;  // e4m3_value(c) <= a < e4m3_value(c + 1)
    const double below = a - e4m3_value(c), above = e4m3_value(c + 1) - a;
    if (above < below || (above == below && c % 2 == 1)) c++;
  }
  return std::copysign(e4m3_value(c), x);
}

// The smallest e with amax <= 2^(e + 8); 0 for amax = 0.
int sim_exponent(double amax) {
  if (amax == 0) return 0;
  int e = -1100;
  while (std::ldexp(1.0, e + 8) < amax) e++;
  return e;
}

struct SimOperand {  // a (rows, d) block: values and one scale
  std::vector<double> value;
  double scale;
  int exponent;  // fp8 only
};

// One block of rows [b0, b1) of x (T, d) at int8 (psi) or fp8.
SimOperand sim_block(bool fp8, const std::vector<double>& x, int d, int b0, int b1) {
  double amax = 0;
  for (int t = b0; t < b1; t++)
    for (int c = 0; c < d; c++) amax = std::max(amax, std::abs(x[(size_t)t * d + c]));
  SimOperand op{{}, 0, 0};
  if (fp8) {
    op.exponent = sim_exponent(amax);
    op.scale = std::ldexp(1.0, op.exponent);
  } else {
    op.scale = amax == 0 ? 1 : amax / 127;
  }
  for (int t = b0; t < b1; t++)
    for (int c = 0; c < d; c++) {
      const double v = x[(size_t)t * d + c];
      op.value.push_back(fp8 ? sim_e4m3(std::ldexp(v, -op.exponent)) : std::round(v / op.scale));
    }
  return op;
}

int sim_top(const std::vector<double>& x) {
  double amax = 0;
  for (double v : x) amax = std::max(amax, std::abs(v));
  return sim_exponent(amax);
}

// Row r of block b at int8 or fp8 dotted with row r2 of block b2, summed as
// §1.2 says: exactly for int8 levels, in order for e4m3 values.
double sim_dot(const double* a, size_t inc_a, const double* b, size_t inc_b, int n) {
  double acc = 0;
  for (int x = 0; x < n; x++) acc += a[x * inc_a] * b[x * inc_b];
  return acc;
}

struct SimOut {
  std::vector<double> o, dq, dk, dv;
};

SimOut simulate(bool qk_fp8, int block, const Head& h) {
  const int T = h.T, d = h.d, nb = (T + block - 1) / block;
  const double c = 1 / std::sqrt(double(d));
  const auto b0 = [&](int b) { return b * block; };
  const auto b1 = [&](int b) { return std::min(T, (b + 1) * block); };
  std::vector<double> qs(h.size()), ks = h.k;
  for (int x = 0; x < d; x++) {
    double mu = 0;
    for (int t = 0; t < T; t++) mu += h.k[(size_t)t * d + x];
    mu /= T;
    for (int t = 0; t < T; t++) ks[(size_t)t * d + x] -= mu;
  }
  for (size_t n = 0; n < h.size(); n++) qs[n] = c * h.q[n];
  std::vector<SimOperand> Qs, Ks, Vs, dOs, Kd, Qd, Vp, dOp;  // per block, per product
  for (int b = 0; b < nb; b++) {
    Qs.push_back(sim_block(qk_fp8, qs, d, b0(b), b1(b)));
    Ks.push_back(sim_block(qk_fp8, ks, d, b0(b), b1(b)));
    Vs.push_back(sim_block(true, h.v, d, b0(b), b1(b)));     // pv
    dOs.push_back(sim_block(true, h.dout, d, b0(b), b1(b)));  // dv
    Kd.push_back(sim_block(true, ks, d, b0(b), b1(b)));      // dq
    Qd.push_back(sim_block(true, qs, d, b0(b), b1(b)));      // dk
    Vp.push_back(sim_block(true, h.v, d, b0(b), b1(b)));     // dp
    dOp.push_back(sim_block(true, h.dout, d, b0(b), b1(b)));  // dp
  }
  const int v_top = sim_top(h.v), do_top = sim_top(h.dout), k_top = sim_top(ks),
            q_top = sim_top(qs);
  const auto score = [&](int i, int j) {
    const int bi = i / block, bj = j / block;
    return sim_dot(&Qs[bi].value[(size_t)(i - b0(bi)) * d], 1,
                   &Ks[bj].value[(size_t)(j - b0(bj)) * d], 1, d) *
           Qs[bi].scale * Ks[bj].scale;
  };
  SimOut out{std::vector<double>(h.size()), std::vector<double>(h.size(), 0.0),
             std::vector<double>(h.size(), 0.0), std::vector<double>(h.size(), 0.0)};
  // Forward (§4.4): online softmax over key blocks; P~ folded with 2^(8 - (v_top - e_Vj)).
  for (int i = 0; i < T; i++) {
    double m = -INFINITY, l = 0;
    std::vector<double> acc(d, 0.0);
    for (int kb = 0; b0(kb) <= i && kb < nb; kb++) {
      const int j1 = std::min(b1(kb), i + 1);
      double m_new = m;
      for (int j = b0(kb); j < j1; j++) m_new = std::max(m_new, score(i, j));
      const double rescale = std::exp(m - m_new);
      std::vector<double> pt;
      for (int j = b0(kb); j < j1; j++) pt.push_back(std::exp(score(i, j) - m_new));
      m = m_new;
      l *= rescale;
      for (double p : pt) l += p;
      const int fold = 8 - (v_top - std::min(Vs[kb].exponent, v_top));
      std::vector<double> phat;
      for (double p : pt) phat.push_back(sim_e4m3(std::ldexp(p, fold)));
      for (int x = 0; x < d; x++)
        acc[x] = acc[x] * rescale +
                 sim_dot(phat.data(), 1, &Vs[kb].value[x], d, (int)phat.size()) *
                     std::ldexp(1.0, v_top - 8);
    }
    for (int x = 0; x < d; x++) out.o[(size_t)i * d + x] = acc[x] / l;
  }
  // Backward (§4.5): P, dP (fp8), delta, dS; then the bounds of §4.12.
  std::vector<double> P((size_t)T * T, 0.0), dS((size_t)T * T, 0.0), delta(T);
  for (int i = 0; i < T; i++) {
    double m = -INFINITY, l = 0;
    for (int j = 0; j <= i; j++) m = std::max(m, score(i, j));
    for (int j = 0; j <= i; j++) l += std::exp(score(i, j) - m);
    const double L = m + std::log(l);
    delta[i] = sim_dot(&h.dout[(size_t)i * d], 1, &out.o[(size_t)i * d], 1, d);
    for (int j = 0; j <= i; j++) {
      const int bi = i / block, bj = j / block;
      const double dp = sim_dot(&dOp[bi].value[(size_t)(i - b0(bi)) * d], 1,
                                &Vp[bj].value[(size_t)(j - b0(bj)) * d], 1, d) *
                        dOp[bi].scale * Vp[bj].scale;
      P[(size_t)i * T + j] = std::exp(score(i, j) - L);
      dS[(size_t)i * T + j] = P[(size_t)i * T + j] * (dp - delta[i]);
    }
  }
  std::vector<double> do_norm(T), v_norm(T);
  double do_max = 0, v_max = 0, delta_max = 0;
  for (int t = 0; t < T; t++) {
    do_norm[t] = std::sqrt(sim_dot(&h.dout[(size_t)t * d], 1, &h.dout[(size_t)t * d], 1, d));
    v_norm[t] = std::sqrt(sim_dot(&h.v[(size_t)t * d], 1, &h.v[(size_t)t * d], 1, d));
    do_max = std::max(do_max, do_norm[t]);
    v_max = std::max(v_max, v_norm[t]);
    delta_max = std::max(delta_max, std::abs(delta[t]));
  }
  for (int qb = 0; qb < nb; qb++)
    for (int kb = 0; kb < nb && b0(kb) < b1(qb); kb++) {
      const int R = b1(qb) - b0(qb), C = b1(kb) - b0(kb);
      const auto at = [&](const std::vector<double>& M, int ri, int cj) {
        return M[(size_t)(b0(qb) + ri) * T + b0(kb) + cj];
      };
      // dV: P with 2^(8 - (do_top - e_dO,i)), one exponent for the tile.
      std::vector<double> ph((size_t)R * C), dsq((size_t)R * C), dsk((size_t)R * C);
      const int p_fold = 8 - (do_top - std::min(dOs[qb].exponent, do_top));
      for (int ri = 0; ri < R; ri++) {
        const int ebq = sim_exponent(do_norm[b0(qb) + ri] * v_max + std::abs(delta[b0(qb) + ri])) +
                        (k_top - std::min(Kd[kb].exponent, k_top));
        for (int cj = 0; cj < C; cj++) {
          const int ebk = sim_exponent(v_norm[b0(kb) + cj] * do_max + delta_max) +
                          (q_top - std::min(Qd[qb].exponent, q_top));
          ph[(size_t)ri * C + cj] = sim_e4m3(std::ldexp(at(P, ri, cj), p_fold));
          dsq[(size_t)ri * C + cj] = sim_e4m3(std::ldexp(at(dS, ri, cj), -ebq));
          dsk[(size_t)ri * C + cj] = sim_e4m3(std::ldexp(at(dS, ri, cj), -ebk));
        }
      }
      for (int cj = 0; cj < C; cj++)
        for (int x = 0; x < d; x++)
          out.dv[(size_t)(b0(kb) + cj) * d + x] +=
              sim_dot(&ph[cj], C, &dOs[qb].value[x], d, R) * std::ldexp(1.0, do_top - 8);
      for (int ri = 0; ri < R; ri++) {
        const int eb = sim_exponent(do_norm[b0(qb) + ri] * v_max + std::abs(delta[b0(qb) + ri]));
        for (int x = 0; x < d; x++)
          out.dq[(size_t)(b0(qb) + ri) * d + x] +=
              std::ldexp(c * sim_dot(&dsq[(size_t)ri * C], 1, &Kd[kb].value[x], d, C), eb + k_top);
      }
      for (int cj = 0; cj < C; cj++) {
        const int eb = sim_exponent(v_norm[b0(kb) + cj] * do_max + delta_max);
        for (int x = 0; x < d; x++)
          out.dk[(size_t)(b0(kb) + cj) * d + x] +=
              std::ldexp(sim_dot(&dsk[cj], C, &Qd[qb].value[x], d, R), eb + q_top);
      }
    }
  return out;
}

size_t count_differ(const std::vector<double>& a, const std::vector<double>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); i++) n += a[i] != b[i];
  return n;
}


}  // namespace

TEST_CASE("sage fp8: scale exponents and the pre-cast peak", "[attention][sage][fp8]") {
  CHECK(cpu::fp8_exponent(256.0) == 0);
  CHECK(cpu::fp8_exponent(std::nextafter(256.0, 1e9)) == 1);
  CHECK(cpu::fp8_exponent(1.0) == -8);
  CHECK(cpu::fp8_exponent(0.75f) == -8);
  CHECK(cpu::fp8_exponent(0.0) == 0);
  CHECK(cpu::fp8_exponent(1e-30) == sim_exponent(1e-30));
  const std::vector<double> x = {304.0, -1.0, 0.001, 2.0};
  const auto op = cpu::quantise(Precision::fp8, cpu::ScaleGroup::whole, x.data(), 1, 4, 4);
  CHECK(op.scale[0] == 2.0);  // 304 <= 2^(1 + 8)
  CHECK(op.peak == 152.0);
  // 152 is the tie of 144 and 160: to 160, the even code; 0.0005 is below 2^-10.
  CHECK(op.value == std::vector<double>{160.0, -0.5, 0.0, 1.0});
  // An exponent too small for the data saturates, and the peak shows it.
  const auto low = cpu::quantise_fp8(cpu::ScaleGroup::whole, x.data(), 1, 4, 4, {-1});
  CHECK(low.peak == 608.0);
  CHECK(low.value[0] == 448.0);
}

TEST_CASE("sage fp8: the reference equals an independent simulation of §4.12 bit for bit",
          "[attention][sage][fp8]") {
  const int block = 32;
  for (double sigma : {1.0, 5.0})
    for (bool qk_fp8 : {true, false}) {
      Head h(80, 16, sigma, 71);  // T = 80: a short last block
      for (double& x : h.v) x *= 3.0;
      AttentionConfig cfg = sage_with(qk_fp8 ? all_fp8() : int8_qk_fp8_rest());
      cfg.sage.block_q = cfg.sage.block_k = block;
      const Grads<double> ref = run_kind<double>(cfg, h);
      const SimOut sim = simulate(qk_fp8, block, h);
      INFO("sigma " << sigma << (qk_fp8 ? ", all fp8" : ", qk int8, the rest fp8"));
      CHECK(count_differ(ref.o, sim.o) == 0);
      CHECK(count_differ(ref.dq, sim.dq) == 0);
      CHECK(count_differ(ref.dk, sim.dk) == 0);
      CHECK(count_differ(ref.dv, sim.dv) == 0);
    }
}

// The accuracy table of docs/sage.md ("FP8 operands"), printed by this test.
TEST_CASE("sage fp8: accuracy against FPA, all fp8 and mixed (SageBwd Table 1 setting)",
          "[attention][sage][fp8]") {
  const int T = 1024, d = 64;
  SagePrecision fp8_dp_bf16 = all_fp8();
  fp8_dp_bf16.dp = Precision::bf16;
  SagePrecision fp8_sums = fp8_dp_bf16;  // fp8 exactly where the sums run over blocks
  fp8_sums.qk = Precision::int8;
  std::vector<std::pair<std::string, SagePrecision>> settings = {
      {"int8 (default: dp bf16)", SagePrecision{}},
      {"all fp8", all_fp8()},
      {"fp8, dp bf16", fp8_dp_bf16},
      {"qk int8, the rest fp8", int8_qk_fp8_rest()},
      {"qk int8, dp bf16, the rest fp8", fp8_sums}};
  for (const auto& [key, member] :  // the defaults with one product in fp8
       {std::pair{"qk", &SagePrecision::qk}, std::pair{"pv", &SagePrecision::pv},
        std::pair{"dv", &SagePrecision::dv}, std::pair{"dp", &SagePrecision::dp},
        std::pair{"dq", &SagePrecision::dq}, std::pair{"dk", &SagePrecision::dk}}) {
    SagePrecision p;
    p.*member = Precision::fp8;
    settings.push_back({std::string("defaults, ") + key + " fp8", p});
  }
  const auto error = [](const Cosines& c) { return 4 - c.o - c.dq - c.dk - c.dv; };
  std::string table = "sage vs fp64 fpa, T = 1024, d = 64, seed 1, cosine:";
  for (double sigma : {1.0, 5.0}) {
    const Head h(T, d, sigma, 1);
    const Grads<double> fpa = run_kind<double>(AttentionConfig{}, h);
    std::vector<Cosines> c;
    for (const auto& [name, p] : settings) {
      c.push_back(cosines_vs_fpa(sage_with(p), h, fpa));
      table += "\n  sigma " + std::to_string(int(sigma)) + ", " + name + ": " + show(c.back());
    }
    // e4m3 keeps 3 mantissa bits, a relative step of 2^-4 at every magnitude;
    // int8 steps by 1/127 of a block's largest value, finer for all but the
    // smallest entries. At sigma = 1 all fp8 has about 10x int8's 1 - cos; at
    // sigma = 5 the scores' error (relative to |S|, which grows as sigma^2)
    // takes fp8 qk's dQ and dK to about 0.84, and int8 qk keeps them near int8's.
    for (size_t n = 1; n < c.size(); n++) {
      const double floor = sigma == 1 ? 0.997 : settings[n].second.qk == Precision::int8 ? 0.95 : 0.8;
      INFO(settings[n].first << ", sigma " << sigma << ": " << show(c[n]));
      for (double x : {c[n].o, c[n].dq, c[n].dk, c[n].dv}) CHECK(x >= floor);
      CHECK(error(c[n]) > error(c[0]));  // any fp8 product adds error to int8's
    }
  }
  WARN(table);
}

TEST_CASE("sage fp8: no operand saturates, sigma = 5 and extreme ranges", "[attention][sage][fp8]") {
  const int T = 512, d = 64;
  for (double v_scale : {1.0, 1e4, 1e-4}) {
    Head h(T, d, 5.0, 81);
    for (double& x : h.v) x *= v_scale;
    for (double& x : h.dout) x /= v_scale;
    const auto q = cast<float>(h.q), k = cast<float>(h.k), v = cast<float>(h.v),
               dout = cast<float>(h.dout);
    std::vector<float> o(h.size()), dq(h.size()), dk(h.size()), dv(h.size());
    SageOptions opt;
    opt.precision = all_fp8();
    cpu::sage_forward(opt, T, d, q.data(), k.data(), v.data(), o.data());
    cpu::AttentionInternals<float> inner;
    cpu::sage_backward(opt, T, d, q.data(), k.data(), v.data(), o.data(), dout.data(), dq.data(),
                       dk.data(), dv.data(), &inner);
    // Every fp8 operand before its cast lies within 256 (448 saturates).
    INFO("V scaled by " << v_scale << ", dO by " << 1 / v_scale << ": peak " << inner.fp8_peak);
    CHECK(inner.fp8_peak <= 256.0f);
    CHECK(inner.fp8_peak > 64.0f);
    // The bounds behind dS's scales hold entry by entry.
    std::vector<double> do_norm(T), v_norm(T), delta(T);
    double do_max = 0, v_max = 0, delta_max = 0;
    for (int t = 0; t < T; t++) {
      double a = 0, b = 0, c = 0;
      for (int x = 0; x < d; x++) {
        a += double(dout[(size_t)t * d + x]) * dout[(size_t)t * d + x];
        b += double(v[(size_t)t * d + x]) * v[(size_t)t * d + x];
        c += double(dout[(size_t)t * d + x]) * o[(size_t)t * d + x];
      }
      do_norm[t] = std::sqrt(a), v_norm[t] = std::sqrt(b), delta[t] = c;
      do_max = std::max(do_max, do_norm[t]), v_max = std::max(v_max, v_norm[t]);
      delta_max = std::max(delta_max, std::abs(c));
    }
    double row_ratio = 0, col_ratio = 0;  // max |dS_ij| / bound
    for (int i = 0; i < T; i++)
      for (int j = 0; j <= i; j++) {
        const double ds = std::abs(double(inner.ds[(size_t)i * T + j]));
        row_ratio = std::max(row_ratio, ds / (do_norm[i] * v_max + std::abs(delta[i])));
        col_ratio = std::max(col_ratio, ds / (v_norm[j] * do_max + delta_max));
      }
    INFO("max |dS| / bound: rows " << row_ratio << ", columns " << col_ratio);
    CHECK(row_ratio <= 1.0);
    CHECK(col_ratio <= 1.0);
    for (const auto* g : {&o, &dq, &dk, &dv})
      for (float x : *g) REQUIRE(std::isfinite(x));
  }
}
