// The exact softmax of FPA (docs/attention-maths.md §2) as a policy of the flash skeleton: online
// over key blocks in the forward (FlashAttention-2's recurrence), element-wise
// in the backward. Everything is in the log2 domain: a raw score s becomes
// exp2(s·c·log2(e) − base), with c = 1/sqrt(d).
//
// A thread holds two rows per 16-row tile (g and g+8, lane = 4g + t) and two
// columns per 8-column accumulator tile; the four threads t = 0..3 of a row
// combine their partial max and sum with two shuffles.
#pragma once
#include <cuda_runtime.h>

#include <cmath>

namespace qattn::cuda::flash {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// 2^x with the hardware approximation (2 ulp; 2^-inf = +0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The saved statistic L = c m + log l (natural log) from the row's base
// c m log2(e) and its sum l: every kind that saves an exact softmax for the
// backward's P = exp(c s − L) (probability) saves it this way.
__device__ __forceinline__ float log_sum_exp(float base_log2, float sum) {
  return (base_log2 + __log2f(sum)) * kLn2;
}

// Max / sum over the four threads that share a row.
__device__ __forceinline__ float row_max4(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float row_sum4(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

template <int kRowTiles>
struct OnlineSoftmax {
  float row_max[kRowTiles][2];  // running max m of the raw scores of rows g, g+8
  float row_sum[kRowTiles][2];  // running l = sum of exp(c (s - m)), this thread's columns only
  float scale_log2;             // c · log2(e)

  __device__ explicit OnlineSoftmax(float scale_log2_) : scale_log2(scale_log2_) {
#pragma unroll
    for (int mt = 0; mt < kRowTiles; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        row_max[mt][half] = -INFINITY;
        row_sum[mt][half] = 0.0f;
      }
  }

  // One key block: raw scores s (masked entries -inf) become the unnormalised
  // weights exp(c (s - m_new)); l and the output rows o are rescaled by
  // exp(c (m_old - m_new)) first.
  template <int kNTiles, int kDTiles>
  __device__ __forceinline__ void update(float (&s)[kRowTiles][kNTiles][4],
                                         float (&o)[kRowTiles][kDTiles][4]) {
#pragma unroll
    for (int mt = 0; mt < kRowTiles; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        move_max(mt, half, fmaxf(row_max[mt][half], block_max(s, mt, half)), o);
        exponentiate(mt, half, s);
      }
  }

  // The steps of update, for policies that order them otherwise
  // (ExactSoftmax::update_rescaling_rarely, sage_softmax.cuh).
  // The largest raw score of row half (g or g + 8) of row tile mt in the block.
  template <int kNTiles>
  __device__ __forceinline__ static float block_max(const float (&s)[kRowTiles][kNTiles][4], int mt,
                                                    int half) {
    float m = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
      m = fmaxf(m, fmaxf(s[mt][nt][2 * half], s[mt][nt][2 * half + 1]));
    return row_max4(m);
  }
  // c·m, the exponent's offset; a row with no visible key yet keeps m = -inf:
  // offset 0 makes its weights 0, not NaN.
  __device__ __forceinline__ float exponent_base(float m) const {
    return m == -INFINITY ? 0.0f : m * scale_log2;
  }
  // The row's reference max moves to m_new: l and the row's outputs o are
  // rescaled by exp(c (m_old - m_new)).
  template <int kDTiles>
  __device__ __forceinline__ void move_max(int mt, int half, float m_new,
                                           float (&o)[kRowTiles][kDTiles][4]) {
    scale_outputs(mt, half, move_reference(mt, half, m_new), o);
  }
  // move_max in two parts, for a caller whose o is still being summed into
  // when the max moves (a product in flight): m and l at once, and the factor
  // exp(c (m_old - m_new)) returned for the row's outputs, which
  // scale_outputs multiplies once they have landed.
  __device__ __forceinline__ float move_reference(int mt, int half, float m_new) {
    const float correction = fast_exp2(row_max[mt][half] * scale_log2 - exponent_base(m_new));
    row_max[mt][half] = m_new;
    row_sum[mt][half] *= correction;
    return correction;
  }
  template <int kDTiles>
  __device__ __forceinline__ static void scale_outputs(int mt, int half, float correction,
                                                       float (&o)[kRowTiles][kDTiles][4]) {
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      o[mt][dt][2 * half] *= correction;
      o[mt][dt][2 * half + 1] *= correction;
    }
  }
  // The row's scores become exp(c (s - m)) at its reference m, added to l.
  template <int kNTiles>
  __device__ __forceinline__ void exponentiate(int mt, int half,
                                               float (&s)[kRowTiles][kNTiles][4]) {
    const float base = exponent_base(row_max[mt][half]);
    float sum = row_sum[mt][half];
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 2 * half; e < 2 * half + 2; ++e) {
        s[mt][nt][e] = fast_exp2(fmaf(s[mt][nt][e], scale_log2, -base));
        sum += s[mt][nt][e];
      }
    row_sum[mt][half] = sum;
  }

  // O = O / l, after the last key block. Every row sees key 0, so l >= 1.
  template <int kDTiles>
  __device__ __forceinline__ void finalize(float (&o)[kRowTiles][kDTiles][4]) {
#pragma unroll
    for (int mt = 0; mt < kRowTiles; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        row_sum[mt][half] = row_sum4(row_sum[mt][half]);
        const float inv = 1.0f / row_sum[mt][half];
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          o[mt][dt][2 * half] *= inv;
          o[mt][dt][2 * half + 1] *= inv;
        }
      }
  }

  // The saved statistic L = c m + log l (natural log) of rows [row0, row0 + 16
  // kRowTiles) into lse (T,), rows past rows_valid skipped. After finalize.
  __device__ __forceinline__ void store_lse(float* lse, int row0, int rows_valid) const {
    const int lane = threadIdx.x % 32, g = lane / 4;
    if (lane % 4 != 0) return;
#pragma unroll
    for (int mt = 0; mt < kRowTiles; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = row0 + mt * 16 + g + half * 8;
        if (row < rows_valid)
          lse[row] = log_sum_exp(row_max[mt][half] * scale_log2, row_sum[mt][half]);
      }
  }

  // Backward, one visible entry: P = exp(c s - L) from the raw score and the saved L.
  __device__ static __forceinline__ float probability(float s, float lse, float scale_log2) {
    return fast_exp2(fmaf(s, scale_log2, -lse * kLog2e));
  }
  // Backward: dS = P (dP - δ), δ = rowsum(dO ∘ O).
  __device__ static __forceinline__ float grad_score(float p, float dp, float delta) {
    return p * (dp - delta);
  }
};

}  // namespace qattn::cuda::flash
