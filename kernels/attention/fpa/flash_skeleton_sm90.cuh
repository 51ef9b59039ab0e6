// FPA's kernels on Hopper (sm_90a): warpgroup MMA (wgmma) for the products,
// the tensor memory accelerator (TMA) for the copies, with the same masks,
// softmax (OnlineSoftmax) and memory layout as flash_skeleton.cuh. What changes
// with the instructions:
//   - A warpgroup (4 warps) owns 64 rows of the resident tile; every branch
//     around a product (causal skips) is uniform over the warpgroup, as wgmma is
//     collective. Operands stay in shared memory (read by descriptor); only P and
//     dS go from accumulators to registers.
//   - Warp specialisation (warpgroups.cuh): a producer warpgroup (one thread
//     issuing TMA copies, in the dK/dV pass one more warp staging L and δ) fills
//     a ring of stages guarded by mbarriers (TmaFeed, feeds.cuh); the consumer
//     warpgroups never meet at a block-wide barrier inside the loop, so one can
//     compute its softmax while the other's products run on the tensor cores.
//     The forward's steps alternate K_j and V_j, each in a stage of its own, so
//     that S = Q Kᵀ starts before V lands.
// The accumulator layout per warp is the mma.sync one, so the softmax
// (online_softmax.cuh) and the element walks (for_each_acc) are shared as is.
// Products are bf16 x bf16 -> fp32 (FPA's precision); the backward is the
// deterministic 7-product form of flash_skeleton.cuh.
//
// Kernels compiled for another target (sm_80) keep an empty body: the
// launchers pick these only on a device of compute capability 9.x
// (fpa_wgmma_available), for which the build carries sm_90a code.
#pragma once
#include "attention/common/feeds.cuh"
#include "attention/common/online_softmax.cuh"
#include "attention/common/tma.cuh"
#include "attention/common/warpgroups.cuh"
#include "attention/common/wgmma.cuh"
#include "attention/fpa/flash_skeleton.cuh"

namespace qattn::cuda::flash::sm90 {

// Shapes: kWarpgroups warpgroups, 64 rows each, share a block; kStages-deep
// rings (the forward's: kStages K tiles and kStages V tiles).
template <int kHeadDim_, int kWarpgroups_, int kBlockN_, int kStages_ = 2>
struct ForwardTraits {
  static constexpr int kHeadDim = kHeadDim_, kWarpgroups = kWarpgroups_, kStages = kStages_;
  static constexpr int kThreads = block_threads<kWarpgroups_>();
  static constexpr int kBlockM = kWarpgroupRows * kWarpgroups_;  // query rows per block
  static constexpr int kBlockN = kBlockN_;                       // keys per step
  // Steps alternate K_j and V_j, one (kBlockN, d) tile each.
  using Feed = TmaFeed<128 * kWarpgroups_, false, 2 * kStages_>;
  // Q tile, 2 kStages K or V tiles, then the barriers.
  static constexpr int kTileBytes = (kBlockM + 2 * kStages * kBlockN) * kHeadDim * 2;
  static constexpr int kSmemBytes = kTileBytes + Feed::kBarrierBytes;
};

template <int kHeadDim_, int kWarpgroups_, int kBlockM_, int kStages_ = 2>
struct DkDvTraits {
  static constexpr int kHeadDim = kHeadDim_, kWarpgroups = kWarpgroups_, kStages = kStages_;
  static constexpr int kThreads = block_threads<kWarpgroups_>();
  static constexpr int kBlockN = kWarpgroupRows * kWarpgroups_;  // keys per block
  static constexpr int kBlockM = kBlockM_;                       // query rows per step
  using Feed = TmaFeed<128 * kWarpgroups_, true, kStages_>;      // with the (L, δ) rows
  // K and V tiles, kStages (Q tile, dO tile) pairs, kStages (L, δ) pairs, then the barriers.
  static constexpr int kTileBytes = (2 * kBlockN + 2 * kStages * kBlockM) * kHeadDim * 2;
  static constexpr int kStatBytes = kStages * 2 * kBlockM * 4;
  static constexpr int kSmemBytes = kTileBytes + kStatBytes + Feed::kBarrierBytes;
};

template <int kHeadDim_, int kWarpgroups_, int kBlockN_, int kStages_ = 2>
struct DqTraits {
  static constexpr int kHeadDim = kHeadDim_, kWarpgroups = kWarpgroups_, kStages = kStages_;
  static constexpr int kThreads = block_threads<kWarpgroups_>();
  static constexpr int kBlockM = kWarpgroupRows * kWarpgroups_;  // query rows per block
  static constexpr int kBlockN = kBlockN_;                       // keys per step
  using Feed = TmaFeed<128 * kWarpgroups_, false, kStages_>;
  // Q and dO tiles, kStages (K tile, V tile) pairs, then the barriers.
  static constexpr int kTileBytes = (2 * kBlockM + 2 * kStages * kBlockN) * kHeadDim * 2;
  static constexpr int kSmemBytes = kTileBytes + Feed::kBarrierBytes;
};

// FPA's tiles on Hopper (fpa.cu; K-interval's probability STE runs FPA's dQ blocks).
template <int D>
using FpaTiles = KernelTiles<ForwardTraits<D, 2, 128>, DkDvTraits<D, 2, 64>, DqTraits<D, 2, 64>>;

// Kernel parameters: the skeleton's, and the activations as TMA tensor maps
// (qkv: (B T, 3 H d); dout: (B T, H d)). __grid_constant__ keeps the maps in
// parameter memory, where the copy engine reads them.
struct ForwardTmaParams {
  ForwardParams p;
  CUtensorMap qkv;
};
struct BackwardTmaParams {
  BackwardParams p;
  CUtensorMap qkv, dout;
};

inline ForwardTmaParams tma_params(const ForwardParams& p, int d) {
  const uint64_t rows = static_cast<uint64_t>(p.B) * p.T, cols = 3ull * p.H * d;
  return {p, make_tensor_map(p.qkv, rows, cols, cols)};
}
inline BackwardTmaParams tma_params(const BackwardParams& p, int d) {
  const uint64_t rows = static_cast<uint64_t>(p.B) * p.T, cols = 3ull * p.H * d;
  return {p, make_tensor_map(p.qkv, rows, cols, cols),
          make_tensor_map(p.dout, rows, cols / 3, cols / 3)};
}

// ---------------------------------------------------------------------------
// Forward. Grid (ceil(T / kBlockM), H, B); every head's heaviest (last) query block starts
// first (block_by_rank).
// The producer copies Q, then K_j and V_j as steps 2j and 2j + 1 of the ring, so
// S_j = Q K_jᵀ starts while V_j is still on its way. Per consumer warpgroup and key block j:
//   S = c Q Kᵀ -> causal mask -> online softmax (m, l; O rescaled) -> O += P V;
//   at the end O /= l and L = c m + log l.
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    flash_forward_kernel(const __grid_constant__ ForwardTmaParams params) {
#if QATTN_SM90A_DEVICE
  constexpr int D = Tr::kHeadDim, BM = Tr::kBlockM, BN = Tr::kBlockN;
  using Feed = typename Tr::Feed;
  const ForwardParams& p = params.p;
  extern __shared__ __align__(1024) unsigned char smem[];
  const SmemTile<BM, D> q_tile{reinterpret_cast<bf16*>(smem)};  // (BM, d)
  bf16* kv_tiles = q_tile.data + BM * D;                        // 2 kStages x (BN, d): K or V
  auto kv_tile = [&](int stage) { return SmemTile<BN, D>{kv_tiles + stage * BN * D}; };

  const BlockIndex at = last_first(block_by_rank());
  const int q_block = at.block, h = at.h, b = at.b;
  const int q0 = q_block * BM;
  const int n_kblocks = (min(p.T, q0 + BM) + BN - 1) / BN;  // causal: up to the last row
  const int cols = 3 * p.H * D;
  auto resident = [&](auto& to) {
    to.tile(q_tile, activation_tile(p.qkv, &params.qkv, cols, b, p.T, q0, h * D));
  };
  auto keys_values = [&](int i, int stage, auto& to) {  // step 2j: K_j; 2j + 1: V_j
    const int slot = 1 + i % 2;
    to.tile(kv_tile(stage),
            activation_tile(p.qkv, &params.qkv, cols, b, p.T, (i / 2) * BN, (slot * p.H + h) * D));
  };
  Feed feed(smem + Tr::kTileBytes);
  if (feed.producer()) {
    feed.produce(resident, steps(0, 2 * n_kblocks, keys_values));
    return;
  }
  feed.consumer_start();

  const int wg_row0 = warpgroup_row0();
  const int row_first = q0 + warp_row0();  // first query row of the warp
  const int wg_row_last = q0 + wg_row0 + kWarpgroupRows - 1;
  float o_acc[1][D / 8][4];  // (64, d) rows of O of the warpgroup; this warp's 16
  zero(o_acc);
  OnlineSoftmax<1> softmax(p.scale_log2);
  feed.resident(resident);
  for (int j = 0; j < n_kblocks; ++j) {
    // A warpgroup whose rows all precede key block j still takes part in the
    // ring (waits and releases), so that every stage's release counts are whole.
    const int k0 = j * BN;
    const bool sees = k0 <= wg_row_last;
    float s[1][BN / 8][4];  // (64, BN) scores, then weights
    feed.consume(2 * j, 2 * j + 1, keys_values, [&](int, int stage) {
      if (sees) product_ss(s, q_tile, wg_row0, kv_tile(stage));
    });
    if (sees) {
      if (k0 + BN - 1 > row_first) {  // the diagonal: hide keys after the query
        for_each_acc<1, BN / 8>([&](int mt, int nt, int e) {
          if (k0 + acc_col(nt, e) > row_first + acc_row(mt, e)) s[mt][nt][e] = -INFINITY;
        });
      }
      softmax.update(s, o_acc);  // s now holds the weights
    }
    feed.consume(2 * j + 1, 2 * j + 2, keys_values, [&](int, int stage) {
      if (sees) product_rs(o_acc, s, kv_tile(stage));
    });
  }

  softmax.finalize(o_acc);
  softmax.store_lse(p.lse + (static_cast<size_t>(b) * p.H + h) * p.T, row_first, p.T);
  // Stage O in the Q tile: a warp writes rows only its own warpgroup's (finished) products read.
  store_acc(q_tile, o_acc, warp_row0(), 1.0f);
  feed.sync();
  store_tile<Feed::kConsumerThreads>(q_tile, p.o + head_offset(b, q0, h, p.T, p.H, D),
                                     static_cast<size_t>(p.H) * D, p.T - q0);
#endif
}

// ---------------------------------------------------------------------------
// dK, dV of one key block; each warpgroup owns 64 keys and computes the
// transposed tiles Sᵀ, Pᵀ, dPᵀ, dSᵀ (keys x queries), as flash_skeleton.cuh.
// The producer streams (Q, dO) of each query block by TMA, and a second
// producer warp their (L, δ) with ordinary loads and stores (a TMA row copy
// would need T to be a multiple of 4).
template <class Tr>
__device__ __forceinline__ void backward_dkdv_block(const BackwardTmaParams& params, BlockIndex at,
                                                    unsigned char* smem) {
  constexpr int D = Tr::kHeadDim, BM = Tr::kBlockM, BN = Tr::kBlockN;
  using Feed = typename Tr::Feed;
  const BackwardParams& p = params.p;
  const SmemTile<BN, D> k_tile{reinterpret_cast<bf16*>(smem)};  // (BN, d)
  const SmemTile<BN, D> v_tile{k_tile.data + BN * D};           // (BN, d)
  bf16* q_tiles = v_tile.data + BN * D;                         // kStages x [(BM, d) Q, (BM, d) dO]
  float* stat_slots =
      reinterpret_cast<float*>(smem + Tr::kTileBytes);  // kStages x [(BM) L, (BM) δ]
  auto q_tile = [&](int stage) { return SmemTile<BM, D>{q_tiles + 2 * stage * BM * D}; };
  auto do_tile = [&](int stage) { return SmemTile<BM, D>{q_tiles + (2 * stage + 1) * BM * D}; };
  auto lse_slot = [&](int stage) { return stat_slots + 2 * stage * BM; };
  auto delta_slot = [&](int stage) { return stat_slots + (2 * stage + 1) * BM; };

  const int h = at.h, b = at.b;
  const int k0 = at.block * BN;
  const size_t stat0 = (static_cast<size_t>(b) * p.H + h) * p.T;  // (b, h) slice of L and δ
  const int cols = 3 * p.H * D;
  auto resident = [&](auto& to) {
    to.tile(k_tile, activation_tile(p.qkv, &params.qkv, cols, b, p.T, k0, (p.H + h) * D));
    to.tile(v_tile, activation_tile(p.qkv, &params.qkv, cols, b, p.T, k0, (2 * p.H + h) * D));
  };
  auto queries = [&](int i, int stage, auto& to) {
    const int q0 = i * BM;
    to.tile(q_tile(stage), activation_tile(p.qkv, &params.qkv, cols, b, p.T, q0, h * D));
    to.tile(do_tile(stage), activation_tile(p.dout, &params.dout, p.H * D, b, p.T, q0, h * D));
    to.rows([&](int thread, int threads, auto copier) {  // rows past T read as 0
      for (int r = thread; r < BM; r += threads) {
        const bool valid = q0 + r < p.T;
        copier.copy4(lse_slot(stage) + r, p.lse + stat0 + q0 + r, valid);
        copier.copy4(delta_slot(stage) + r, p.delta + stat0 + q0 + r, valid);
      }
    });
  };
  // Causal: queries before the block's first key see none of it.
  const int i_first = k0 / BM, i_last = (p.T + BM - 1) / BM;
  Feed feed(smem + Tr::kTileBytes + Tr::kStatBytes);
  if (feed.producer()) {
    feed.produce(resident, steps(i_first, i_last, queries));
    return;
  }
  feed.consumer_start();

  const int wg_row0 = warpgroup_row0();
  const int wg_key0 = k0 + wg_row0;                // first key of the warpgroup
  const int warp_key0 = k0 + warp_row0();          // first key of the warp
  float dk_acc[1][D / 8][4], dv_acc[1][D / 8][4];  // (64, d) rows of dK, dV of the warpgroup
  zero(dk_acc);
  zero(dv_acc);
  feed.resident(resident);
  feed.consume(i_first, i_last, queries, [&](int i, int stage) {
    const int q0 = i * BM;
    // Skip when every key of the warpgroup is after every query of the block, or past T.
    if (wg_key0 > q0 + BM - 1 || wg_key0 >= p.T) return;
    const float* lse = lse_slot(stage);
    const float* delta = delta_slot(stage);
    float w[1][BM / 8][4];   // (64 keys, BM queries): Sᵀ, then Pᵀ, then dSᵀ
    float dp[1][BM / 8][4];  // (64 keys, BM queries): dPᵀ
    issue_ss(w, k_tile, wg_row0, q_tile(stage));
    issue_ss(dp, v_tile, wg_row0, do_tile(stage));  // runs while Pᵀ is computed
    wait_for<1>(w);
    for_each_acc<1, BM / 8>([&](int mt, int nt, int e) {
      const int key = warp_key0 + acc_row(mt, e), qi = acc_col(nt, e), query = q0 + qi;
      w[mt][nt][e] = (query < p.T && key <= query)
                         ? OnlineSoftmax<1>::probability(w[mt][nt][e], lse[qi], p.scale_log2)
                         : 0.0f;
    });
    product_rs(dv_acc, w, do_tile(stage));  // its wait covers dPᵀ's group too
    wait_for<0>(dp);
    for_each_acc<1, BM / 8>([&](int mt, int nt, int e) {
      w[mt][nt][e] =
          OnlineSoftmax<1>::grad_score(w[mt][nt][e], dp[mt][nt][e], delta[acc_col(nt, e)]);
    });
    product_rs(dk_acc, w, q_tile(stage));
  });

  // K and V tiles are free once every consumer is past its last product: stage
  // dK (times c) and dV there, then store both.
  feed.sync();
  store_acc(k_tile, dk_acc, warp_row0(), p.scale);
  store_acc(v_tile, dv_acc, warp_row0(), 1.0f);
  feed.sync();
  const size_t ld = static_cast<size_t>(3) * p.H * D;
  store_tile<Feed::kConsumerThreads>(k_tile, p.dqkv + qkv_offset(b, k0, 1, h, p.T, p.H, D), ld,
                                     p.T - k0);
  store_tile<Feed::kConsumerThreads>(v_tile, p.dqkv + qkv_offset(b, k0, 2, h, p.T, p.H, D), ld,
                                     p.T - k0);
}

// dQ of one query block; each warpgroup owns 64 query rows. The producer
// streams (K, V) of each key block.
template <class Tr>
__device__ __forceinline__ void backward_dq_block(const BackwardTmaParams& params, BlockIndex at,
                                                  unsigned char* smem) {
  constexpr int D = Tr::kHeadDim, BM = Tr::kBlockM, BN = Tr::kBlockN;
  using Feed = typename Tr::Feed;
  const BackwardParams& p = params.p;
  const SmemTile<BM, D> q_tile{reinterpret_cast<bf16*>(smem)};  // (BM, d)
  const SmemTile<BM, D> do_tile{q_tile.data + BM * D};          // (BM, d)
  bf16* kv_tiles = do_tile.data + BM * D;                       // kStages x [(BN, d) K, (BN, d) V]
  auto k_tile = [&](int stage) { return SmemTile<BN, D>{kv_tiles + 2 * stage * BN * D}; };
  auto v_tile = [&](int stage) { return SmemTile<BN, D>{kv_tiles + (2 * stage + 1) * BN * D}; };

  const int q_block = at.block, h = at.h, b = at.b;
  const int q0 = q_block * BM;
  const int n_kblocks = (min(p.T, q0 + BM) + BN - 1) / BN;
  const int cols = 3 * p.H * D;
  auto resident = [&](auto& to) {
    to.tile(q_tile, activation_tile(p.qkv, &params.qkv, cols, b, p.T, q0, h * D));
    to.tile(do_tile, activation_tile(p.dout, &params.dout, p.H * D, b, p.T, q0, h * D));
  };
  auto keys = [&](int j, int stage, auto& to) {
    to.tile(k_tile(stage),
            activation_tile(p.qkv, &params.qkv, cols, b, p.T, j * BN, (p.H + h) * D));
    to.tile(v_tile(stage),
            activation_tile(p.qkv, &params.qkv, cols, b, p.T, j * BN, (2 * p.H + h) * D));
  };
  Feed feed(smem + Tr::kTileBytes);
  if (feed.producer()) {
    feed.produce(resident, steps(0, n_kblocks, keys));
    return;
  }
  feed.consumer_start();

  const int wg_row0 = warpgroup_row0();
  const int row_first = q0 + warp_row0();
  const int wg_row_last = q0 + wg_row0 + kWarpgroupRows - 1;
  const size_t stat0 = (static_cast<size_t>(b) * p.H + h) * p.T;
  // L and δ of this thread's two rows (rows past T: 0, never stored).
  float lse[2], delta[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row_first + acc_row(0, 2 * half);
    lse[half] = row < p.T ? p.lse[stat0 + row] : 0.0f;
    delta[half] = row < p.T ? p.delta[stat0 + row] : 0.0f;
  }
  float dq_acc[1][D / 8][4];  // (64, d) rows of dQ of the warpgroup
  zero(dq_acc);
  feed.resident(resident);
  feed.consume(0, n_kblocks, keys, [&](int j, int stage) {
    const int k0 = j * BN;
    if (k0 > wg_row_last) return;
    float w[1][BN / 8][4];   // (64 queries, BN keys): S, then P, then dS
    float dp[1][BN / 8][4];  // (64 queries, BN keys): dP
    issue_ss(w, q_tile, wg_row0, k_tile(stage));
    issue_ss(dp, do_tile, wg_row0, v_tile(stage));  // runs while P is computed
    wait_for<1>(w);
    for_each_acc<1, BN / 8>([&](int mt, int nt, int e) {
      w[mt][nt][e] = k0 + acc_col(nt, e) <= row_first + acc_row(mt, e)
                         ? OnlineSoftmax<1>::probability(w[mt][nt][e], lse[e / 2], p.scale_log2)
                         : 0.0f;
    });
    wait_for<0>(dp);
    for_each_acc<1, BN / 8>([&](int mt, int nt, int e) {
      w[mt][nt][e] = OnlineSoftmax<1>::grad_score(w[mt][nt][e], dp[mt][nt][e], delta[e / 2]);
    });
    product_rs(dq_acc, w, k_tile(stage));
  });

  // Stage dQ (times c) in the Q tile: a warp writes rows only its own warpgroup read.
  store_acc(q_tile, dq_acc, warp_row0(), p.scale);
  feed.sync();
  store_tile<Feed::kConsumerThreads>(q_tile, p.dqkv + qkv_offset(b, q0, 0, h, p.T, p.H, D),
                                     static_cast<size_t>(3) * p.H * D, p.T - q0);
}

// The dQ half as a launch of its own (grid (ceil(T / kBlockM), H, B)), for
// K-interval's probability-STE backward, which needs FPA's dQ.
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    flash_backward_dq_kernel(const __grid_constant__ BackwardTmaParams params) {
#if QATTN_SM90A_DEVICE
  extern __shared__ __align__(1024) unsigned char smem[];
  backward_dq_block<Tr>(params, last_first(block_by_rank()), smem);
#endif
}

// The backward as one launch, grid as flash_backward_kernel's, blocks ranked over
// all heads (block_by_rank): dK/dV blocks first (key block 0, which sees every
// query, leading), then dQ blocks (the last query block leading).
template <class DkDvTr, class DqTr>
__global__ void __launch_bounds__(DkDvTr::kThreads, 1)
    flash_backward_kernel(const __grid_constant__ BackwardTmaParams params) {
#if QATTN_SM90A_DEVICE
  static_assert(DkDvTr::kThreads == DqTr::kThreads,
                "both halves of the launch share its block size");
  extern __shared__ __align__(1024) unsigned char smem[];
  const int n_kv_blocks = (params.p.T + DkDvTr::kBlockN - 1) / DkDvTr::kBlockN;
  const BlockIndex at = block_by_rank();
  if (at.block < n_kv_blocks)
    backward_dkdv_block<DkDvTr>(params, at, smem);
  else
    backward_dq_block<DqTr>(params, last_first(at), smem);
#endif
}

}  // namespace qattn::cuda::flash::sm90
