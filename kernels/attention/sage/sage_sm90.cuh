// What SageBwd's Hopper kernels (sage_forward_sm90.cuh, sage_dq_sm90.cuh,
// sage_dkdv_sm90.cuh) share: their block's rows, and the parameters of the two
// backward kernels besides their tensor maps (sage.cu fills them once).
#pragma once
#include <type_traits>

#include "attention/common/warpgroups.cuh"
#include "attention/common/wgmma.cuh"
#include "attention/sage/int8_operands.cuh"
#include "attention/sage/quant.cuh"
#include "attention/sage/sage_softmax.cuh"

namespace qattn::cuda::sage {

// Consumer warpgroups per block (each kernel's Layout::kWarpgroups, 64
// resident rows each, sage_rows): three where the registers allow (160 a
// thread), so that each warp scheduler has a third warp to switch to through
// the long per-entry work (P̃ or dS, their levels, the folds); two otherwise, at
// 240. Plain sage: the forward and dQ three at both head dims (the forward's
// P̂V̂ at d = 128 in two halves one after the other, weight_product, so that
// it does not spill), dK/dV three at d = 64 and two at d = 128 (its dK and
// dV alone hold 128 fp32 a thread: 1,160 bytes of spill at 160). The K-interval
// policy keeps two (its dK/dV spilled 384 bytes at d = 64). Three against two
// (`qattn bench attention --kind sage`): backward 0.238 -> 0.221 ms at (8, 12,
// 1024, 64), 1.381 -> 1.209 at (4, 12, 4096, 64); by tools/dev/profile_attention.sh
// dQ 967 -> 847 us and the forward 858 -> 741 at (4, 16, 4096, 128).
constexpr int sage_rows(int warpgroups) { return warpgroups * flash::sm90::kWarpgroupRows; }

// A head's per-block scales in shared memory, past the Layout's bytes:
// kArrays arrays of `blocks` floats (a few KB at most), copied by the consumers
// before the first step, so that a step reads its block's scale from shared
// memory, not by a global load it then waits for. The forward and dQ use it
// (the forward 569 -> 549 us at (4, 16, 4096, 128) by tools/dev/profile_attention.sh);
// the dK/dV kernel does not (slower there, sage_dkdv_sm90.cuh).
constexpr size_t scale_table_bytes(int arrays, int blocks) {
  return static_cast<size_t>(arrays) * blocks * 4;
}
#ifdef __CUDACC__
template <int kConsumerThreads, int kArrays>
__device__ __forceinline__ const float* stage_scales(unsigned char* at,
                                                     const float* const (&src)[kArrays],
                                                     int blocks) {
  float* table = reinterpret_cast<float*>(at);
#pragma unroll
  for (int a = 0; a < kArrays; ++a)
    for (int i = static_cast<int>(threadIdx.x); i < blocks; i += kConsumerThreads)
      table[a * blocks + i] = src[a][i];
  flash::sm90::consumers_sync<kConsumerThreads / 128>();
  return table;
}
#endif

// A query warpgroup of the forward or the dQ kernel (64 rows at q0 + its
// offset in the block of sage_rows): its rows lie in one quantisation block, so
// its S has one scale s_Q s_K per key block (a block past the last: the last,
// as sage.cu) and one smooth_q bias row; key block j holds a key some row
// sees (uniform over the warpgroup, as wgmma needs; rows past T see none).
struct QueryWarpgroup {
  int wg_row0;           // the warpgroup's first row in the block's tiles
  int wg_first;          // its first query
  int first_query;       // the calling warp's first query
  float scale_q;         // s_Q of its quantisation block
  const float* scale_k;  // (blocks) s_K of the head's key blocks (stage_scales' copy)
  const float* bias;     // (Tp) the smooth_q bias of its block's queries, or null

  __device__ QueryWarpgroup(const SageWorkspace& ws, int bh, int q0, bool smooth_q,
                            const float* head_scale_k)
      : wg_row0(flash::sm90::warpgroup_row0()), wg_first(q0 + wg_row0),
        first_query(q0 + flash::sm90::warp_row0()), scale_k(head_scale_k) {
    const size_t q_block = ws.head_block0(bh) + min(wg_first / kSageBlock, ws.blocks - 1);
    scale_q = ws.q.scale[q_block];
    bias = smooth_q ? ws.query_bias + q_block * ws.Tp : nullptr;
  }
  // S's scale s_Q s_K of key block j.
  __device__ float scale(int j) const { return scale_q * scale_k[j]; }
  __device__ bool sees(int j, int T) const {
    return wg_first < T && j * kSageBlock <= wg_first + flash::sm90::kWarpgroupRows - 1;
  }
  // The key blocks it sees, [0, blocks_seen): j < blocks_seen(T) exactly
  // where sees(j, T) (with x = wg_first + 63, j <= ⌊x / 64⌋ ⟺ 64 j <= x).
  __device__ int blocks_seen(int T) const {
    return wg_first < T ? (wg_first + flash::sm90::kWarpgroupRows - 1) / kSageBlock + 1 : 0;
  }
};

struct SageBackwardSm90Common {
  SageWorkspace ws;
  const float* stats;      // (B, H, T, Softmax::kStatFloats): the forward's L, or RowStats
  float* row_terms;        // (B, H, Tp, Softmax::kTermFloats): δ, or the K-interval row sweep's
                           // terms (written by dQ, read by dK/dV)
  bf16* dqkv;              // (B, T, 3, H, d): dQ writes the q slot, dK/dV the k and v slots
  SoftmaxOptions softmax;  // the K-interval block's
  int B, H, T;
  float c;  // 1 / sqrt(d)
  bool smooth_q;
};

#ifdef __CUDACC__
// A product over d on the Hopper kernels, S = Q̂ K̂ᵀ (qk) or dP = dÔ V̂ᵀ (dp)
// and their transposes, at precision P: bf16 (dp alone: V and dO as the
// activations hold them), int8 (the pre-pass's natural copies' levels, s32
// sums) or fp8 (the same copies holding e4m3 values on power-of-two block
// scales, docs/attention-maths.md §4.12; fp32 sums). The 8-bit operands are
// K-major byte tiles (Int8SmemTile) either way, so int8 and fp8 share the
// tiles, the tensor maps and the layouts and differ in the instruction and
// the accumulator alone. One product of one warpgroup is in flight in `acc`
// from issue to wait_for.
template <Precision P>
struct OverD {
  static constexpr bool kBytes = P != Precision::bf16;  // one byte per element
  template <int kRows, int D>
  using Tile =
      std::conditional_t<kBytes, flash::sm90::Int8SmemTile<kRows, D>, flash::SmemTile<kRows, D>>;
  template <int kRows, int D>
  static constexpr int tile_bytes() {
    return kRows * D * (kBytes ? 1 : 2);
  }
  template <int kRows, int D>
  __device__ static Tile<kRows, D> tile_at(unsigned char* at) {
    if constexpr (kBytes)
      return {reinterpret_cast<int8_t*>(at)};
    else
      return {reinterpret_cast<bf16*>(at)};
  }
  using Acc = std::conditional_t<P == Precision::int8, int, float>;
  template <int kNTiles, class A, class B>
  __device__ static void issue(Acc (&acc)[1][kNTiles][4], A a, int row0, B b) {
    using namespace flash::sm90;
    if constexpr (kBytes)
      issue_8bit_ss(acc, a, row0, b);  // Acc picks int8 or e4m3
    else
      issue_ss(acc, a, row0, b);
  }
  // out = the product's values, times `scale` (the two blocks' scales) where
  // the operands are 8-bit; kTerms products per sum.
  template <int kTerms, int kNTiles>
  __device__ static void values(float (&out)[1][kNTiles][4], const Acc (&acc)[1][kNTiles][4],
                                float scale) {
    if constexpr (P == Precision::bf16) {
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) out[0][nt][e] = acc[0][nt][e];
    } else {
      flash::sums_to_scores<kTerms>(out, acc[0], scale);
    }
  }
};

// acc (64, d) += (a bt) · row_scale (per row of the thread, int8_operands.cuh's
// add_sum): a the warpgroup's s8 A fragments (64 rows, 32 kKSteps), bt (d,
// 32 kKSteps) the transposed B (V̂ᵀ, K̂ᵀ), as kChunks wgmma groups over d / kChunks
// columns each into s32 sums, kInFlight of them issued at once and each
// folded as soon as it lands: with two in flight the fold of the first half runs
// beside the second's product; with one the sums take half the registers.
template <int kChunks, int kInFlight, int D, int kKSteps>
__device__ __forceinline__ void weight_product(float (&acc)[1][D / 8][4],
                                               uint32_t (&a)[1][kKSteps][4],
                                               flash::sm90::Int8SmemTile<D, 32 * kKSteps> bt,
                                               const float (&row_scale)[2]) {
  using namespace flash;
  using namespace flash::sm90;
  constexpr int kChunkTiles = D / 8 / kChunks, kChunkRows = D / kChunks;
  static_assert(kChunks % kInFlight == 0 && kInFlight <= 2,
                "the waits below are for one or two groups");
#pragma unroll
  for (int c0 = 0; c0 < kChunks; c0 += kInFlight) {
    int sum[kInFlight][1][kChunkTiles][4];  // (64, d / kChunks) s32 each
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      issue_s8_rs(
          sum[i], a,
          Int8SmemTile<kChunkRows, 32 * kKSteps>{bt.data + (c0 + i) * kChunkRows * 32 * kKSteps});
    }
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      if (i + 1 < kInFlight)
        wait_for<1>(sum[i]);
      else
        wait_for<0>(sum[i], a);
#pragma unroll
      for (int dt = 0; dt < kChunkTiles; ++dt)
        add_sum<32 * kKSteps>(acc[0][(c0 + i) * kChunkTiles + dt], sum[i][0][dt], row_scale);
    }
  }
}
#endif  // __CUDACC__

}  // namespace qattn::cuda::sage
