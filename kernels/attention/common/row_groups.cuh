// The group of threads that owns rows of a block's resident tile, so that a
// kernel is written once for both tensor-core families (kinterval.cu):
//
//   WarpRows<RT>   mma.sync (sm_80 and up): a warp owns 16 RT rows; the A
//                  operand of its products is register fragments (ldmatrix).
//   WarpgroupRows  wgmma (sm_90a): a warpgroup (4 warps) owns 64 rows; A stays
//                  in shared memory, read by descriptor (wgmma.cuh).
//
// In both, a warp's accumulators have the mma.sync layout (acc[kRowTiles][N/8][4],
// tile_mma.cuh): per-score code walks them with for_each_acc, acc_row and acc_col
// from the warp's first row. A kernel on a row group
//   - skips a step per group (first_row(), kRows): wgmma is collective over the
//     warpgroup, so a branch around a product is uniform over the group;
//   - indexes accumulator elements from warp_first_row();
//   - reads the group's rows of a resident tile through A<rows, cols>, loaded
//     once the tile has landed;
//   - gets its tiles through the family's feed (feeds.cuh);
//   - has a body only where kCompiledHere (wgmma: sm_90a device code).
// The two products are the two shapes of attention's six (the qk, pv, dp,
// dv, dk, dq of docs/attention-maths.md §4.7): scores (A Bᵀ, both operands
// from tiles) and accumulate (W B, W the previous product's fp32 accumulators
// rounded to bf16, or bf16 A fragments the kernel packed itself).
// issue_scores starts a scores product and wait<n>(acc) waits until at most n
// started later are in flight, so that a kernel overlaps element-wise work
// with the next product (wgmma runs asynchronously; mma.sync computes at issue
// and waits for nothing).
#pragma once
#include "attention/common/tile_mma.cuh"
#include "attention/common/warpgroups.cuh"
#include "attention/common/wgmma.cuh"

namespace qattn::cuda::flash {

template <int kRowTiles_>
struct WarpRows {
  static constexpr int kRowTiles = kRowTiles_;   // 16-row tiles of a warp's accumulators
  static constexpr int kRows = 16 * kRowTiles_;  // rows the group owns
  static constexpr int kThreads = 32;
  static constexpr bool kCompiledHere = true;

  // First row of the calling thread's group, and of its warp, within the block.
  __device__ static __forceinline__ int first_row() { return (threadIdx.x / 32) * kRows; }
  __device__ static __forceinline__ int warp_first_row() { return first_row(); }

  // The group's rows of a resident (kTileRows, kCols) tile as A fragments.
  template <int kTileRows, int kCols>
  struct A {
    uint32_t frag[kRowTiles][kCols / 16][4];
    __device__ __forceinline__ void load(SmemTile<kTileRows, kCols> tile) {
      load_a(frag, tile, first_row());
    }
  };

  // acc = A Bᵀ, b (N, k) stored with k contiguous (S = Q Kᵀ, dP = dO Vᵀ, and Sᵀ, dPᵀ).
  template <int kNTiles, int kTileRows, int kCols, int kRowsB>
  __device__ static __forceinline__ void scores(float (&acc)[kRowTiles][kNTiles][4],
                                                const A<kTileRows, kCols>& a,
                                                SmemTile<kRowsB, kCols> b) {
    zero(acc);
    mma_b_nk(acc, a.frag, b);
  }
  template <int kNTiles, int kTileRows, int kCols, int kRowsB>
  __device__ static __forceinline__ void issue_scores(float (&acc)[kRowTiles][kNTiles][4],
                                                      const A<kTileRows, kCols>& a,
                                                      SmemTile<kRowsB, kCols> b) {
    scores(acc, a, b);
  }
  template <int kPending, class... Acc>
  __device__ static __forceinline__ void wait(Acc&...) {}

  // acc += w b, b (k, N) with N contiguous (O += ŵ V, dQ += dS K, dV += p̂ᵀ dO, dK += dSᵀ Q).
  template <int kNTiles, int kWTiles, int kRowsB, int kCols>
  __device__ static __forceinline__ void accumulate(float (&acc)[kRowTiles][kNTiles][4],
                                                    const float (&w)[kRowTiles][kWTiles][4],
                                                    SmemTile<kRowsB, kCols> b) {
    mma_weights_kn(acc, w, b);
  }
  // acc += a b with a (16 kRowTiles, 16 kKSteps) bf16 A fragments.
  template <int kNTiles, int kKSteps, int kRowsB, int kCols>
  __device__ static __forceinline__ void accumulate(float (&acc)[kRowTiles][kNTiles][4],
                                                    uint32_t (&a)[kRowTiles][kKSteps][4],
                                                    SmemTile<kRowsB, kCols> b) {
    mma_b_kn(acc, a, b);
  }
};

struct WarpgroupRows {
  static constexpr int kRowTiles = 1;  // a warp's 16 rows
  static constexpr int kRows = sm90::kWarpgroupRows;
  static constexpr int kThreads = 128;
  static constexpr bool kCompiledHere = QATTN_SM90A_DEVICE != 0;

  __device__ static __forceinline__ int first_row() { return (threadIdx.x / 128) * kRows; }
  __device__ static __forceinline__ int warp_first_row() { return (threadIdx.x / 32) * 16; }

  // The tile itself: wgmma reads the group's rows from shared memory.
  template <int kTileRows, int kCols>
  struct A {
    SmemTile<kTileRows, kCols> tile;
    __device__ __forceinline__ void load(SmemTile<kTileRows, kCols> t) { tile = t; }
  };

  template <int kNTiles, int kTileRows, int kCols, int kRowsB>
  __device__ static __forceinline__ void scores(float (&acc)[1][kNTiles][4],
                                                const A<kTileRows, kCols>& a,
                                                SmemTile<kRowsB, kCols> b) {
    sm90::product_ss(acc, a.tile, first_row(), b);
  }
  template <int kNTiles, int kTileRows, int kCols, int kRowsB>
  __device__ static __forceinline__ void issue_scores(float (&acc)[1][kNTiles][4],
                                                      const A<kTileRows, kCols>& a,
                                                      SmemTile<kRowsB, kCols> b) {
    sm90::issue_ss(acc, a.tile, first_row(), b);
  }
  template <int kPending, class... Acc>
  __device__ static __forceinline__ void wait(Acc&... acc) {
    sm90::wait_for<kPending>(acc...);
  }

  template <int kNTiles, int kWTiles, int kRowsB, int kCols>
  __device__ static __forceinline__ void accumulate(float (&acc)[1][kNTiles][4],
                                                    const float (&w)[1][kWTiles][4],
                                                    SmemTile<kRowsB, kCols> b) {
    sm90::product_rs(acc, w, b);
  }
  template <int kNTiles, int kKSteps, int kRowsB, int kCols>
  __device__ static __forceinline__ void accumulate(float (&acc)[1][kNTiles][4],
                                                    uint32_t (&a)[1][kKSteps][4],
                                                    SmemTile<kRowsB, kCols> b) {
    sm90::issue_rs(acc, a, b);
    sm90::wait_for<0>(acc, a);
  }
};

}  // namespace qattn::cuda::flash
