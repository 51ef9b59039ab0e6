// The K-interval quantised softmax (docs/attention-maths.md §5) one score at a time, for the
// kernels of kinterval.cu. Everything works on raw scores r = q·k (the
// kernels' fp32 accumulators, before the factor c = 1/√d), with per-row
// constants fixed by the forward's first pass and saved in RowStats:
//
//   u   = clamp(r · u_scale + u_offset, u_floor, K)   grid coordinate, u_offset = −g0 · u_scale
//   v_a = 2^((a − K) · step) = exp(−(K − a) Δ)          grid values, v_K = 1
//   nearest: ŵ = v_{round(u)};  lerp: ŵ = v_a + t (v_{a+1} − v_a),
//   a = min(floor(u), K − 1), t = u − a;  u < 0 (below the fwm window): ŵ = 0.
//
// A flat minmax row (m − ℓ < 1e-6) has u_scale = 0 and step = 0, so every
// grid value is 1 and every weight is 1, as §5.2 asks.
//
// Cost per score (the kernels are bound by instructions per score, not by
// the products): u is one FMA and a clamp; a grid value is one FMA and one
// ex2; lerp's v_{a+1} − v_a = v_a (e^Δ − 1) is one multiply more; nearest rounds with three adds
// and lerp floors with two (no conversion-pipe instruction beside the ex2).
#pragma once
#include <cuda_runtime.h>

#include <cmath>

#include "attention/common/online_softmax.cuh"
#include "qattn/attention.hpp"

namespace qattn::cuda::kinterval {

using flash::fast_exp2;

// What the backward's dS follows (§5.7-§5.9): lerp's exact derivative, or for
// nearest rounding the weight STE or the probability STE.
enum class Rule { lerp, weight_ste, prob_ste };

inline Rule rule_of(const KIntervalOptions& opt) {
  if (opt.rounding == Rounding::lerp) return Rule::lerp;
  return opt.ste == Ste::weight ? Rule::weight_ste : Rule::prob_ste;
}

// The largest grid spacing Δ (nats) the grid values are computed with
// (docs/attention-maths.md §5.11). Past it every grid value below v_K is under
// e^−32 ≈ 1.3e-14 either way, so a weight moves by at most that, while the top
// cell's v_{K−1} = e^−32 stays a normal float beside 1/Ẑ and ρ = e^32 − 1 stays
// finite (both fail near Δ = 87: ex2 flushes below 2^−126, expm1f overflows at 88.7).
constexpr float kMaxGridDelta = 32.0f;

// Saved by the forward for each (b, h, row): 8 fp32 laid out (B, H, T, 8) as
// this struct (the two indices are int bits), at the start of the kind's saved
// state (the probability STE adds the exact softmax's output and L after them).
struct alignas(16) RowStats {
  float u_offset;  // −g0 · u_scale, g0 the raw score of the grid's first point (minmax: ℓ / c;
                   // fwm: (m − W) / c): u = r · u_scale + u_offset, one FMA
  float u_scale;   // c / Δ; 0 for a flat row
  float step;      // min(Δ, kMaxGridDelta) · log2(e); 0 for a flat row
  float rho;       // v_{a+1} / v_a − 1 = e^step' − 1, step' = min(Δ, kMaxGridDelta) (expm1:
                   // exact for a small Δ)
  float w_base;    // raw max · c · log2(e): the base of exp(s − m) (unquantised_weight)
  float inv_z;     // 1 / Σ_j ŵ_j (Σ ≥ 1: the max has ŵ = 1)
  int argmax;      // visible key with the largest score, the lowest index on ties
  int argmin;      // likewise the smallest
};
constexpr int kRowStats = sizeof(RowStats) / sizeof(float);
static_assert(kRowStats == 8);

// exp(s − m), the unquantised softmax weight of a raw score (the weight STE's
// w, the probability STE's exact softmax). scale_log2 = c log2(e); log2(e)
// where the score carries c already (the sage composition).
__device__ __forceinline__ float unquantised_weight(const RowStats& r, float raw,
                                                    float scale_log2) {
  return fast_exp2(fmaf(raw, scale_log2, -r.w_base));
}

// The grid's options as the kernels use them.
struct GridOptions {
  float K;        // intervals
  float inv_K;    // 1 / K (no division per score)
  float u_floor;  // minmax: 0 (u never leaves the grid); fwm: −inf (u < 0 is below the window)
};

// u before the clamp: (r − g0) · u_scale as one FMA (u_offset = −g0 · u_scale is
// saved with the row). The kernels clamp only where they must: a visible score is at
// most the max (u <= K up to rounding), which nearest rounding takes as is and
// lerp's a = min(floor(u), K − 1) absorbs; lerp clamps u at 0 (the argmin's u may
// come out a hair below); u < 0 (below the fwm window) is tested as such.
__device__ __forceinline__ float grid_position(const RowStats& r, float raw) {
  return fmaf(raw, r.u_scale, r.u_offset);
}

__device__ __forceinline__ float grid_coord(const RowStats& r, float raw, const GridOptions& g) {
  return fminf(fmaxf(grid_position(r, raw), g.u_floor), g.K);
}

// floor(u + 1/2) (§5.4: ties go up) for |u| < 2^22 with three full-rate adds
// (floorf would cost a conversion-pipe instruction): u + 1/2 rounded down keeps
// its floor, and adding 1.5 · 2^23 rounded down leaves no fraction bits, so it
// floors. Ties matter: the sage composition's scores are integers times one
// scale, so u lands exactly on a half now and then. −inf stays −inf.
__device__ __forceinline__ float nearest_point(float u) {
  constexpr float kRound = 12582912.0f;  // 1.5 · 2^23
  return __fsub_rn(__fadd_rd(__fadd_rd(u, 0.5f), kRound), kRound);
}

__device__ __forceinline__ float grid_value(float a, const RowStats& r, const GridOptions& g) {
  return fast_exp2(fmaf(a, r.step, -g.K * r.step));  // K·step is common to the row's scores
}

// floor(u) for 0 <= u < 2^23 with two full-rate adds: u + 2^23 rounded down has
// no fraction bits. floorf is a conversion-pipe instruction, which runs at a
// quarter of the rate and shares its pipe with ex2, the one MUFU op per score.
// Larger u (future keys, hidden afterwards) come out >= K − 1 and are clamped.
__device__ __forceinline__ float floor_nonnegative(float u) {
  constexpr float kTwo23 = 8388608.0f;
  return __fsub_rn(__fadd_rd(u, kTwo23), kTwo23);
}

// The lerp cell of u >= 0: a and t.
__device__ __forceinline__ void lerp_cell(float u, float K, float& a, float& t) {
  a = fminf(floor_nonnegative(u), K - 1.0f);
  t = u - a;
}

// The lerp cell of u >= 0 with its two grid values: ŵ = va + t dv, dŵ/du = dv.
struct LerpPoint {
  float a, t;
  float va;  // v_a
  float dv;  // v_{a+1} − v_a = v_a ρ
  __device__ __forceinline__ float weight() const { return fmaf(t, dv, va); }
};
__device__ __forceinline__ LerpPoint lerp_point(float u, const RowStats& r, const GridOptions& g) {
  LerpPoint c;
  lerp_cell(u, g.K, c.a, c.t);
  c.va = grid_value(c.a, r, g);
  c.dv = c.va * r.rho;
  return c;
}

// ŵ at a coordinate u on the grid, 0 <= u <= K (nearest: also the unclamped grid_position
// of a visible score).
template <Rounding kRounding>
__device__ __forceinline__ float grid_weight(float u, const RowStats& r, const GridOptions& g) {
  if constexpr (kRounding == Rounding::nearest) {
    return grid_value(nearest_point(u), r, g);
  } else {
    return lerp_point(u, r, g).weight();
  }
}

// ŵ at coordinate u (u < 0: below the fwm window). The grid weight is computed
// for every u and then selected (no branch per score; a NaN it gives for u = −inf
// is not selected).
template <Rounding kRounding>
__device__ __forceinline__ float quantised_weight(float u, const RowStats& r,
                                                  const GridOptions& g) {
  const float w = grid_weight<kRounding>(u, r, g);
  return u < 0.0f ? 0.0f : w;
}

// Lerp's derivative constants of a row, given 1/Δ: with v_{a+1} − v_a = v_a ρ,
// an entry's direct part is ds = h dv / Δ = h v_a λ.
struct LerpSlopes {
  float rho;     // e^Δ − 1
  float lambda;  // ρ / Δ
  float kappa;   // λ − 1
};
__device__ __forceinline__ LerpSlopes lerp_slopes(const RowStats& r, float inv_delta) {
  const float lambda = r.rho * inv_delta;
  return {r.rho, lambda, lambda - 1.0f};
}

// Lerp's derivative through m at one entry of the minmax grid. With C = m − ℓ = KΔ,
// u = K (s − ℓ) / C gives ∂u/∂m = −u / C, and v_a = exp(−(K − a) C / K) gives
// ∂ŵ/∂C = −((1 − t)(K − a) v_a + t (K − a − 1) v_{a+1}) / K, so
//   ∂ŵ/∂m = −(u/C) dv + ∂ŵ/∂C = −v_a (u κ + K + (K − 1 − a) t ρ) / K
// (v_{a+1} = v_a (1 + ρ), κ = λ − 1 ≥ 0). Returned is the bracket, a sum of
// non-negative terms: no part of it cancels, so its rounding stays relative to
// the entry's own ∂ŵ/∂m at any Δ. (Splitting ∂ŵ/∂C into −ŵ plus the rest
// instead cancels a term of size ŵ to leave one of size ŵ/Δ in the top cell.)
__device__ __forceinline__ float lerp_m_bracket(float a, float t, float u, const LerpSlopes& s,
                                                float K) {
  return fmaf((K - 1.0f - a) * t, s.rho, fmaf(u, s.kappa, K));
}

// Lerp's exact derivative at one entry, given h = dL/dŵ_j = (g_j − ḡ) / Ẑ:
// ds, the direct part dL/ds_j, and the entry's share of dL/dm and dL/dℓ (§5.7;
// fwm has no ℓ and its grid values do not depend on m). inv_delta = 1/Δ.
struct LerpGrad {
  float ds, dm, dl;
};
__device__ __forceinline__ LerpGrad lerp_grad(float u, float h, const RowStats& r, float inv_delta,
                                              const GridOptions& g, bool fwm) {
  if (u < 0.0f) return {0.0f, 0.0f, 0.0f};  // below the fwm window: ŵ is the constant 0
  const LerpPoint c = lerp_point(u, r, g);
  const LerpSlopes slopes = lerp_slopes(r, inv_delta);
  const float hv = h * c.va;
  const float ds = hv * slopes.lambda;
  if (fwm) return {ds, -ds, 0.0f};
  const float dm = -g.inv_K * hv * lerp_m_bracket(c.a, c.t, u, slopes, g.K);
  return {ds, dm, -ds - dm};
}

// Row max and min with their indices, ties to the lowest index.
struct Extremum {
  float value;
  int index;
};
__device__ __forceinline__ bool above(float v, int i, const Extremum& e) {
  return v > e.value || (v == e.value && i < e.index);
}
__device__ __forceinline__ bool below(float v, int i, const Extremum& e) {
  return v < e.value || (v == e.value && i < e.index);
}
// Combines the four threads that share a row.
template <bool kMax>
__device__ __forceinline__ Extremum row_extremum4(Extremum e) {
#pragma unroll
  for (int offset = 1; offset <= 2; offset *= 2) {
    const float v = __shfl_xor_sync(0xffffffffu, e.value, offset);
    const int i = __shfl_xor_sync(0xffffffffu, e.index, offset);
    if (kMax ? above(v, i, e) : below(v, i, e)) e = {v, i};
  }
  return e;
}

// The row's grid from its raw max and min (§5.2 calibration); inv_z is set
// by the forward's second pass. scale = c.
__device__ __forceinline__ RowStats make_row_stats(const Extremum& hi, const Extremum& lo,
                                                   float scale, const GridOptions& g, bool fwm,
                                                   float window) {
  RowStats r;
  r.argmax = hi.index;
  r.argmin = lo.index;
  r.w_base = hi.value * scale * flash::kLog2e;
  r.inv_z = 0.0f;
  float delta, g0;
  if (fwm) {
    delta = window / g.K;
    g0 = hi.value - window / scale;
    r.u_scale = scale / delta;
  } else {
    g0 = lo.value;
    const float range = scale * (hi.value - lo.value);  // C = m − ℓ
    if (range < 1e-6f) {  // flat: every grid value, hence every weight, is 1
      r.u_scale = r.u_offset = 0.0f;
      r.step = 0.0f;
      r.rho = 0.0f;
      return r;
    }
    delta = range / g.K;
    r.u_scale = g.K / (hi.value - lo.value);
  }
  r.u_offset = -g0 * r.u_scale;
  // The grid values take Δ capped at kMaxGridDelta (u keeps the true Δ): uncapped,
  // past Δ ≈ 87 the top cell's v_a = e^−Δ flushes to 0 and ρ = e^Δ − 1 overflows, so
  // its weight v_a (1 + t ρ), whose true value is near t, would be 0 or NaN.
  const float grid_delta = fminf(delta, kMaxGridDelta);
  r.step = grid_delta * flash::kLog2e;
  r.rho = expm1f(grid_delta);
  return r;
}

}  // namespace qattn::cuda::kinterval
