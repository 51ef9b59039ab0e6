// The softmax policies of the SageBwd kernels (sage.cu): what turns a tile of
// scores S (already carrying c = 1/√d: Q̂ = ψ(c·Q)) into weights, what the
// forward saves per row, and what the backward makes of S and dP.
//   ExactSoftmax      plain SageBwd (docs/attention-maths.md §4): online softmax, saves L.
//   KIntervalSoftmax  the composition with the K-interval quantised softmax
//                     (§6, sage's softmax block): the forward calibrates
//                     each row's grid in a first pass over the keys, saves its
//                     RowStats; the backward's dQ kernel first sweeps each row
//                     for its terms (ḡ, dL/dm, dL/dℓ; L for the probability
//                     STE), so that dS is complete, calibration terms routed to
//                     the argmax / argmin entries included, before it is
//                     quantised for the dQ and dK products.
//
// A thread holds two rows (g, g + 8) of a warp's 16-row tile and two columns
// per 8-column accumulator tile (tile_mma.cuh layouts, lane = 4g + t).
#pragma once
#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>
#include <type_traits>

#include "attention/common/online_softmax.cuh"
#include "attention/common/tile_mma.cuh"
#include "attention/kinterval/kinterval_softmax.cuh"
#include "attention/sage/int8_operands.cuh"  // the int32 sums' conversions

namespace qattn::cuda::sage {

using flash::fast_exp2;
using flash::kLog2e;
using flash::log_sum_exp;
using flash::row_sum4;
using flash::with_mask;

// Row (within the warp's 16) and column of accumulator element (nt, e) of a
// 16x8 tile nt, as tile_mma.cuh lays them out (lane = 4g + t: rows g, g + 8).
__device__ __forceinline__ int frag_row(int e) { return (threadIdx.x % 32) / 4 + (e / 2) * 8; }
__device__ __forceinline__ int frag_col(int nt, int e) {
  return nt * 8 + 2 * (threadIdx.x % 4) + e % 2;
}

// The scores s (16 rows, the keys k0 .. k0 + 8 kNTiles − 1) of a warp plus
// smooth_q's bias of each key (bias null: none), in every kernel that makes S;
// `unit` is one unit of S in units of s (1, or as HopperScores has it).
template <int kNTiles>
__device__ __forceinline__ void add_key_bias(float (&s)[1][kNTiles][4], const float* bias, int k0,
                                             float unit = 1.0f) {
  if (!bias) return;
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[0][nt][e] = fmaf(bias[k0 + frag_col(nt, e)], unit, s[0][nt][e]);
}
// The same bias in the dK/dV kernels' transposed tiles, whose rows are the
// keys: the warp's 16 keys from bias[0] (its first key's). The caller checks
// that there is one: with the null test in here the wgmma backward measured
// 1.758 vs 1.742-1.751 ms at (4, 16, 4096, 128), 2.379 vs 2.351 with smooth_q
// (`qattn bench attention --kind sage`; ptxas had moved its spills).
template <int kNTiles>
__device__ __forceinline__ void add_row_key_bias(float (&s)[1][kNTiles][4], const float* bias,
                                                 float unit = 1.0f) {
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[0][nt][e] = fmaf(bias[frag_row(e)], unit, s[0][nt][e]);
}
// The scores as both families' forward hands them to the policies: biased, and
// keys after the row's query (rows from first_query) −inf (causal).
template <int kNTiles>
__device__ __forceinline__ void bias_and_mask(float (&s)[1][kNTiles][4], const float* bias, int k0,
                                              int first_query, float unit = 1.0f) {
  add_key_bias(s, bias, k0, unit);
  if (k0 + 8 * kNTiles > first_query) {  // some key past the warp's first row
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (k0 + frag_col(nt, e) > first_query + frag_row(e)) s[0][nt][e] = -INFINITY;
  }
}

// The softmax block's options as the kernels use them (unused by ExactSoftmax).
struct SoftmaxOptions {
  kinterval::GridOptions grid;
  kinterval::Rule rule;
  float window;  // fwm's W in nats
  bool fwm;
  bool mask_window;  // weight STE: entries below the fwm window get dS = 0
  bool detach;       // no derivative through m and ℓ
};

// ---------------------------------------------------------------------------
// Plain SageBwd: the online softmax of online_softmax.cuh; backward P = exp(S − L),
// dS = P (dP − δ) with the pre-pass's δ = rowsum(dO ∘ O).
//
// The Hopper kernels hand it rescaled scores (HopperScores), and its forward
// there takes ψ's amax of P̃ from the row's max and rescales O only when a
// row's max has grown (update_rescaling_rarely).
struct ExactSoftmax : flash::OnlineSoftmax<1> {
  static constexpr bool kCalibrates = false;  // the forward is one online pass
  static constexpr bool kRowPass = false;     // the backward's row terms come from the pre-pass
  static constexpr bool kExact = true;        // P's exponent is linear in S (HopperScores)
  static constexpr int kStatFloats = 1;       // saved per row: L
  static constexpr int kTermFloats = 1;       // backward per row: δ
  struct Row {
    float lse, delta;
  };

  // scale_log2: log2(e) for scores S, 1 for scores S·log2(e).
  __device__ explicit ExactSoftmax(const SoftmaxOptions&, float scale_log2 = kLog2e)
      : OnlineSoftmax<1>(scale_log2) {}

  // The forward's key block as update() takes it (masked scores −inf): s
  // becomes P̃ = exp(S − m) and p_max = max P̃ of the block per row (ψ's amax:
  // the P̃ of the row's largest score). The reference m moves to the running
  // max, rescaling l and O, only when some row of the warp would otherwise see
  // a P̃ above 2^8 (FlashAttention-4's conditional rescale): ψ's per-row scale
  // makes P̂ the same for any m, and l, O and L = m + log l share it, so a stale
  // m changes rounding only, and most blocks skip the rescale of O.
  // kMaxGrowthLog2 = 0 keeps m the running max itself (P̃ <= 1), rescaling O
  // only on blocks where some row of the warp has a new max: the fp8 forward,
  // whose P̂ is P̃ on a fixed scale.
  template <int kMaxGrowthLog2 = 8, int kNTiles, int kDTiles>
  __device__ __forceinline__ void update_rescaling_rarely(float (&s)[1][kNTiles][4],
                                                          float (&o)[1][kDTiles][4],
                                                          float (&p_max)[2]) {
    update_reference_rarely<kMaxGrowthLog2>(
        s, [&](int half, float correction) { scale_outputs(0, half, correction, o); },
        [&](int half, float top) {
          p_max[half] = fast_exp2(fmaf(top, scale_log2, -exponent_base(row_max[0][half])));
        });
  }
  // The same for a forward whose O is still being summed into (the previous
  // block's P̂ V̂ in flight, sage_forward_sm90.cuh): m, l and s as above, and
  // O's rescale left to the caller, once O has landed. Returns whether it is
  // due (the same on every lane of the warp), by `correction` per row
  // (scale_outputs). No ψ amax: the fp8 P̂ takes P̃ on a fixed scale.
  template <int kMaxGrowthLog2 = 8, int kNTiles>
  __device__ __forceinline__ bool update_deferring_rescale(float (&s)[1][kNTiles][4],
                                                           float (&correction)[2]) {
    bool rescale = false;
    update_reference_rarely<kMaxGrowthLog2>(
        s,
        [&](int half, float factor) {
          correction[half] = factor;
          rescale = true;
        },
        [](int, float) {});
    return rescale;
  }

 private:
  // Both updates' steps but O's rescale: where some row of the warp would
  // see a P̃ above 2^kMaxGrowthLog2, m moves to the running max for both rows,
  // l is rescaled and rescale(half, factor) gets O's factor of each row; then
  // each row of s becomes P̃, and exponentiated(half, top) follows it with the
  // row's largest score of the block.
  template <int kMaxGrowthLog2, int kNTiles, class Rescale, class Exponentiated>
  __device__ __forceinline__ void update_reference_rarely(float (&s)[1][kNTiles][4],
                                                          Rescale&& rescale,
                                                          Exponentiated&& exponentiated) {
    float top[2];  // the block's largest score per row
    bool grows = false;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      top[half] = block_max(s, 0, half);
      grows = grows || (top[half] - row_max[0][half]) * scale_log2 > float(kMaxGrowthLog2);
    }
    if (__any_sync(0xffffffffu, grows))
#pragma unroll
      for (int half = 0; half < 2; ++half)
        rescale(half, move_reference(0, half, fmaxf(row_max[0][half], top[half])));
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      exponentiate(0, half, s);
      exponentiated(half, top[half]);
    }
  }

 public:
  // After finalize: L of rows [row0, row0 + 16) of the warp into stats (T).
  __device__ void store(float* stats, int row0, int rows_valid) const {
    store_lse(stats, row0, rows_valid);
  }

  // A row's values; null reads as 0.
  __device__ static Row load_row(const float* stats, const float* terms) {
    return {stats ? *stats : 0.0f, terms ? *terms : 0.0f};
  }
  // The weight of one visible entry for dV (and the start of dS).
  __device__ float probability(const Row& r, float score) const {
    return OnlineSoftmax<1>::probability(score, r.lse, scale_log2);
  }
  // dS of one visible entry, given its probability p.
  __device__ float grad(const Row& r, float /*score*/, float p, float dp, int /*key*/) const {
    return grad_score(p, dp, r.delta);
  }
};

// ---------------------------------------------------------------------------
// K-interval weights over sage's scores. The grid maths is kinterval_softmax.cuh's
// with c = 1 (the scores carry c already): RowStats in units of S.
struct KIntervalSoftmax {
  static constexpr bool kCalibrates = true;  // forward pass 1: each row's max and min
  static constexpr bool kRowPass = true;     // backward: the dQ kernel sweeps the row terms first
  static constexpr bool kExact = false;      // its grid is in units of S
  static constexpr int kStatFloats = kinterval::kRowStats;
  static constexpr int kTermFloats = 4;
  // Backward per row: the grid, and the terms of the row sweep.
  struct Row {
    kinterval::RowStats st;
    float4 terms;  // ḡ, dL/dm, dL/dℓ (0 when detached), L of the exact softmax (probability STE)
  };
  // The row sweep's sums over this thread's columns of one row (g_j = dP_j):
  // a0 = Σ e_j, a1 = Σ e_j g_j with e = ŵ (for ḡ) or exp(S − m) (probability STE);
  // m0 = Σ f_j, m1 = Σ f_j g_j with f_j = ∂ŵ_j/∂m as the rule has it (l0, l1: ∂/∂ℓ).
  // dL/dm = Σ f_j (g_j − ḡ)/Ẑ is linear in ḡ, so one sweep gives ḡ and both terms.
  struct RowSums {
    float a0 = 0.0f, a1 = 0.0f, m0 = 0.0f, m1 = 0.0f, l0 = 0.0f, l1 = 0.0f;
  };

  SoftmaxOptions opt;
  // Forward state of the thread's two rows.
  kinterval::Extremum hi[2], lo[2];
  kinterval::RowStats st[2];
  float z[2];  // Ẑ over this thread's columns

  __device__ explicit KIntervalSoftmax(const SoftmaxOptions& o) : opt(o) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      hi[half] = {-INFINITY, 0};
      lo[half] = {INFINITY, 0};
      z[half] = 0.0f;
    }
  }

  // ŵ of a visible score.
  __device__ float weight(const kinterval::RowStats& r, float score) const {
    const float u = kinterval::grid_coord(r, score, opt.grid);
    return opt.rule == kinterval::Rule::lerp
               ? kinterval::quantised_weight<Rounding::lerp>(u, r, opt.grid)
               : kinterval::quantised_weight<Rounding::nearest>(u, r, opt.grid);
  }

  // Forward pass 1, one key block from key k0: the rows' max and min with their
  // lowest indices. Masked entries are −inf. A thread meets its keys in
  // increasing order, so strict comparisons keep the lowest index.
  template <int kNTiles>
  __device__ void observe(const float (&s)[1][kNTiles][4], int k0) {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float v = s[0][nt][e];
        if (v == -INFINITY) continue;
        const int key = k0 + frag_col(nt, e);
        if (v > hi[e / 2].value) hi[e / 2] = {v, key};
        if (v < lo[e / 2].value) lo[e / 2] = {v, key};
      }
  }
  // After pass 1: each row's grid.
  __device__ void calibrate() {
#pragma unroll
    for (int half = 0; half < 2; ++half)
      st[half] = kinterval::make_row_stats(kinterval::row_extremum4<true>(hi[half]),
                                           kinterval::row_extremum4<false>(lo[half]), 1.0f,
                                           opt.grid, opt.fwm, opt.window);
  }
  // Pass 2, one key block: scores (masked −inf) become ŵ (masked 0), summed into Ẑ.
  // The weights are relative to the row's final max: nothing to rescale.
  template <int kNTiles, int kDTiles>
  __device__ void update(float (&s)[1][kNTiles][4], float (&)[1][kDTiles][4]) {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float v = s[0][nt][e];
        s[0][nt][e] = v == -INFINITY ? 0.0f : weight(st[e / 2], v);
        z[e / 2] += s[0][nt][e];
      }
  }
  // O = O / Ẑ after the last key block (Ẑ >= 1: the max has ŵ = 1).
  template <int kDTiles>
  __device__ void finalize(float (&o)[1][kDTiles][4]) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      st[half].inv_z = 1.0f / row_sum4(z[half]);
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        o[0][dt][2 * half] *= st[half].inv_z;
        o[0][dt][2 * half + 1] *= st[half].inv_z;
      }
    }
  }
  // The RowStats of rows [row0, row0 + 16) of the warp into stats (T, kStatFloats).
  __device__ void store(float* stats, int row0, int rows_valid) const {
    if (threadIdx.x % 4 != 0) return;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + frag_row(2 * half);
      if (row < rows_valid) reinterpret_cast<kinterval::RowStats*>(stats)[row] = st[half];
    }
  }

  // A row's values; null reads as 0.
  __device__ static Row load_row(const float* stats, const float* terms) {
    Row r{};
    if (stats) r.st = *reinterpret_cast<const kinterval::RowStats*>(stats);
    if (terms) r.terms = *reinterpret_cast<const float4*>(terms);
    return r;
  }

  // Backward row sweep, one visible entry.
  __device__ void accumulate(RowSums& a, const kinterval::RowStats& r, float score,
                             float dp) const {
    if (opt.rule ==
        kinterval::Rule::prob_ste) {  // exact p ∝ exp(S − m): ḡ and L of the exact softmax
      const float e = kinterval::unquantised_weight(r, score, kLog2e);
      a.a0 += e;
      a.a1 += e * dp;
      return;
    }
    const float u = kinterval::grid_coord(r, score, opt.grid);
    a.a1 += weight(r, score) * dp;            // Σ ŵ g; ḡ = that / Ẑ
    if (opt.rule == kinterval::Rule::lerp) {  // the derivative per unit h: lerp_grad is linear in h
      const kinterval::LerpGrad f = kinterval::lerp_grad(u, 1.0f, r, r.u_scale, opt.grid, opt.fwm);
      a.m0 += f.dm, a.m1 += f.dm * dp;
      a.l0 += f.dl, a.l1 += f.dl * dp;
    } else {  // weight STE: ∂L/∂m = −Σ w_j h_j, w = exp(S − m)
      const float w =
          opt.mask_window && u < 0.0f ? 0.0f : kinterval::unquantised_weight(r, score, kLog2e);
      a.m0 -= w, a.m1 -= w * dp;
    }
  }
  // The row's terms from the sums of its four threads (every thread of the row
  // calls it and gets the same terms).
  __device__ float4 row_terms(RowSums a, const kinterval::RowStats& r) const {
    a.a0 = row_sum4(a.a0), a.a1 = row_sum4(a.a1);
    a.m0 = row_sum4(a.m0), a.m1 = row_sum4(a.m1);
    a.l0 = row_sum4(a.l0), a.l1 = row_sum4(a.l1);
    if (opt.rule == kinterval::Rule::prob_ste)  // L = m + log Σ exp(S − m); no path through m, ℓ
      return make_float4(a.a1 / a.a0, 0.0f, 0.0f, log_sum_exp(r.w_base, a.a0));
    const float gbar = a.a1 * r.inv_z;
    // A flat lerp row has constant weights: nothing flows through m or ℓ.
    if (opt.detach || (opt.rule == kinterval::Rule::lerp && r.u_scale == 0.0f))
      return make_float4(gbar, 0.0f, 0.0f, 0.0f);
    return make_float4(gbar, r.inv_z * (a.m1 - gbar * a.m0), r.inv_z * (a.l1 - gbar * a.l0), 0.0f);
  }

  // The dQ kernels' row sweep over one key block (keys k0 .., the warp's 16 rows
  // from first_row): the sums of the visible entries.
  template <int kNTiles>
  __device__ void sweep(RowSums (&sums)[2], const float (&score)[1][kNTiles][4],
                        const float (&dp)[1][kNTiles][4], const Row (&rows)[2], int k0,
                        int first_row, int T) const {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + frag_col(nt, e), row = first_row + frag_row(e);
        if (row < T && key <= row)
          accumulate(sums[e / 2], rows[e / 2].st, score[0][nt][e], dp[0][nt][e]);
      }
  }
  // After the sweep: each row's terms into rows and into terms (Tp, 4) of the
  // head, for the dK/dV kernel (rows past T: zeros).
  __device__ void make_terms(Row (&rows)[2], const RowSums (&sums)[2], float* terms, int first_row,
                             int T, int Tp) const {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = first_row + frag_row(2 * half);
      const float4 made = row_terms(sums[half], rows[half].st);  // every lane: it shuffles
      rows[half].terms = row < T ? made : float4{};
      if (threadIdx.x % 4 == 0 && row < Tp)
        reinterpret_cast<float4*>(terms)[row] = rows[half].terms;
    }
  }

  // p̂ of one visible entry, for dV.
  __device__ float probability(const Row& r, float score) const {
    return weight(r.st, score) * r.st.inv_z;
  }
  // dS of one visible entry (key = its key index): the rule's direct part plus
  // the calibration terms where the key is the row's argmax / argmin.
  __device__ float grad(const Row& r, float score, float /*p̂*/, float dp, int key) const {
    const float gbar = r.terms.x;
    float ds;
    if (opt.rule == kinterval::Rule::prob_ste) {
      ds = fast_exp2(fmaf(score, kLog2e, -r.terms.w * kLog2e)) * (dp - gbar);
    } else {
      const float u = kinterval::grid_coord(r.st, score, opt.grid), h = (dp - gbar) * r.st.inv_z;
      if (opt.rule == kinterval::Rule::lerp)
        ds = kinterval::lerp_grad(u, h, r.st, r.st.u_scale, opt.grid, opt.fwm).ds;
      else
        ds = opt.mask_window && u < 0.0f ? 0.0f
                                         : kinterval::unquantised_weight(r.st, score, kLog2e) * h;
    }
    if (key == r.st.argmax) ds += r.terms.y;
    if (key == r.st.argmin) ds += r.terms.z;
    return ds;
  }
};

// ---------------------------------------------------------------------------
// What both families' dQ kernels do per warp (16 query rows from first_row).

// The saved statistics (stats: (T, kStatFloats) of the head) and row terms
// (terms: (Tp, kTermFloats)) of the thread's two rows; rows past T read none
// (every entry of theirs is masked). A policy with a row sweep makes its terms
// in the kernel: none are read.
template <class Softmax>
__device__ __forceinline__ void load_rows(typename Softmax::Row (&rows)[2], const float* stats,
                                          const float* terms, int first_row, int T) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = first_row + frag_row(2 * half);
    const bool real = row < T;
    const float* row_terms = terms + static_cast<size_t>(row) * Softmax::kTermFloats;
    rows[half] =
        Softmax::load_row(real ? stats + static_cast<size_t>(row) * Softmax::kStatFloats : nullptr,
                          Softmax::kRowPass || !real ? nullptr : row_terms);
  }
}

// w = dS of the warp's scores and dP (16 rows, keys k0 ..), masked entries 0.
template <class Softmax, int kNTiles>
__device__ __forceinline__ void score_grads(float (&w)[1][kNTiles][4],
                                            const float (&score)[1][kNTiles][4],
                                            const float (&dp)[1][kNTiles][4],
                                            const Softmax& softmax,
                                            const typename Softmax::Row (&rows)[2], int k0,
                                            int first_row, int T) {
  // The block's last key is before the warp's first row, and every row is real.
  const bool all_visible = k0 + 8 * kNTiles - 1 <= first_row && first_row + 16 <= T;
  with_mask(all_visible, [&](auto unmasked) {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + frag_col(nt, e), row = first_row + frag_row(e);
        const typename Softmax::Row& r = rows[e / 2];
        w[0][nt][e] = unmasked || (row < T && key <= row)
                          ? softmax.grad(r, score[0][nt][e],
                                         softmax.probability(r, score[0][nt][e]), dp[0][nt][e], key)
                          : 0.0f;
      }
  });
}

// How the Hopper kernels turn the sums of S = Q̂ K̂ᵀ at `scale` = s_Q s_K
// (int32 at qk = int8, fp32 at fp8) into a policy's scores. ExactSoftmax's exponent is linear in S,
// so it takes rescaled scores, one FMUL or FADD per score fewer:
//   forward   S·log2(e), the policy at scale_log2 = 1 (its online max runs
//             over key blocks of different scales: the scores share units);
//   backward  the sums themselves, and per tile the policy at scale_log2 =
//             scale·log2(e): P = exp2(Σ·a − L log2(e)) in one FFMA.
// The K-interval policy, whose grid is in units of S, takes S in both.
// `unit` is one unit of S in the scores' units (smooth_q's bias, add_key_bias).
// Below the smallest normal float (s_Q s_K < 2^-126: c·Q and K both near
// 1e-19) the reciprocal would be inf (the hardware reciprocal flushes its input
// to 0, and 1/s overflows below 2^-128), and inf times the bias NaN. The unit
// is 2^126 there, so the bias moves the exponent by bias · 2^126 · scale ·
// log2(e) <= bias · log2(e) instead of by bias · log2(e): both below 1e-31,
// which fp32 cannot see (the block's bf16 Q values are all equal, and s_Q = 1,
// or they differ by an ulp, so max|Q − μ_Q| >= 2^-9 |μ_Q| and the bias
// c·μ_Q·(K − μ_K) is below 2^9 · 127² · s_Q s_K).
template <class Softmax>
struct HopperScores {
  __device__ static Softmax forward_policy(const SoftmaxOptions& opt) {
    if constexpr (Softmax::kExact)
      return Softmax(opt, 1.0f);
    else
      return Softmax(opt);
  }
  static constexpr float kForwardUnit = Softmax::kExact ? kLog2e : 1.0f;
  template <int kTerms, int kNTiles, class Sum>
  __device__ static void forward(float (&s)[1][kNTiles][4], const Sum (&sum)[kNTiles][4],
                                 float scale) {
    flash::sums_to_scores<kTerms>(s, sum, Softmax::kExact ? scale * kLog2e : scale);
  }

  __device__ static Softmax backward_policy(const Softmax& policy, float scale) {
    if constexpr (Softmax::kExact)
      return Softmax(SoftmaxOptions{}, scale * kLog2e);
    else
      return policy;
  }
  __device__ static float backward_unit(float scale) {
    if constexpr (Softmax::kExact)
      return flash::fast_rcp(fmaxf(scale, FLT_MIN));
    else
      return 1.0f;
  }
  template <int kTerms, int kNTiles, class Sum>
  __device__ static void backward(float (&s)[1][kNTiles][4], const Sum (&sum)[kNTiles][4],
                                  float scale) {
    flash::sums_to_scores<kTerms>(s, sum, Softmax::kExact ? 1.0f : scale);
  }
};

}  // namespace qattn::cuda::sage
