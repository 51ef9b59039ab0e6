// INT8 operands of SageBwd (docs/attention-maths.md §4) for the sage kernels: int8 shared-memory
// tiles, the tensor-core product mma.m16n8k32.s8 (sm_80 and up) and the
// in-register quantisation of weights (P̃, P, dS) into its A operand.
//
// Fragment layouts are the PTX ISA's for mma.m16n8k32 .s8 (lane = 4g + t). Byte
// for byte they are the bf16 m16n8k16 layouts of tile_mma.cuh with one b16
// element = two int8, so ldmatrix (b16) loads them unchanged:
//   A 16x32 (4 regs of 4 int8): (row g, k 4t..4t+3), (g+8, 4t..), (g, 16+4t..), (g+8, 16+4t..)
//   B 32x8  (2 regs):           (col g, k 4t..4t+3), (col g, k 16+4t..16+4t+3)
//   accumulator 16x8 int32:     as the fp32 one of m16n8k16.
//
// Weights -> A operand without shuffles: a thread's fp32 accumulator holds
// columns 2t, 2t+1 of each 8-column tile, but the int8 A operand wants k = 4t..4t+3.
// So the product runs over a permuted k: within each group of 16, logical
// position p = 4t + i is physical column kPermuted(p) = 2t + (i & 1) + 8 (i >> 1).
// The B operands of these products (V̂, dÔ, Q̂, K̂ along T) are stored transposed,
// (d, T), with T permuted the same way by the quantisation pre-pass (quant.cu).
#pragma once
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "attention/common/online_softmax.cuh"
#include "attention/common/tile_mma.cuh"
#include "attention/sage/quant.cuh"  // kPermuted: the T order of the transposed copies

namespace qattn::cuda::flash {

// A (kRows, kCols) int8 tile in shared memory, row-major with 16 bytes of
// padding per row: row strides of 80 or 144 bytes put the eight rows of an
// ldmatrix phase into eight different bank groups.
template <int kRows, int kCols>
struct Int8Tile {
  static_assert(kCols % 32 == 0, "a tile row must hold whole k steps of 32");
  static constexpr int kStride = kCols + 16;
  static constexpr int kBytes = kRows * kStride;
  int8_t* data;
  __device__ __forceinline__ int8_t* at(int row, int col) const {
    return data + row * kStride + col;
  }
};

// All kRows rows of a row-major int8 matrix (row stride ld bytes) into the tile.
// The workspace pads T to whole tiles, so every row exists.
template <int kThreads, int kRows, int kCols>
__device__ __forceinline__ void load_int8_tile_async(Int8Tile<kRows, kCols> tile, const int8_t* src,
                                                     size_t ld) {
  constexpr int kChunksPerRow = kCols / 16, kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "tile chunks must split evenly over the threads");
#pragma unroll
  for (int i = 0; i < kChunks / kThreads; ++i) {
    const int c = i * kThreads + threadIdx.x;
    const int row = c / kChunksPerRow, col = (c % kChunksPerRow) * 16;
    cp_async_16(tile.at(row, col), src + row * ld + col, true);
  }
}

// c (16x8 int32) += a (16x32 s8) * b (32x8 s8).
__device__ __forceinline__ void mma_s8_16832(int (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4_s8(uint32_t (&r)[4], const int8_t* p) {
  ldmatrix_x4(r, reinterpret_cast<const bf16*>(p));
}

// Conversions at the FP32 rate:
// - int32 -> fp32: cvt.rn.f32.s32, which ptxas emits for sm_90 as I2FP.F32.S32,
//   an FP32-rate instruction (51 conversions per clock per SM measured on an
//   H200, as many as the FADD of a biased-float trick that also needed the
//   accumulators set to its bias first), exact while |Σ| < 2^24.
//   Bound: every product here sums at most 128 terms of |q̂ k̂| <= 127², and
//   127²·128 = 2,064,512 (static_asserts below).
// - fp32 -> int8 (ψ's level of x given 1/s): fma(x, 1/s, 1.5·2^23) rounds x/s to
//   the nearest integer (ties to even; the CPU reference rounds ties away from
//   zero: a tie needs x/s exactly k + ½, and flips one level) and leaves the
//   level's two's complement in the low byte of the float's bits; |x| <= max|X|
//   keeps it in [-127, 127]. PRMT packs four such bytes.
constexpr float kBias = 12582912.0f;  // 1.5·2^23
template <int kTerms>
__device__ __forceinline__ float sum_to_float(int sum) {
  static_assert(127 * 127 * kTerms < (1 << 24),
                "the int32 sum must convert exactly (sum_to_float)");
  return __int2float_rn(sum);
}
__device__ __forceinline__ uint32_t pack_s8x4(float a, float b, float c, float d, float inv) {
  const uint32_t la = __float_as_uint(fmaf(a, inv, kBias)),
                 lb = __float_as_uint(fmaf(b, inv, kBias));
  const uint32_t lc = __float_as_uint(fmaf(c, inv, kBias)),
                 ld = __float_as_uint(fmaf(d, inv, kBias));
  return __byte_perm(__byte_perm(la, lb, 0x0040), __byte_perm(lc, ld, 0x0040), 0x5410);
}

// 1/x with the hardware approximation (1 ulp; ftz).
__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Integer accumulators (16, 8 kNTiles) set to zero (mma.sync adds to them; the
// first wgmma of a product overwrites its accumulators instead).
template <int kNTiles>
__device__ __forceinline__ void zero_sums(int (&sum)[kNTiles][4]) {
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) sum[nt][e] = 0;
}
// acc = sum · scale, sums of kTerms products with one scale for the tile: s32
// sums of int8 levels, converted, or fp32 sums (the e4m3 products'
// accumulators, §4.12), as they are.
template <int kTerms, int kNTiles, class Sum>
__device__ __forceinline__ void sums_to_scores(float (&acc)[1][kNTiles][4],
                                               const Sum (&sum)[kNTiles][4], float scale) {
  static_assert(std::is_same_v<Sum, int> || std::is_same_v<Sum, float>);
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if constexpr (std::is_same_v<Sum, int>)
        acc[0][nt][e] = sum_to_float<kTerms>(sum[nt][e]) * scale;
      else
        acc[0][nt][e] = sum[nt][e] * scale;
    }
}
// acc += sum · row_scale of the element's row (g: [0], g + 8: [1]), kTerms products each.
template <int kTerms>
__device__ __forceinline__ void add_sum(float (&acc)[4], const int (&sum)[4],
                                        const float (&row_scale)[2]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) acc[e] = fmaf(sum_to_float<kTerms>(sum[e]), row_scale[e / 2], acc[e]);
}

// ψ(w) as int8 A fragments over the permuted k (see above): the weights w (16
// rows, 8 kNTiles columns = the product's k) at the row scales' inverses `inv`.
template <int kKSteps, int kNTiles>
__device__ __forceinline__ void pack_weights(uint32_t (&a)[kKSteps][4],
                                             const float (&w)[1][kNTiles][4],
                                             const float (&inv)[2]) {
  static_assert(kNTiles == 4 * kKSteps, "a k32 step is four 8-column accumulator tiles");
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    const float(&w0)[4] = w[0][4 * ks], (&w1)[4] = w[0][4 * ks + 1];
    const float(&w2)[4] = w[0][4 * ks + 2], (&w3)[4] = w[0][4 * ks + 3];
    a[ks][0] = pack_s8x4(w0[0], w0[1], w1[0], w1[1], inv[0]);
    a[ks][1] = pack_s8x4(w0[2], w0[3], w1[2], w1[3], inv[1]);
    a[ks][2] = pack_s8x4(w2[0], w2[1], w3[0], w3[1], inv[0]);
    a[ks][3] = pack_s8x4(w2[2], w2[3], w3[2], w3[3], inv[1]);
  }
}

// fp32 -> e4m3 (docs/attention-maths.md §1.2): four values times `factor` (a
// power of two, so the product is exact) as the bytes of one register, a in
// the low byte; cvt.rn.satfinite.e4m3x2.f32 on sm_89 and up, the conversion
// the CPU's e4m3_encode is tested against (tests/gpu/test_e4m3.cpp).
__device__ __forceinline__ uint32_t pack_e4m3x4(float a, float b, float c, float d, float factor) {
  const uint32_t lo =
      __nv_cvt_float2_to_fp8x2(make_float2(a * factor, b * factor), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi =
      __nv_cvt_float2_to_fp8x2(make_float2(c * factor, d * factor), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}

// The weights w times factor[r] (r = e / 2: the thread's two rows) as e4m3 A
// fragments over the permuted k: the layout of pack_weights, with one e4m3
// value where it has an int8 level.
template <int kKSteps, int kNTiles>
__device__ __forceinline__ void pack_weights_e4m3(uint32_t (&a)[kKSteps][4],
                                                  const float (&w)[1][kNTiles][4],
                                                  const float (&factor)[2]) {
  static_assert(kNTiles == 4 * kKSteps, "a k32 step is four 8-column accumulator tiles");
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    const float(&w0)[4] = w[0][4 * ks], (&w1)[4] = w[0][4 * ks + 1];
    const float(&w2)[4] = w[0][4 * ks + 2], (&w3)[4] = w[0][4 * ks + 3];
    a[ks][0] = pack_e4m3x4(w0[0], w0[1], w1[0], w1[1], factor[0]);
    a[ks][1] = pack_e4m3x4(w0[2], w0[3], w1[2], w1[3], factor[1]);
    a[ks][2] = pack_e4m3x4(w2[0], w2[1], w3[0], w3[1], factor[0]);
    a[ks][3] = pack_e4m3x4(w2[2], w2[3], w3[2], w3[3], factor[1]);
  }
}
// The same with one factor for both rows.
template <int kKSteps, int kNTiles>
__device__ __forceinline__ void pack_weights_e4m3(uint32_t (&a)[kKSteps][4],
                                                  const float (&w)[1][kNTiles][4], float factor) {
  const float both[2] = {factor, factor};
  pack_weights_e4m3(a, w, both);
}

// acc (16, 8 kNTiles) = a · bᵀ over k = kCols bytes, exactly in int32, then
// times `scale` into fp32: the warp's rows [row0, row0 + 16) of tile `a` against
// every row of tile `b` (stored (n, k)). This is S = Q̂ K̂ᵀ and dP = dÔ V̂ᵀ (and
// their transposes in the dK/dV pass); both operands have one scale per block.
template <int kNTiles, int kRowsA, int kRowsB, int kCols>
__device__ __forceinline__ void int8_product_nk(float (&acc)[1][kNTiles][4],
                                                Int8Tile<kRowsA, kCols> a, int row0,
                                                Int8Tile<kRowsB, kCols> b, float scale) {
  static_assert(kNTiles % 2 == 0 && kNTiles * 8 <= kRowsB);
  const int lane = threadIdx.x % 32;
  int sum[kNTiles][4];
  zero_sums(sum);
#pragma unroll
  for (int ks = 0; ks < kCols / 32; ++ks) {
    uint32_t af[4];
    ldmatrix_x4_s8(af, a.at(row0 + (lane % 16), ks * 32 + (lane / 16) * 16));
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      uint32_t r[4];  // (n tile 2np: k 0-15, k 16-31), (n tile 2np+1: k 0-15, k 16-31)
      ldmatrix_x4_s8(r,
                     b.at(np * 16 + (lane % 8) + (lane / 16) * 8, ks * 32 + ((lane / 8) % 2) * 16));
      mma_s8_16832(sum[2 * np], af, r[0], r[1]);
      mma_s8_16832(sum[2 * np + 1], af, r[2], r[3]);
    }
  }
  sums_to_scores<kCols>(acc, sum, scale);
}

// ψ's scale s = amax / 127 and 1/s of each of the thread's two rows, without
// IEEE divisions (each a slow-path call: ~60 instructions per weight_scales in
// the dK/dV kernel): s = amax·(1/127) is within 2^-23 of amax / 127 (relative),
// 1/s = rcp(s) (the hardware reciprocal) within one ulp of 1/s; a level
// round(w / s) over |w| <= amax is at most 127·(1 + 2^-21), so it stays in
// [-127, 127].
// The reciprocal of s, not 127·rcp(amax): for amax >= 2^126 the reciprocal of
// amax is subnormal, and ftz would make every level 0; that of s is normal for
// every finite amax. Below 2^-100 (no weight that matters is that small) a row
// counts as zero: level 0, s = 1 (tested, "ψ's weight scales").
constexpr float kZeroAmax = 0x1p-100f;
__device__ __forceinline__ void scales_of_amax(const float (&amax)[2], float (&scale)[2],
                                               float (&inv)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const bool zero = amax[half] < kZeroAmax;
    const float s = amax[half] * (1.0f / 127.0f);
    scale[half] = zero ? 1.0f : s;
    inv[half] = zero ? 1.0f : fast_rcp(s);
  }
}

// psi's scale of each of the thread's two rows (g, g+8) of the weights w (16,
// 8 kNTiles): one per row of the warp's tile, or, with per_tile, one for the
// whole tile of kWarpsPerTile consecutive warps (the warps that share one
// quantisation block of rows; `scratch` holds a float per warp of the CTA in
// shared memory, and every thread of the CTA must call). s = max|w| / 127 (1 below 2^-100).
template <int kWarpsPerTile, int kNTiles>
__device__ __forceinline__ void weight_scales(const float (&w)[1][kNTiles][4], bool per_tile,
                                              float* scratch, float (&scale)[2], float (&inv)[2]) {
  float amax[2] = {0.0f, 0.0f};
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) amax[e / 2] = fmaxf(amax[e / 2], fabsf(w[0][nt][e]));
  amax[0] = row_max4(amax[0]);
  amax[1] = row_max4(amax[1]);
  if (per_tile) {
    const int warp = threadIdx.x / 32, first = warp - warp % kWarpsPerTile;
    const float warp_amax = warp_max(fmaxf(amax[0], amax[1]));
    if (threadIdx.x % 32 == 0) scratch[warp] = warp_amax;
    __syncthreads();
    float tile_amax = 0.0f;
#pragma unroll
    for (int wi = 0; wi < kWarpsPerTile; ++wi) tile_amax = fmaxf(tile_amax, scratch[first + wi]);
    amax[0] = amax[1] = tile_amax;
  }
  scales_of_amax(amax, scale, inv);
}

// acc (16, d) += (ψ(w) · B̂) · scale(row) · scale_b: the weights w (16 rows, 8
// kNTiles columns = the product's k) quantised with the row scales of
// weight_scales, times the transposed int8 tile bt (d rows, k permuted, see
// above). This is O += P̂ V̂, dV += P̂ᵀ dÔ, dK += dŜᵀ Q̂ and dQ += dŜ K̂.
template <int kDTiles, int kNTiles, int kRowsB, int kCols>
__device__ __forceinline__ void int8_product_weights(float (&acc)[1][kDTiles][4],
                                                     const float (&w)[1][kNTiles][4],
                                                     const float (&scale)[2], const float (&inv)[2],
                                                     Int8Tile<kRowsB, kCols> bt, float scale_b) {
  static_assert(kNTiles % 4 == 0 && kNTiles * 8 == kCols && kDTiles * 8 == kRowsB &&
                kDTiles % 2 == 0);
  constexpr int kKSteps = kNTiles / 4;
  const int lane = threadIdx.x % 32;
  uint32_t a[kKSteps][4];  // ψ(w) as A fragments over the permuted k
  pack_weights(a, w, inv);
  const float row_scale[2] = {scale[0] * scale_b, scale[1] * scale_b};
#pragma unroll
  for (int np = 0; np < kDTiles / 2; ++np) {  // 16 output columns at a time: few int32 registers
    int sum[2][4];
    zero_sums(sum);
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      uint32_t r[4];
      ldmatrix_x4_s8(
          r, bt.at(np * 16 + (lane % 8) + (lane / 16) * 8, ks * 32 + ((lane / 8) % 2) * 16));
      mma_s8_16832(sum[0], a[ks], r[0], r[1]);
      mma_s8_16832(sum[1], a[ks], r[2], r[3]);
    }
    add_sum<kCols>(acc[0][2 * np], sum[0], row_scale);
    add_sum<kCols>(acc[0][2 * np + 1], sum[1], row_scale);
  }
}

}  // namespace qattn::cuda::flash
