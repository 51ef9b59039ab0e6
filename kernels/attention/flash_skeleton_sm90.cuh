// The flash skeleton on Hopper's warpgroup MMA (wgmma, sm_90a): the same
// loops, masks, pipeline, Softmax policy and memory layout as flash_skeleton.cuh,
// with each product one wgmma group of a warpgroup (64 rows) instead of a warp's
// mma.sync tiles (16 or 32 rows). What changes with the instruction:
//   - A warpgroup owns 64 rows of the resident tile; every branch around a
//     product (causal skips) is uniform over the warpgroup, as wgmma is
//     collective.
//   - Operands stay in shared memory (Q, K, V, dO tiles are read by descriptor;
//     no ldmatrix fragments), only P and dS go from accumulators to registers.
//   - Copies are fenced for the async proxy before the tensor cores read them.
// The accumulator layout per warp is the mma.sync one, so the Softmax policy
// (online_softmax.cuh) and the element walks (for_each_acc) are shared as is.
// Products are bf16 x bf16 -> fp32 (FPA's precision); the backward is the
// deterministic 7-product form of flash_skeleton.cuh.
//
// Kernels compiled for another target (sm_80) keep an empty body: the
// launchers pick these only on a device of compute capability 9.x
// (use_sm90_kernels), for which the build carries sm_90a code.
#pragma once
#include "flash_skeleton.cuh"
#include "wgmma.cuh"

namespace qattn::cuda::flash::sm90 {

constexpr int kWarpgroupRows = 64;

// Shapes: kWarpgroups warpgroups, 64 rows each, share a block.
template <int kHeadDim_, int kWarpgroups_, int kBlockN_>
struct ForwardTraits {
  static constexpr int kHeadDim = kHeadDim_, kThreads = 128 * kWarpgroups_;
  static constexpr int kBlockM = kWarpgroupRows * kWarpgroups_;  // query rows per block
  static constexpr int kBlockN = kBlockN_;                       // keys per step
  // Q tile, then two stages of (K tile, V tile).
  static constexpr int kSmemBytes = (kBlockM + 4 * kBlockN) * kHeadDim * 2;
};

template <int kHeadDim_, int kWarpgroups_, int kBlockM_>
struct DkDvTraits {
  static constexpr int kHeadDim = kHeadDim_, kThreads = 128 * kWarpgroups_;
  static constexpr int kBlockN = kWarpgroupRows * kWarpgroups_;  // keys per block
  static constexpr int kBlockM = kBlockM_;                       // query rows per step
  // K and V tiles, two stages of (Q tile, dO tile), two stages of (L, δ).
  static constexpr int kSmemBytes = (2 * kBlockN + 4 * kBlockM) * kHeadDim * 2 + 4 * kBlockM * 4;
};

template <int kHeadDim_, int kWarpgroups_, int kBlockN_>
struct DqTraits {
  static constexpr int kHeadDim = kHeadDim_, kThreads = 128 * kWarpgroups_;
  static constexpr int kBlockM = kWarpgroupRows * kWarpgroups_;  // query rows per block
  static constexpr int kBlockN = kBlockN_;                       // keys per step
  // Q and dO tiles, two stages of (K tile, V tile).
  static constexpr int kSmemBytes = (2 * kBlockM + 4 * kBlockN) * kHeadDim * 2;
};

// First row of the calling warpgroup within the block, and of its warp.
__device__ __forceinline__ int warpgroup_row0() { return (threadIdx.x / 128) * kWarpgroupRows; }
__device__ __forceinline__ int warp_row0() { return (threadIdx.x / 32) * 16; }

// ---------------------------------------------------------------------------
// Forward. Grid (ceil(T / kBlockM), H, B); the heaviest (last) query blocks start first.
template <class Tr, class Softmax>
__global__ void __launch_bounds__(Tr::kThreads, 1) flash_forward_kernel(const ForwardParams p) {
#if QATTN_SM90A_DEVICE
  constexpr int D = Tr::kHeadDim, BM = Tr::kBlockM, BN = Tr::kBlockN;
  extern __shared__ __align__(1024) unsigned char smem[];
  const SmemTile<BM, D> q_tile{reinterpret_cast<bf16*>(smem)};  // (BM, d)
  bf16* kv_stages = q_tile.data + BM * D;                       // 2 x [(BN, d) K, (BN, d) V]

  const int q_block = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int q0 = q_block * BM;
  const int wg_row0 = warpgroup_row0();
  const int row_first = q0 + warp_row0();  // first query row of the warp
  const int wg_row_last = q0 + wg_row0 + kWarpgroupRows - 1;
  const size_t ld = static_cast<size_t>(3) * p.H * D;
  const bf16* q_src = p.qkv + qkv_offset(b, 0, 0, h, p.T, p.H, D);  // (T, d), row stride ld
  const KvStages<Tr> kv{kv_stages, p.qkv + qkv_offset(b, 0, 1, h, p.T, p.H, D),
                        p.qkv + qkv_offset(b, 0, 2, h, p.T, p.H, D), ld, p.T};
  auto load_kv = [&](int j, int s) { kv.load(j, s); };

  load_tile_async<Tr::kThreads>(q_tile, q_src + q0 * ld, ld, p.T - q0);
  const int n_kblocks = (min(p.T, q0 + BM) + BN - 1) / BN;  // causal: up to the last row

  float o_acc[1][D / 8][4];  // (64, d) rows of O of the warpgroup; this warp's 16
  float s[1][BN / 8][4];     // (64, BN) scores, then weights
  zero(o_acc);
  Softmax softmax(p.scale_log2);
  pipelined<true>(0, n_kblocks, load_kv, [&](int j, int stage) {
    const int k0 = j * BN;
    if (k0 > wg_row_last) return;  // every key is in the future of every row of the warpgroup
    product_ss(s, q_tile, wg_row0, kv.k(stage));
    if (k0 + BN - 1 > row_first) {  // the diagonal: hide keys after the query
      for_each_acc<1, BN / 8>([&](int mt, int nt, int e) {
        if (k0 + acc_col(nt, e) > row_first + acc_row(mt, e)) s[mt][nt][e] = -INFINITY;
      });
    }
    softmax.update(s, o_acc);  // s now holds the weights
    product_rs(o_acc, s, kv.v(stage));
  });

  softmax.finalize(o_acc);
  softmax.store_lse(p.lse + (static_cast<size_t>(b) * p.H + h) * p.T, row_first, p.T);
  store_acc(q_tile, o_acc, warp_row0(), 1.0f);  // the Q tile is free (pipelined ends on a barrier)
  __syncthreads();
  store_tile<Tr::kThreads>(q_tile, p.o + head_offset(b, q0, h, p.T, p.H, D),
                           static_cast<size_t>(p.H) * D, p.T - q0);
#endif
}

// ---------------------------------------------------------------------------
// dK, dV of one key block; each warpgroup owns 64 keys and computes the
// transposed tiles Sᵀ, Pᵀ, dPᵀ, dSᵀ (keys x queries), as flash_skeleton.cuh.
template <class Tr, class Softmax>
__device__ __forceinline__ void backward_dkdv_block(const BackwardParams p, int k_block,
                                                    unsigned char* smem) {
  constexpr int D = Tr::kHeadDim, BM = Tr::kBlockM, BN = Tr::kBlockN;
  const SmemTile<BN, D> k_tile{reinterpret_cast<bf16*>(smem)};  // (BN, d)
  const SmemTile<BN, D> v_tile{k_tile.data + BN * D};           // (BN, d)
  bf16* q_stages = v_tile.data + BN * D;                        // 2 x [(BM, d) Q, (BM, d) dO]
  float* stat_stages = reinterpret_cast<float*>(q_stages + 4 * BM * D);  // 2 x [(BM) L, (BM) δ]

  const int h = blockIdx.y, b = blockIdx.z;
  const int k0 = k_block * BN;
  const int wg_row0 = warpgroup_row0();
  const int wg_key0 = k0 + wg_row0;          // first key of the warpgroup
  const int warp_key0 = k0 + warp_row0();    // first key of the warp
  const size_t ld = static_cast<size_t>(3) * p.H * D, ld_o = static_cast<size_t>(p.H) * D;
  const size_t stat0 = (static_cast<size_t>(b) * p.H + h) * p.T;  // (b, h) slice of L and δ
  const bf16* q_src = p.qkv + qkv_offset(b, 0, 0, h, p.T, p.H, D);
  const bf16* do_src = p.dout + head_offset(b, 0, h, p.T, p.H, D);
  auto q_stage = [&](int s) { return SmemTile<BM, D>{q_stages + (2 * s) * BM * D}; };
  auto do_stage = [&](int s) { return SmemTile<BM, D>{q_stages + (2 * s + 1) * BM * D}; };
  auto lse_stage = [&](int s) { return stat_stages + (2 * s) * BM; };
  auto delta_stage = [&](int s) { return stat_stages + (2 * s + 1) * BM; };
  auto load_queries = [&](int i, int s) {
    const int q0 = i * BM;
    load_tile_async<Tr::kThreads>(q_stage(s), q_src + q0 * ld, ld, p.T - q0);
    load_tile_async<Tr::kThreads>(do_stage(s), do_src + q0 * ld_o, ld_o, p.T - q0);
    load_row_values_async<Tr::kThreads, BM>(lse_stage(s), p.lse + stat0 + q0, p.T - q0);
    load_row_values_async<Tr::kThreads, BM>(delta_stage(s), p.delta + stat0 + q0, p.T - q0);
  };

  load_tile_async<Tr::kThreads>(k_tile, p.qkv + qkv_offset(b, k0, 1, h, p.T, p.H, D), ld, p.T - k0);
  load_tile_async<Tr::kThreads>(v_tile, p.qkv + qkv_offset(b, k0, 2, h, p.T, p.H, D), ld, p.T - k0);

  float dk_acc[1][D / 8][4], dv_acc[1][D / 8][4];  // (64, d) rows of dK, dV of the warpgroup
  zero(dk_acc);
  zero(dv_acc);
  pipelined<true>(k0 / BM, (p.T + BM - 1) / BM, load_queries, [&](int i, int s) {
    const int q0 = i * BM;
    // Skip when every key of the warpgroup is after every query of the block, or past T.
    if (wg_key0 > q0 + BM - 1 || wg_key0 >= p.T) return;
    const float* lse = lse_stage(s);
    const float* delta = delta_stage(s);
    float w[1][BM / 8][4];  // (64 keys, BM queries): Sᵀ, then Pᵀ, then dSᵀ
    product_ss(w, k_tile, wg_row0, q_stage(s));
    for_each_acc<1, BM / 8>([&](int mt, int nt, int e) {
      const int key = warp_key0 + acc_row(mt, e), qi = acc_col(nt, e), query = q0 + qi;
      w[mt][nt][e] = (query < p.T && key <= query)
                         ? Softmax::probability(w[mt][nt][e], lse[qi], p.scale_log2)
                         : 0.0f;
    });
    product_rs(dv_acc, w, do_stage(s));
    float dp[1][BM / 8][4];  // (64 keys, BM queries): dPᵀ
    product_ss(dp, v_tile, wg_row0, do_stage(s));
    for_each_acc<1, BM / 8>([&](int mt, int nt, int e) {
      w[mt][nt][e] = Softmax::grad_score(w[mt][nt][e], dp[mt][nt][e], delta[acc_col(nt, e)]);
    });
    product_rs(dk_acc, w, q_stage(s));
  });

  // K and V tiles are free (pipelined ends on a barrier): stage dK (times c) and dV there.
  store_acc(k_tile, dk_acc, warp_row0(), p.scale);
  store_acc(v_tile, dv_acc, warp_row0(), 1.0f);
  __syncthreads();
  store_tile<Tr::kThreads>(k_tile, p.dqkv + qkv_offset(b, k0, 1, h, p.T, p.H, D), ld, p.T - k0);
  store_tile<Tr::kThreads>(v_tile, p.dqkv + qkv_offset(b, k0, 2, h, p.T, p.H, D), ld, p.T - k0);
}

// dQ of one query block; each warpgroup owns 64 query rows.
template <class Tr, class Softmax>
__device__ __forceinline__ void backward_dq_block(const BackwardParams p, int q_block,
                                                  unsigned char* smem) {
  constexpr int D = Tr::kHeadDim, BM = Tr::kBlockM, BN = Tr::kBlockN;
  const SmemTile<BM, D> q_tile{reinterpret_cast<bf16*>(smem)};  // (BM, d)
  const SmemTile<BM, D> do_tile{q_tile.data + BM * D};          // (BM, d)
  bf16* kv_stages = do_tile.data + BM * D;                      // 2 x [(BN, d) K, (BN, d) V]

  const int h = blockIdx.y, b = blockIdx.z;
  const int q0 = q_block * BM;
  const int wg_row0 = warpgroup_row0();
  const int row_first = q0 + warp_row0();
  const int wg_row_last = q0 + wg_row0 + kWarpgroupRows - 1;
  const size_t ld = static_cast<size_t>(3) * p.H * D, ld_o = static_cast<size_t>(p.H) * D;
  const size_t stat0 = (static_cast<size_t>(b) * p.H + h) * p.T;
  const KvStages<Tr> kv{kv_stages, p.qkv + qkv_offset(b, 0, 1, h, p.T, p.H, D),
                        p.qkv + qkv_offset(b, 0, 2, h, p.T, p.H, D), ld, p.T};
  auto load_kv = [&](int j, int s) { kv.load(j, s); };

  // L and δ of this thread's two rows (rows past T: 0, never stored).
  float lse[2], delta[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row_first + acc_row(0, 2 * half);
    lse[half] = row < p.T ? p.lse[stat0 + row] : 0.0f;
    delta[half] = row < p.T ? p.delta[stat0 + row] : 0.0f;
  }

  load_tile_async<Tr::kThreads>(q_tile, p.qkv + qkv_offset(b, q0, 0, h, p.T, p.H, D), ld, p.T - q0);
  load_tile_async<Tr::kThreads>(do_tile, p.dout + head_offset(b, q0, h, p.T, p.H, D), ld_o,
                                p.T - q0);
  const int n_kblocks = (min(p.T, q0 + BM) + BN - 1) / BN;

  float dq_acc[1][D / 8][4];  // (64, d) rows of dQ of the warpgroup
  zero(dq_acc);
  pipelined<true>(0, n_kblocks, load_kv, [&](int j, int s) {
    const int k0 = j * BN;
    if (k0 > wg_row_last) return;
    float w[1][BN / 8][4];  // (64 queries, BN keys): S, then P, then dS
    product_ss(w, q_tile, wg_row0, kv.k(s));
    for_each_acc<1, BN / 8>([&](int mt, int nt, int e) {
      w[mt][nt][e] = k0 + acc_col(nt, e) <= row_first + acc_row(mt, e)
                         ? Softmax::probability(w[mt][nt][e], lse[e / 2], p.scale_log2)
                         : 0.0f;
    });
    float dp[1][BN / 8][4];  // (64 queries, BN keys): dP
    product_ss(dp, do_tile, wg_row0, kv.v(s));
    for_each_acc<1, BN / 8>([&](int mt, int nt, int e) {
      w[mt][nt][e] = Softmax::grad_score(w[mt][nt][e], dp[mt][nt][e], delta[e / 2]);
    });
    product_rs(dq_acc, w, kv.k(s));
  });

  store_acc(q_tile, dq_acc, warp_row0(), p.scale);
  __syncthreads();
  store_tile<Tr::kThreads>(q_tile, p.dqkv + qkv_offset(b, q0, 0, h, p.T, p.H, D), ld, p.T - q0);
}

// The dQ half as a launch of its own (grid as in flash_backward_dq_kernel of
// flash_skeleton.cuh), for K-interval's probability-STE backward.
template <class Tr, class Softmax>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    flash_backward_dq_kernel(const BackwardParams p) {
#if QATTN_SM90A_DEVICE
  extern __shared__ __align__(1024) unsigned char smem[];
  backward_dq_block<Tr, Softmax>(p, gridDim.x - 1 - blockIdx.x, smem);
#endif
}

// The backward as one launch, grid and block order as flash_backward_kernel.
template <class DkDvTr, class DqTr, class Softmax>
__global__ void __launch_bounds__(DkDvTr::kThreads, 1) flash_backward_kernel(const BackwardParams p) {
#if QATTN_SM90A_DEVICE
  static_assert(DkDvTr::kThreads == DqTr::kThreads,
                "both halves of the launch share its block size");
  extern __shared__ __align__(1024) unsigned char smem[];
  const int n_kv_blocks = (p.T + DkDvTr::kBlockN - 1) / DkDvTr::kBlockN;
  if (static_cast<int>(blockIdx.x) < n_kv_blocks)
    backward_dkdv_block<DkDvTr, Softmax>(p, blockIdx.x, smem);
  else
    backward_dq_block<DqTr, Softmax>(p, gridDim.x - 1 - blockIdx.x, smem);
#endif
}

}  // namespace qattn::cuda::flash::sm90
