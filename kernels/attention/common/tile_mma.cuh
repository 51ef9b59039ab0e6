// Warp-level building blocks of the flash-attention kernels (sm_80 and up):
// 16-byte asynchronous copies into swizzled shared-memory tiles, ldmatrix, and
// the bf16 tensor-core product mma.m16n8k16 with fp32 accumulation.
//
// Fragment layouts are the PTX ISA's for mma.m16n8k16 (lane = 4g + t):
//   accumulator 16x8:  c[0], c[1] = (row g,   cols 2t, 2t+1)
//                      c[2], c[3] = (row g+8, cols 2t, 2t+1)
//   A 16x16 (4 regs):  rows g / g+8, cols 2t.. and 2t+8.., in the order
//                      (g, 0-7), (g+8, 0-7), (g, 8-15), (g+8, 8-15)
//   B 16x8  (2 regs):  col g, rows 2t.. and 2t+8..
// A warp owns kRowTiles x 16 rows; its operands live in arrays
//   a[kRowTiles][K/16][4]   (A fragments, bf16 pairs)
//   acc[kRowTiles][N/8][4]  (accumulators, fp32)
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "common.cuh"

namespace qattn::cuda::flash {

// A (kRows, kCols) bf16 tile in shared memory as kCols/64 panels of 64
// columns, each panel kRows rows of 128 bytes. Chunk c (16 bytes) of a panel
// row r is stored at chunk c ^ (r & 7), so the eight rows that one ldmatrix
// phase reads fall into eight different bank groups. This is also the 128-byte
// swizzle of Hopper's wgmma operands (wgmma.cuh), when panels start at
// multiples of 1024 bytes.
template <int kRows, int kCols>
struct SmemTile {
  static_assert(kCols % 64 == 0, "a tile is made of 64-column panels");
  static constexpr int kChunksPerRow = kCols / 8;
  static constexpr int kBytes = kRows * kCols * 2;
  bf16* data;

  __device__ __forceinline__ bf16* at(int row, int col) const {
    return data + (col >> 6) * (kRows * 64) + row * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) +
           (col & 7);
  }
};

// ---------------------------------------------------------------------------
// Asynchronous global -> shared copies (cp.async; Ampere's pipeline, also on Hopper).

// 16 bytes; when !valid the destination is zero-filled and src is not read.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 16 : 0));
}
// 4 bytes, same zero-fill rule.
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Wait until at most kPending committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Rows [0, kRows) of a row-major global matrix (row stride ld elements) into
// the tile; rows at or past rows_valid are zero-filled (tail tiles).
template <int kThreads, int kRows, int kCols>
__device__ __forceinline__ void load_tile_async(SmemTile<kRows, kCols> tile, const bf16* src,
                                                size_t ld, int rows_valid) {
  constexpr int kChunks = kRows * SmemTile<kRows, kCols>::kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "tile chunks must split evenly over the threads");
#pragma unroll
  for (int i = 0; i < kChunks / kThreads; ++i) {
    const int c = i * kThreads + threadIdx.x;
    const int row = c / SmemTile<kRows, kCols>::kChunksPerRow;
    const int col = (c % SmemTile<kRows, kCols>::kChunksPerRow) * 8;
    const bool valid = row < rows_valid;
    cp_async_16(tile.at(row, col), src + (valid ? row : 0) * ld + col, valid);
  }
}

// kRows fp32 values (one per row) into shared memory; rows past rows_valid read as 0.
template <int kThreads, int kRows>
__device__ __forceinline__ void load_row_values_async(float* dst, const float* src,
                                                      int rows_valid) {
  for (int r = threadIdx.x; r < kRows; r += kThreads)
    cp_async_4(dst + r, src + (r < rows_valid ? r : 0), r < rows_valid);
}

// Rows [first_row, rows_valid) of the tile back to global memory, row first_row
// at dst, with 16-byte stores.
template <int kThreads, int kRows, int kCols>
__device__ __forceinline__ void store_tile(SmemTile<kRows, kCols> tile, bf16* dst, size_t ld,
                                           int rows_valid, int first_row = 0) {
  constexpr int kChunks = kRows * SmemTile<kRows, kCols>::kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "tile chunks must split evenly over the threads");
#pragma unroll
  for (int i = 0; i < kChunks / kThreads; ++i) {
    const int c = i * kThreads + threadIdx.x;
    const int row = c / SmemTile<kRows, kCols>::kChunksPerRow;
    const int col = (c % SmemTile<kRows, kCols>::kChunksPerRow) * 8;
    if (row >= first_row && row < rows_valid) {
      *reinterpret_cast<int4*>(dst + (row - first_row) * ld + col) =
          *reinterpret_cast<const int4*>(tile.at(row, col));
    }
  }
}

// ---------------------------------------------------------------------------
// ldmatrix and the MMA.

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s)
               : "memory");
}

// c (16x8 fp32) += a (16x16 bf16) * b (16x8 bf16).
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <int kRowTiles, int kNTiles>
__device__ __forceinline__ void zero(float (&acc)[kRowTiles][kNTiles][4]) {
#pragma unroll
  for (int mt = 0; mt < kRowTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
}

// A fragments of the warp's rows [row0, row0 + 16 kRowTiles) of a tile, all columns.
template <int kRowTiles, int kKSteps, int kRows, int kCols>
__device__ __forceinline__ void load_a(uint32_t (&a)[kRowTiles][kKSteps][4],
                                       SmemTile<kRows, kCols> tile, int row0) {
  static_assert(kKSteps * 16 == kCols);
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int mt = 0; mt < kRowTiles; ++mt)
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks)
      ldmatrix_x4(a[mt][ks], tile.at(row0 + mt * 16 + (lane % 16), ks * 16 + (lane / 16) * 8));
}

// Accumulators as the A operand of the next product (P -> P V, dS -> dS K):
// the 16x8 tiles 2k and 2k+1 form the 16x16 A fragment k, rounded to bf16.
template <int kRowTiles, int kNTiles>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[kRowTiles][kNTiles / 2][4],
                                         const float (&c)[kRowTiles][kNTiles][4]) {
#pragma unroll
  for (int mt = 0; mt < kRowTiles; ++mt)
#pragma unroll
    for (int k = 0; k < kNTiles / 2; ++k) {
      a[mt][k][0] = pack_bf16x2(c[mt][2 * k][0], c[mt][2 * k][1]);
      a[mt][k][1] = pack_bf16x2(c[mt][2 * k][2], c[mt][2 * k][3]);
      a[mt][k][2] = pack_bf16x2(c[mt][2 * k + 1][0], c[mt][2 * k + 1][1]);
      a[mt][k][3] = pack_bf16x2(c[mt][2 * k + 1][2], c[mt][2 * k + 1][3]);
    }
}

// acc (16 kRowTiles, 8 kNTiles) += a (16 kRowTiles, 16 kKSteps) * bᵀ, where the
// tile b is stored (n, k): rows are the output columns, k is contiguous.
// This is S = Q Kᵀ and dP = dO Vᵀ (and their transposes in the dK/dV pass).
template <int kRowTiles, int kNTiles, int kKSteps, int kRows, int kCols>
__device__ __forceinline__ void mma_b_nk(float (&acc)[kRowTiles][kNTiles][4],
                                         const uint32_t (&a)[kRowTiles][kKSteps][4],
                                         SmemTile<kRows, kCols> b) {
  static_assert(kNTiles % 2 == 0 && kNTiles * 8 <= kRows && kKSteps * 16 == kCols);
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks)
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      uint32_t r[4];  // (n tile 2np: k 0-7, k 8-15), (n tile 2np+1: k 0-7, k 8-15)
      ldmatrix_x4(r, b.at(np * 16 + (lane % 8) + (lane / 16) * 8, ks * 16 + ((lane / 8) % 2) * 8));
#pragma unroll
      for (int mt = 0; mt < kRowTiles; ++mt) {
        mma_bf16_16816(acc[mt][2 * np], a[mt][ks], r[0], r[1]);
        mma_bf16_16816(acc[mt][2 * np + 1], a[mt][ks], r[2], r[3]);
      }
    }
}

// acc (16, 8 kNTiles) += rows [row0, row0 + 16) of tile a times bᵀ (b stored
// (n, k)): load_a then mma_b_nk, but with each k step's A fragment loaded just
// before its MMAs, so that 4 A registers are live instead of kCols / 4 (for
// kernels short of registers: sage's dK/dV kernel at d = 128).
template <int kNTiles, int kRowsA, int kRowsB, int kCols>
__device__ __forceinline__ void mma_rows_b_nk(float (&acc)[1][kNTiles][4],
                                              SmemTile<kRowsA, kCols> a, int row0,
                                              SmemTile<kRowsB, kCols> b) {
  static_assert(kNTiles % 2 == 0 && kNTiles * 8 <= kRowsB);
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int ks = 0; ks < kCols / 16; ++ks) {
    uint32_t af[4];
    ldmatrix_x4(af, a.at(row0 + (lane % 16), ks * 16 + (lane / 16) * 8));
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      uint32_t r[4];  // (n tile 2np: k 0-7, k 8-15), (n tile 2np+1: k 0-7, k 8-15)
      ldmatrix_x4(r, b.at(np * 16 + (lane % 8) + (lane / 16) * 8, ks * 16 + ((lane / 8) % 2) * 8));
      mma_bf16_16816(acc[0][2 * np], af, r[0], r[1]);
      mma_bf16_16816(acc[0][2 * np + 1], af, r[2], r[3]);
    }
  }
}

// acc (16 kRowTiles, 8 kNTiles) += a (16 kRowTiles, 16 kKSteps) * b, where the
// tile b is stored (k, n): rows are the reduction index, n is contiguous.
// This is O += P V, dV += Pᵀ dO, dK += dSᵀ Q and dQ += dS K.
template <int kRowTiles, int kNTiles, int kKSteps, int kRows, int kCols>
__device__ __forceinline__ void mma_b_kn(float (&acc)[kRowTiles][kNTiles][4],
                                         const uint32_t (&a)[kRowTiles][kKSteps][4],
                                         SmemTile<kRows, kCols> b) {
  static_assert(kNTiles % 2 == 0 && kNTiles * 8 == kCols && kKSteps * 16 <= kRows);
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks)
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      uint32_t r[4];  // (n tile 2np: k 0-7, k 8-15), (n tile 2np+1: k 0-7, k 8-15)
      ldmatrix_x4_trans(
          r, b.at(ks * 16 + (lane % 8) + ((lane / 8) % 2) * 8, np * 16 + (lane / 16) * 8));
#pragma unroll
      for (int mt = 0; mt < kRowTiles; ++mt) {
        mma_bf16_16816(acc[mt][2 * np], a[mt][ks], r[0], r[1]);
        mma_bf16_16816(acc[mt][2 * np + 1], a[mt][ks], r[2], r[3]);
      }
    }
}

// acc (16 kRowTiles, 8 kNTiles) += w b: the fp32 weights w (the previous
// product's accumulators, P or dS) rounded to bf16 as A fragments, b stored
// (k, n). This is O += P V, dV += Pᵀ dO, dK += dSᵀ Q and dQ += dS K.
template <int kRowTiles, int kNTiles, int kWTiles, int kRows, int kCols>
__device__ __forceinline__ void mma_weights_kn(float (&acc)[kRowTiles][kNTiles][4],
                                               const float (&w)[kRowTiles][kWTiles][4],
                                               SmemTile<kRows, kCols> b) {
  uint32_t a[kRowTiles][kWTiles / 2][4];
  acc_to_a(a, w);
  mma_b_kn(acc, a, b);
}

// The warp's accumulators, times scale and rounded to bf16, into rows
// [row0, row0 + 16 kRowTiles) of a tile (staging for coalesced global stores).
template <int kRowTiles, int kNTiles, int kRows, int kCols>
__device__ __forceinline__ void store_acc(SmemTile<kRows, kCols> tile,
                                          const float (&acc)[kRowTiles][kNTiles][4], int row0,
                                          float scale) {
  static_assert(kNTiles * 8 == kCols);
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mt = 0; mt < kRowTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = row0 + mt * 16 + g + half * 8, col = nt * 8 + 2 * t;
        *reinterpret_cast<uint32_t*>(tile.at(row, col)) =
            pack_bf16x2(acc[mt][nt][2 * half] * scale, acc[mt][nt][2 * half + 1] * scale);
      }
}

// Element (mt, nt, e) of a warp's accumulator sits at row 16 mt + g + 8 (e / 2)
// and column 8 nt + 2 t + e % 2 of the warp's tile (lane = 4 g + t).
__device__ __forceinline__ int acc_row(int mt, int e) {
  return mt * 16 + (threadIdx.x % 32) / 4 + (e / 2) * 8;
}
__device__ __forceinline__ int acc_col(int nt, int e) {
  return nt * 8 + 2 * (threadIdx.x % 4) + e % 2;
}

// Calls f(mt, nt, e) for every element of a warp's (16 kRowTiles, 8 kNTiles)
// accumulator, in the order mt, nt, e (unrolled: the indices are constants).
template <int kRowTiles, int kNTiles, class F>
__device__ __forceinline__ void for_each_acc(F&& f) {
#pragma unroll
  for (int mt = 0; mt < kRowTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) f(mt, nt, e);
}

// Runs body(std::true_type) when every entry of the caller's tile is visible
// (uniform over the threads that share a product), so that no per-entry mask is
// evaluated, else body(std::false_type).
template <class Body>
__device__ __forceinline__ void with_mask(bool all_visible, Body&& body) {
  if (all_visible)
    body(std::true_type{});
  else
    body(std::false_type{});
}

}  // namespace qattn::cuda::flash
