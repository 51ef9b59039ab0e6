// SageBwd INT8 attention (docs/attention-maths.md §4), simulated as the kernel computes it: the
// same quantisation blocks, scales and rounding, int8 products accumulated
// exactly in int32 and scaled in fp32, bf16 and e4m3 operands accumulated in
// fp32 (e4m3 with the power-of-two scales of §4.12).
// The optional softmax block replaces exp(S - m) by K-interval weights (§6,
// the composition). Matrices are materialised (T, T) here for readability; the
// CUDA kernel tiles them, which changes no quantisation decision.
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kinds.hpp"
#include "kinterval.hpp"
#include "quant.hpp"
#include "rowwise.hpp"

namespace qattn::cpu {

namespace {

// A range of rows [begin, end) of the sequence: one quantisation block.
struct Block {
  int begin, end;
  int size() const { return end - begin; }
};
std::vector<Block> blocks_of(int T, int block) {
  std::vector<Block> out;
  for (int b = 0; b < T; b += block) out.push_back({b, std::min(b + block, T)});
  return out;
}

// max |x_n| over n entries.
template <typename F>
F max_abs(const F* x, size_t n) {
  F a = 0;
  for (size_t i = 0; i < n; i++) a = std::max(a, std::abs(x[i]));
  return a;
}

// How far an fp8 block's scale lies below its head's, top - e_block >= 0: the
// exponent folded into the other operand of a sum over blocks (§4.12). A block
// of zeros has exponent 0, which may exceed top; it multiplies zeros only and
// counts as top.
template <typename F>
int below_top(const Operand<F>& block, int top) {
  return top - std::min(exponent_of(block.scale[0]), top);
}

// psi (or e4m3, or bf16) of x (T, d) per block of rows: one operand per block.
template <typename F>
std::vector<Operand<F>> quantise_blocks(Precision p, const std::vector<Block>& blocks, const F* x,
                                        int d) {
  std::vector<Operand<F>> out;
  for (const Block& b : blocks)
    out.push_back(quantise(p, ScaleGroup::whole, x + (size_t)b.begin * d, b.size(), d, d));
  return out;
}

// The smoothed, scaled and quantised inputs that forward and backward share
// (§4.2-§4.4) and the scores S they define.
template <typename F>
struct SageInputs {
  int T, d;
  F c;                              // 1 / sqrt(d)
  std::vector<Block> qblocks, kblocks;
  std::vector<F> q_scaled;          // (T, d) c (Q - mu_Q of the row's block)
  std::vector<F> q_mean;            // (nqb, d) mu_Q per query block; zeros without smooth_q
  std::vector<F> k_smooth;          // (T, d) K - mu_K, or K without smooth_k
  std::vector<Operand<F>> qhat;     // per query block: psi(c Q), precision qk
  std::vector<Operand<F>> khat;     // per key block: psi(K), precision qk
  Precision qk;
  bool bias;                        // smooth_q: S gains c mu_Q K^T

  SageInputs(const SageOptions& opt, int T_, int d_, const F* q, const F* k)
      : T(T_), d(d_), c(F(1) / std::sqrt(F(d_))), qblocks(blocks_of(T_, opt.block_q)),
        kblocks(blocks_of(T_, opt.block_k)), q_scaled((size_t)T_ * d_),
        q_mean(qblocks.size() * d_, F(0)), k_smooth(k, k + (size_t)T_ * d_),
        qk(opt.precision.qk), bias(opt.smooth_q) {
    if (opt.smooth_k) {
      std::vector<F> mu(d, F(0));  // (d) mean of K over all T tokens
      for (int t = 0; t < T; t++)
        for (int x = 0; x < d; x++) mu[x] += k[(size_t)t * d + x];
      for (int x = 0; x < d; x++) mu[x] /= F(T);
      for (int t = 0; t < T; t++)
        for (int x = 0; x < d; x++) k_smooth[(size_t)t * d + x] -= mu[x];
    }
    for (size_t b = 0; b < qblocks.size(); b++) {
      F* mu = q_mean.data() + b * d;  // (d)
      if (opt.smooth_q) {
        for (int t = qblocks[b].begin; t < qblocks[b].end; t++)
          for (int x = 0; x < d; x++) mu[x] += q[(size_t)t * d + x];
        for (int x = 0; x < d; x++) mu[x] /= F(qblocks[b].size());
      }
      for (int t = qblocks[b].begin; t < qblocks[b].end; t++)
        for (int x = 0; x < d; x++) q_scaled[(size_t)t * d + x] = c * (q[(size_t)t * d + x] - mu[x]);
    }
    qhat = quantise_blocks(qk, qblocks, q_scaled.data(), d);
    khat = quantise_blocks(qk, kblocks, k_smooth.data(), d);
  }
  int qblock_of(int t) const { return t / qblocks[0].size(); }
  int kblock_of(int t) const { return t / kblocks[0].size(); }

  // S_ij = (Q^_i . K^_j) s_Q s_K, plus the fp32 bias c mu_Q . K_j under smooth_q.
  F score(int i, int j) const {
    const int qb = qblock_of(i), kb = kblock_of(j);
    const Operand<F>& a = qhat[qb];
    const Operand<F>& b = khat[kb];
    const int ri = i - qblocks[qb].begin, rj = j - kblocks[kb].begin;
    F s = operand_dot(qk, a.row(ri), 1, b.row(rj), 1, d) * a.scale[0] * b.scale[0];
    if (bias) s += c * row_dot(q_mean.data() + (size_t)qb * d, k_smooth.data() + (size_t)j * d, d);
    return s;
  }
  // s (i + 1) = row i of S over the visible keys.
  void scores_row(int i, F* s) const {
    for (int j = 0; j <= i; j++) s[j] = score(i, j);
  }
};

void check_blocks(const SageOptions& opt) {
  if (opt.block_q < 1 || opt.block_k < 1)
    throw std::invalid_argument("attention.sage.block_q/block_k: " + std::to_string(opt.block_q) +
                                "/" + std::to_string(opt.block_k) + "; allowed: >= 1");
}

}  // namespace

template <typename F>
void sage_forward(const SageOptions& opt, int T, int d, const F* q, const F* k, const F* v,
                  F* o) {
  check_blocks(opt);
  const SageInputs<F> in(opt, T, d, q, k);
  const Precision pv = opt.precision.pv;
  const std::vector<Operand<F>> vhat = quantise_blocks(pv, in.kblocks, v, d);  // psi(V_j)
  const int v_top = fp8_exponent(max_abs(v, (size_t)T * d));  // fp8: the head's V exponent
  std::vector<F> s(T), pt(T), acc(d);  // scores, P~ of one row; output accumulator (d)
  for (int i = 0; i < T; i++) {
    in.scores_row(i, s.data());
    if (opt.softmax) kinterval_weights(*opt.softmax, i + 1, s.data(), pt.data());
    F m = -std::numeric_limits<F>::infinity(), l = 0;  // running row max, row sum of P~
    std::fill(acc.begin(), acc.end(), F(0));
    for (size_t kb = 0; kb < in.kblocks.size() && in.kblocks[kb].begin <= i; kb++) {
      const int j0 = in.kblocks[kb].begin, n = std::min(in.kblocks[kb].end, i + 1) - j0;
      F rescale = 1;  // online softmax: exp(m_old - m_new) for what is accumulated
      if (!opt.softmax) {  // P~_ij = exp(S_ij - m_ij), m_ij the running max; K-interval weights
        F m_new = m;       // are already relative to the row's final max
        for (int j = j0; j < j0 + n; j++) m_new = std::max(m_new, s[j]);
        rescale = std::exp(m - m_new);
        for (int j = j0; j < j0 + n; j++) pt[j] = std::exp(s[j] - m_new);
        m = m_new;
      }
      l *= rescale;
      for (int j = j0; j < j0 + n; j++) l += pt[j];
      // P^ = psi(P~) per row and key block: s_P = max P~ / 127. At fp8 the
      // block's V exponent is folded into P~ against the head's (§4.12), so
      // s_P s_V = 2^(v_top - 8) on every block.
      const Operand<F>& vj = vhat[kb];
      const Operand<F> phat =
          pv == Precision::fp8
              ? quantise_fp8(ScaleGroup::whole, pt.data() + j0, 1, n, n,
                             {below_top(vj, v_top) - 8})
              : quantise(pv, ScaleGroup::whole, pt.data() + j0, 1, n, n);
      for (int x = 0; x < d; x++)
        acc[x] = acc[x] * rescale +
                 operand_dot(pv, phat.row(0), 1, vj.row(0) + x, d, n) * phat.scale[0] * vj.scale[0];
    }
    for (int x = 0; x < d; x++) o[(size_t)i * d + x] = acc[x] / l;
  }
}

template <typename F>
void sage_backward(const SageOptions& opt, int T, int d, const F* q, const F* k, const F* v,
                   const F* o, const F* dout, F* dq, F* dk, F* dv, AttentionInternals<F>* keep) {
  check_blocks(opt);
  const SagePrecision& prec = opt.precision;
  if (opt.softmax && (prec.dq == Precision::fp8 || prec.dk == Precision::fp8))
    throw std::invalid_argument(
        "attention.sage.precision.dq/dk = fp8 with a K-interval softmax: fp8's dS scale bounds "
        "the exact softmax's gradient only (§4.12)");
  const SageInputs<F> in(opt, T, d, q, k);
  const size_t TT = (size_t)T * T;

  // Row by row: S, P = exp(S - L) (or the K-interval p^), dP = dO V^T at
  // precision dp, dS = P o (dP - delta) (or the K-interval gradient). (T, T) each.
  std::vector<F> P(TT, F(0)), dS(TT, F(0));
  const auto do_dp = quantise_blocks(prec.dp, in.qblocks, dout, d);  // psi(dO_i) for dP
  const auto v_dp = quantise_blocks(prec.dp, in.kblocks, v, d);      // psi(V_j) for dP
  std::vector<F> s(T), dp(T), delta(T, F(0));  // delta: rowsum(dO o O), exact softmax only
  for (int i = 0; i < T; i++) {
    const int n = i + 1, qb = in.qblock_of(i);
    F* p = P.data() + (size_t)i * T;
    F* ds = dS.data() + (size_t)i * T;
    in.scores_row(i, s.data());
    for (int j = 0; j < n; j++) {
      const int kb = in.kblock_of(j);
      const Operand<F>& a = do_dp[qb];
      const Operand<F>& b = v_dp[kb];
      dp[j] = operand_dot(prec.dp, a.row(i - in.qblocks[qb].begin), 1,
                          b.row(j - in.kblocks[kb].begin), 1, d) * a.scale[0] * b.scale[0];
    }
    if (opt.softmax) {
      kinterval_probs(*opt.softmax, n, s.data(), p);
      kinterval_grad(*opt.softmax, n, s.data(), dp.data(), ds);
      continue;
    }
    const F m = *std::max_element(s.begin(), s.begin() + n);
    F l = 0;
    for (int j = 0; j < n; j++) l += std::exp(s[j] - m);
    const F L = m + std::log(l);  // the forward's saved log-sum-exp
    delta[i] = row_dot(dout + (size_t)i * d, o + (size_t)i * d, d);
    for (int j = 0; j < n; j++) {
      p[j] = std::exp(s[j] - L);
      ds[j] = p[j] * (dp[j] - delta[i]);
    }
  }

  // fp8's scales of dS, from bounds known before dS (§4.12): |dS_ij| <=
  // P_ij (|dP_ij| + |delta_i|) <= ||dO_i|| max_t ||V_t|| + |delta_i| per query row
  // (dQ), <= ||V_j|| max_t ||dO_t|| + max_t |delta_t| per key column (dK).
  std::vector<int> ds_row_exponent(T), ds_col_exponent(T);
  {
    std::vector<F> do_norm(T), v_norm(T);
    for (int t = 0; t < T; t++) {
      do_norm[t] = std::sqrt(row_dot(dout + (size_t)t * d, dout + (size_t)t * d, d));
      v_norm[t] = std::sqrt(row_dot(v + (size_t)t * d, v + (size_t)t * d, d));
    }
    const F do_max = max_abs(do_norm.data(), T), v_max = max_abs(v_norm.data(), T),
            delta_max = max_abs(delta.data(), T);
    for (int t = 0; t < T; t++) {
      ds_row_exponent[t] = fp8_exponent(do_norm[t] * v_max + std::abs(delta[t]));
      ds_col_exponent[t] = fp8_exponent(v_norm[t] * do_max + delta_max);
    }
  }

  // Tile by tile (query block i, key block j): the three int8 products whose
  // operands P and dS are quantised per tile row/column (rowcol) or per tile.
  const bool rowcol = opt.bwd_granularity == BwdGranularity::rowcol;
  const auto do_dv = quantise_blocks(prec.dv, in.qblocks, dout, d);               // psi(dO_i)
  const auto k_dq = quantise_blocks(prec.dq, in.kblocks, in.k_smooth.data(), d);  // psi(K_j)
  const auto q_dk = quantise_blocks(prec.dk, in.qblocks, in.q_scaled.data(), d);  // psi(c Q_i)
  // fp8: the head's exponents of dO, K - mu_K and c (Q - mu_Q), against which
  // each block's own is folded into P and dS (§4.12).
  const int do_top = fp8_exponent(max_abs(dout, (size_t)T * d));
  const int k_top = fp8_exponent(max_abs(in.k_smooth.data(), (size_t)T * d));
  const int q_top = fp8_exponent(max_abs(in.q_scaled.data(), (size_t)T * d));
  F fp8_peak = 0;
  const auto note = [&fp8_peak](const Operand<F>& x) { fp8_peak = std::max(fp8_peak, x.peak); };
  for (const auto* blocks : {&in.qhat, &in.khat, &do_dp, &v_dp, &do_dv, &k_dq, &q_dk})
    for (const Operand<F>& x : *blocks) note(x);
  std::fill(dq, dq + (size_t)T * d, F(0));
  std::fill(dk, dk + (size_t)T * d, F(0));
  std::fill(dv, dv + (size_t)T * d, F(0));
  for (size_t qb = 0; qb < in.qblocks.size(); qb++) {
    const Block bi = in.qblocks[qb];
    for (size_t kb = 0; kb < in.kblocks.size() && in.kblocks[kb].begin < bi.end; kb++) {
      const Block bj = in.kblocks[kb];
      const size_t tile = (size_t)bi.begin * T + bj.begin;  // top-left of (i, j) in P and dS
      const int R = bi.size(), C = bj.size();
      // dV_j += P^_ij^T dO^_i; at fp8 the tile's dO exponent folded into P.
      const Operand<F> phat =
          prec.dv == Precision::fp8
              ? quantise_fp8(ScaleGroup::whole, P.data() + tile, R, C, T,
                             {below_top(do_dv[qb], do_top) - 8})
              : quantise(prec.dv, rowcol ? ScaleGroup::per_col : ScaleGroup::whole,
                         P.data() + tile, R, C, T);
      note(phat);
      for (int cj = 0; cj < C; cj++)
        for (int x = 0; x < d; x++)
          dv[(size_t)(bj.begin + cj) * d + x] +=
              operand_dot(prec.dv, phat.row(0) + cj, C, do_dv[qb].row(0) + x, d, R) *
              phat.scale_of(0, cj) * do_dv[qb].scale[0];
      // dQ_i += c dS^_ij K^_j, dS with one scale per query row of the tile
      // (rowcol, and fp8 with the tile's K exponent folded in)
      std::vector<int> row_exponent(R);
      for (int ri = 0; ri < R; ri++)
        row_exponent[ri] = ds_row_exponent[bi.begin + ri] + below_top(k_dq[kb], k_top);
      const Operand<F> ds_q =
          prec.dq == Precision::fp8
              ? quantise_fp8(ScaleGroup::per_row, dS.data() + tile, R, C, T, row_exponent)
              : quantise(prec.dq, rowcol ? ScaleGroup::per_row : ScaleGroup::whole,
                         dS.data() + tile, R, C, T);
      note(ds_q);
      for (int ri = 0; ri < R; ri++)
        for (int x = 0; x < d; x++)
          dq[(size_t)(bi.begin + ri) * d + x] +=
              in.c * operand_dot(prec.dq, ds_q.row(ri), 1, k_dq[kb].row(0) + x, d, C) *
              ds_q.scale_of(ri, 0) * k_dq[kb].scale[0];
      // dK_j += dS^_ij^T Q^_i (Q^ carries c), dS with one scale per key column
      // (rowcol, and fp8 with the tile's Q exponent folded in)
      std::vector<int> col_exponent(C);
      for (int cj = 0; cj < C; cj++)
        col_exponent[cj] = ds_col_exponent[bj.begin + cj] + below_top(q_dk[qb], q_top);
      const Operand<F> ds_k =
          prec.dk == Precision::fp8
              ? quantise_fp8(ScaleGroup::per_col, dS.data() + tile, R, C, T, col_exponent)
              : quantise(prec.dk, rowcol ? ScaleGroup::per_col : ScaleGroup::whole,
                         dS.data() + tile, R, C, T);
      note(ds_k);
      for (int cj = 0; cj < C; cj++)
        for (int x = 0; x < d; x++)
          dk[(size_t)(bj.begin + cj) * d + x] +=
              operand_dot(prec.dk, ds_k.row(0) + cj, C, q_dk[qb].row(0) + x, d, R) *
              ds_k.scale_of(0, cj) * q_dk[qb].scale[0];
      // smooth_q: dK_j gains c (dS_ij^T 1) mu_Qi^T, in fp32 from the unquantised dS.
      if (opt.smooth_q)
        for (int cj = 0; cj < C; cj++) {
          F colsum = 0;
          for (int ri = 0; ri < R; ri++) colsum += dS[tile + (size_t)ri * T + cj];
          for (int x = 0; x < d; x++)
            dk[(size_t)(bj.begin + cj) * d + x] += in.c * colsum * in.q_mean[qb * d + x];
        }
    }
  }
  if (keep) {
    keep->p = std::move(P);
    keep->ds = std::move(dS);
    keep->fp8_peak = fp8_peak;
  }
}

#define QATTN_INSTANTIATE(F)                                                                    \
  template void sage_forward<F>(const SageOptions&, int, int, const F*, const F*, const F*, F*); \
  template void sage_backward<F>(const SageOptions&, int, int, const F*, const F*, const F*,     \
                                 const F*, const F*, F*, F*, F*, AttentionInternals<F>*);
QATTN_INSTANTIATE(float)
QATTN_INSTANTIATE(double)
#undef QATTN_INSTANTIATE

}  // namespace qattn::cpu
