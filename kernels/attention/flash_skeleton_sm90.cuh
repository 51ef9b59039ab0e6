// The flash skeleton on Hopper (sm_90a): warpgroup MMA (wgmma) for the
// products, the tensor memory accelerator (TMA) for the copies, with the same
// masks, Softmax policy and memory layout as flash_skeleton.cuh. What changes
// with the instructions:
//   - A warpgroup (4 warps) owns 64 rows of the resident tile; every branch
//     around a product (causal skips) is uniform over the warpgroup, as wgmma is
//     collective. Operands stay in shared memory (read by descriptor); only P and
//     dS go from accumulators to registers.
//   - Warp specialisation: a producer warpgroup (one thread issuing TMA copies,
//     in the backward one more warp staging L and δ) fills rings of stages
//     guarded by mbarriers (tma.cuh); the consumer warpgroups never meet at a
//     block-wide barrier inside the loop, so one can compute its softmax while
//     the other's products run on the tensor cores. feeds.cuh generalises this
//     for kernels written once for both families (K-interval); FPA's forward
//     keeps separate K and V rings so that S = Q Kᵀ starts before V lands.
// The accumulator layout per warp is the mma.sync one, so the Softmax policy
// (online_softmax.cuh) and the element walks (for_each_acc) are shared as is.
// Products are bf16 x bf16 -> fp32 (FPA's precision); the backward is the
// deterministic 7-product form of flash_skeleton.cuh.
//
// Kernels compiled for another target (sm_80) keep an empty body: the
// launchers pick these only on a device of compute capability 9.x
// (fpa_wgmma_available), for which the build carries sm_90a code.
#pragma once
#include "flash_skeleton.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace qattn::cuda::flash::sm90 {

constexpr int kWarpgroupRows = 64;

// Threads of a block: two or three consumer warpgroups (warps 0 .. 4 kWarpgroups - 1),
// then a producer warpgroup, of which one thread issues the copies. The producer
// gives its registers to the consumers (setmaxnreg): 2 x 128 x 240 + 128 x 24 and
// 3 x 128 x 160 + 128 x 24 fit the SM's 64 K. Three warpgroups give each warp
// scheduler a third warp to switch to where the element-wise work per score is
// long (K-interval's forward at d = 64), at 160 registers a thread.
template <int kWarpgroups>
constexpr int block_threads() {
  static_assert(kWarpgroups == 2 || kWarpgroups == 3,
                "the register split below is for two or three consumer warpgroups");
  return 128 * (kWarpgroups + 1);
}
template <int kWarpgroups>
__host__ __device__ constexpr int consumer_register_count() {
  return kWarpgroups == 2 ? 240 : 160;
}
constexpr int kProducerRegisters = 24;
static_assert(2 * 128 * consumer_register_count<2>() + 128 * kProducerRegisters <= 65536 &&
              3 * 128 * consumer_register_count<3>() + 128 * kProducerRegisters <= 65536);

// Shapes: kWarpgroups warpgroups, 64 rows each, share a block; kStages-deep rings.
template <int kHeadDim_, int kWarpgroups_, int kBlockN_, int kStages_ = 2>
struct ForwardTraits {
  static constexpr int kHeadDim = kHeadDim_, kWarpgroups = kWarpgroups_, kStages = kStages_;
  static constexpr int kThreads = block_threads<kWarpgroups_>();
  static constexpr int kBlockM = kWarpgroupRows * kWarpgroups_;  // query rows per block
  static constexpr int kBlockN = kBlockN_;                       // keys per step
  // Q tile, kStages K tiles, kStages V tiles, then the barriers.
  static constexpr int kTileBytes = (kBlockM + 2 * kStages * kBlockN) * kHeadDim * 2;
  static constexpr int kSmemBytes = kTileBytes + (1 + 4 * kStages) * 8;
};

template <int kHeadDim_, int kWarpgroups_, int kBlockM_, int kStages_ = 2>
struct DkDvTraits {
  static constexpr int kHeadDim = kHeadDim_, kWarpgroups = kWarpgroups_, kStages = kStages_;
  static constexpr int kThreads = block_threads<kWarpgroups_>();
  static constexpr int kBlockN = kWarpgroupRows * kWarpgroups_;  // keys per block
  static constexpr int kBlockM = kBlockM_;                       // query rows per step
  // K and V tiles, kStages (Q tile, dO tile) pairs, kStages (L, δ) pairs, then the barriers.
  static constexpr int kTileBytes = (2 * kBlockN + 2 * kStages * kBlockM) * kHeadDim * 2;
  static constexpr int kStatBytes = kStages * 2 * kBlockM * 4;
  static constexpr int kSmemBytes = kTileBytes + kStatBytes + (1 + 2 * kStages) * 8;
};

template <int kHeadDim_, int kWarpgroups_, int kBlockN_, int kStages_ = 2>
struct DqTraits {
  static constexpr int kHeadDim = kHeadDim_, kWarpgroups = kWarpgroups_, kStages = kStages_;
  static constexpr int kThreads = block_threads<kWarpgroups_>();
  static constexpr int kBlockM = kWarpgroupRows * kWarpgroups_;  // query rows per block
  static constexpr int kBlockN = kBlockN_;                       // keys per step
  // Q and dO tiles, kStages (K tile, V tile) pairs, then the barriers.
  static constexpr int kTileBytes = (2 * kBlockM + 2 * kStages * kBlockN) * kHeadDim * 2;
  static constexpr int kSmemBytes = kTileBytes + (1 + 2 * kStages) * 8;
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

// First row of the calling warpgroup within the block, and of its warp.
// Read through a shuffle from lane 0 so that the compiler knows the value is
// the same on every lane (threadIdx.x / 128 is, but it cannot prove it): the
// descriptors built from it then live in uniform registers, as wgmma takes them.
__device__ __forceinline__ int warpgroup_row0() {
  return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0) * kWarpgroupRows;
}
__device__ __forceinline__ int warp_row0() { return (threadIdx.x / 32) * 16; }
__device__ __forceinline__ bool is_producer(int warpgroups) {
  return static_cast<int>(threadIdx.x) >= 128 * warpgroups;
}
// The thread of the producer warpgroup that issues the copies.
__device__ __forceinline__ bool is_copy_issuer() { return threadIdx.x % 128 == 0; }
// Register reallocation between the roles, at the top of each role's branch.
__device__ __forceinline__ void producer_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
}
template <int kWarpgroups>
__device__ __forceinline__ void consumer_registers() {
  constexpr int kRegisters = consumer_register_count<kWarpgroups>();
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// A ring of kStages stages streamed by the producer: step i uses stage i % kStages.
// full[s]: the producers' arrivals (the copy issuer's with the bytes of its
// copies, and any thread that fills part of the stage with ordinary stores);
// empty[s]: one arrival per consumer thread once it no longer reads the stage.
template <int kStages>
struct Ring {
  uint64_t* full;
  uint64_t* empty;

  __device__ static int stage(int i) { return i % kStages; }
  __device__ static uint32_t parity(int i) { return (i / kStages) & 1; }
  __device__ void init(int producers, int consumers) const {
    for (int s = 0; s < kStages; ++s) {
      barrier_init(&full[s], producers);
      barrier_init(&empty[s], consumers);
    }
  }
  // Producer, before filling step i's stage: until step i - kStages released it.
  __device__ void wait_empty(int i) const {
    if (i >= kStages) barrier_wait(&empty[stage(i)], parity(i) ^ 1);
  }
  // The copy issuer: wait, then announce the bytes its copies of step i deliver.
  __device__ void acquire(int i, uint32_t bytes) const {
    wait_empty(i);
    barrier_arrive_expect_bytes(&full[stage(i)], bytes);
  }
  // A producer thread whose ordinary stores into step i's stage are done.
  __device__ void filled(int i) const { barrier_arrive(&full[stage(i)]); }
  __device__ void wait_full(int i) const { barrier_wait(&full[stage(i)], parity(i)); }
  __device__ void release(int i) const { barrier_arrive(&empty[stage(i)]); }
};

// The consumer warpgroups meet (not the producer), e.g. before staging a
// result tile that all of them then store.
template <int kWarpgroups>
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(128 * kWarpgroups) : "memory");
}

// ---------------------------------------------------------------------------
// Forward. Grid (ceil(T / kBlockM), H, B); every head's heaviest (last) query block starts
// first (block_by_rank).
// The producer copies Q, then K_j and V_j into rings of their own, so S_j = Q K_jᵀ
// starts while V_j is still on its way. Per consumer warpgroup and key block j:
//   S = c Q Kᵀ -> causal mask -> online softmax (m, l; O rescaled) -> O += P V;
//   at the end O /= l and L = c m + log l.
template <class Tr, class Softmax>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    flash_forward_kernel(const __grid_constant__ ForwardTmaParams params) {
#if QATTN_SM90A_DEVICE
  constexpr int D = Tr::kHeadDim, BM = Tr::kBlockM, BN = Tr::kBlockN, S = Tr::kStages;
  const ForwardParams& p = params.p;
  extern __shared__ __align__(1024) unsigned char smem[];
  const SmemTile<BM, D> q_tile{reinterpret_cast<bf16*>(smem)};  // (BM, d)
  bf16* k_tiles = q_tile.data + BM * D;                         // S x (BN, d)
  bf16* v_tiles = k_tiles + S * BN * D;                         // S x (BN, d)
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + Tr::kTileBytes);
  const Ring<S> k_ring{q_full + 1, q_full + 1 + S};
  const Ring<S> v_ring{q_full + 1 + 2 * S, q_full + 1 + 3 * S};
  auto k_tile = [&](int j) { return SmemTile<BN, D>{k_tiles + Ring<S>::stage(j) * BN * D}; };
  auto v_tile = [&](int j) { return SmemTile<BN, D>{v_tiles + Ring<S>::stage(j) * BN * D}; };

  const BlockIndex at = last_first(block_by_rank());
  const int q_block = at.block, h = at.h, b = at.b;
  const int q0 = q_block * BM;
  const int n_kblocks = (min(p.T, q0 + BM) + BN - 1) / BN;  // causal: up to the last row
  if (threadIdx.x == 0) {
    barrier_init(q_full, 1);
    k_ring.init(1, 128 * Tr::kWarpgroups);
    v_ring.init(1, 128 * Tr::kWarpgroups);
    barrier_init_fence();
  }
  __syncthreads();

  if (is_producer(Tr::kWarpgroups)) {
    producer_registers();
    if (is_copy_issuer()) {
      const int row0 = b * p.T, col_q = h * D, col_k = (p.H + h) * D, col_v = (2 * p.H + h) * D;
      barrier_arrive_expect_bytes(q_full, tile_bytes<BM, D>());
      tma_load_tile(q_tile, &params.qkv, row0 + q0, col_q, q_full);
      for (int j = 0; j < n_kblocks; ++j) {
        k_ring.acquire(j, tile_bytes<BN, D>());
        tma_load_tile(k_tile(j), &params.qkv, row0 + j * BN, col_k, &k_ring.full[Ring<S>::stage(j)]);
        v_ring.acquire(j, tile_bytes<BN, D>());
        tma_load_tile(v_tile(j), &params.qkv, row0 + j * BN, col_v, &v_ring.full[Ring<S>::stage(j)]);
      }
    }
    return;
  }
  consumer_registers<Tr::kWarpgroups>();

  const int wg_row0 = warpgroup_row0();
  const int row_first = q0 + warp_row0();  // first query row of the warp
  const int wg_row_last = q0 + wg_row0 + kWarpgroupRows - 1;
  float o_acc[1][D / 8][4];  // (64, d) rows of O of the warpgroup; this warp's 16
  zero(o_acc);
  Softmax softmax(p.scale_log2);
  barrier_wait(q_full, 0);
  for (int j = 0; j < n_kblocks; ++j) {
    // A warpgroup whose rows all precede key block j still takes part in the
    // rings (waits and releases), so that every stage's release counts are whole.
    const int k0 = j * BN;
    const bool sees = k0 <= wg_row_last;
    float s[1][BN / 8][4];  // (64, BN) scores, then weights
    k_ring.wait_full(j);
    if (sees) product_ss(s, q_tile, wg_row0, k_tile(j));
    k_ring.release(j);
    if (sees) {
      if (k0 + BN - 1 > row_first) {  // the diagonal: hide keys after the query
        for_each_acc<1, BN / 8>([&](int mt, int nt, int e) {
          if (k0 + acc_col(nt, e) > row_first + acc_row(mt, e)) s[mt][nt][e] = -INFINITY;
        });
      }
      softmax.update(s, o_acc);  // s now holds the weights
    }
    v_ring.wait_full(j);
    if (sees) product_rs(o_acc, s, v_tile(j));
    v_ring.release(j);
  }

  softmax.finalize(o_acc);
  softmax.store_lse(p.lse + (static_cast<size_t>(b) * p.H + h) * p.T, row_first, p.T);
  // Stage O in the Q tile: a warp writes rows only its own warpgroup's (finished) products read.
  store_acc(q_tile, o_acc, warp_row0(), 1.0f);
  consumers_sync<Tr::kWarpgroups>();
  store_tile<128 * Tr::kWarpgroups>(q_tile, p.o + head_offset(b, q0, h, p.T, p.H, D),
                                    static_cast<size_t>(p.H) * D, p.T - q0);
#endif
}

// ---------------------------------------------------------------------------
// dK, dV of one key block; each warpgroup owns 64 keys and computes the
// transposed tiles Sᵀ, Pᵀ, dPᵀ, dSᵀ (keys x queries), as flash_skeleton.cuh.
// The producer streams (Q, dO) of each query block by TMA, and a second
// producer warp their (L, δ) with ordinary loads and stores (a TMA row copy
// would need T to be a multiple of 4).
template <class Tr, class Softmax>
__device__ __forceinline__ void backward_dkdv_block(const BackwardTmaParams& params, BlockIndex at,
                                                    unsigned char* smem) {
  constexpr int D = Tr::kHeadDim, BM = Tr::kBlockM, BN = Tr::kBlockN, S = Tr::kStages;
  const BackwardParams& p = params.p;
  const SmemTile<BN, D> k_tile{reinterpret_cast<bf16*>(smem)};  // (BN, d)
  const SmemTile<BN, D> v_tile{k_tile.data + BN * D};           // (BN, d)
  bf16* q_tiles = v_tile.data + BN * D;                         // S x [(BM, d) Q, (BM, d) dO]
  float* stat_slots = reinterpret_cast<float*>(smem + Tr::kTileBytes);  // S x [(BM) L, (BM) δ]
  uint64_t* kv_full = reinterpret_cast<uint64_t*>(smem + Tr::kTileBytes + Tr::kStatBytes);
  const Ring<S> ring{kv_full + 1, kv_full + 1 + S};
  auto q_tile = [&](int i) { return SmemTile<BM, D>{q_tiles + 2 * Ring<S>::stage(i) * BM * D}; };
  auto do_tile = [&](int i) {
    return SmemTile<BM, D>{q_tiles + (2 * Ring<S>::stage(i) + 1) * BM * D};
  };
  auto lse_slot = [&](int i) { return stat_slots + 2 * Ring<S>::stage(i) * BM; };
  auto delta_slot = [&](int i) { return stat_slots + (2 * Ring<S>::stage(i) + 1) * BM; };

  const int h = at.h, b = at.b;
  const int k0 = at.block * BN;
  // Causal: queries before the block's first key see none of it.
  const int i_first = k0 / BM, n_steps = (p.T + BM - 1) / BM - i_first;
  const size_t stat0 = (static_cast<size_t>(b) * p.H + h) * p.T;  // (b, h) slice of L and δ
  if (threadIdx.x == 0) {
    barrier_init(kv_full, 1);
    ring.init(1 + 32, 128 * Tr::kWarpgroups);  // the copy issuer, the (L, δ) warp
    barrier_init_fence();
  }
  __syncthreads();

  if (is_producer(Tr::kWarpgroups)) {
    producer_registers();
    if (is_copy_issuer()) {
      const int row0 = b * p.T;
      barrier_arrive_expect_bytes(kv_full, 2 * tile_bytes<BN, D>());
      tma_load_tile(k_tile, &params.qkv, row0 + k0, (p.H + h) * D, kv_full);
      tma_load_tile(v_tile, &params.qkv, row0 + k0, (2 * p.H + h) * D, kv_full);
      for (int i = 0; i < n_steps; ++i) {
        const int q0 = (i_first + i) * BM;
        uint64_t* full = &ring.full[Ring<S>::stage(i)];
        ring.acquire(i, 2 * tile_bytes<BM, D>());
        tma_load_tile(q_tile(i), &params.qkv, row0 + q0, h * D, full);
        tma_load_tile(do_tile(i), &params.dout, row0 + q0, h * D, full);
      }
    } else if (threadIdx.x / 32 % 4 == 1) {  // the (L, δ) warp; rows past T read as 0
      for (int i = 0; i < n_steps; ++i) {
        const int q0 = (i_first + i) * BM;
        ring.wait_empty(i);
        for (int r = threadIdx.x % 32; r < BM; r += 32) {
          const bool valid = q0 + r < p.T;
          lse_slot(i)[r] = valid ? p.lse[stat0 + q0 + r] : 0.0f;
          delta_slot(i)[r] = valid ? p.delta[stat0 + q0 + r] : 0.0f;
        }
        ring.filled(i);
      }
    }
    return;
  }
  consumer_registers<Tr::kWarpgroups>();

  const int wg_row0 = warpgroup_row0();
  const int wg_key0 = k0 + wg_row0;        // first key of the warpgroup
  const int warp_key0 = k0 + warp_row0();  // first key of the warp
  float dk_acc[1][D / 8][4], dv_acc[1][D / 8][4];  // (64, d) rows of dK, dV of the warpgroup
  zero(dk_acc);
  zero(dv_acc);
  barrier_wait(kv_full, 0);
  for (int i = 0; i < n_steps; ++i) {
    const int q0 = (i_first + i) * BM;
    // Skip when every key of the warpgroup is after every query of the block, or past T.
    const bool sees = wg_key0 <= q0 + BM - 1 && wg_key0 < p.T;
    ring.wait_full(i);
    if (sees) {
      const float* lse = lse_slot(i);
      const float* delta = delta_slot(i);
      float w[1][BM / 8][4];   // (64 keys, BM queries): Sᵀ, then Pᵀ, then dSᵀ
      float dp[1][BM / 8][4];  // (64 keys, BM queries): dPᵀ
      issue_ss(w, k_tile, wg_row0, q_tile(i));
      issue_ss(dp, v_tile, wg_row0, do_tile(i));  // runs while Pᵀ is computed
      wait_for<1>(w);
      for_each_acc<1, BM / 8>([&](int mt, int nt, int e) {
        const int key = warp_key0 + acc_row(mt, e), qi = acc_col(nt, e), query = q0 + qi;
        w[mt][nt][e] = (query < p.T && key <= query)
                           ? Softmax::probability(w[mt][nt][e], lse[qi], p.scale_log2)
                           : 0.0f;
      });
      product_rs(dv_acc, w, do_tile(i));  // its wait covers dPᵀ's group too
      wait_for<0>(dp);
      for_each_acc<1, BM / 8>([&](int mt, int nt, int e) {
        w[mt][nt][e] = Softmax::grad_score(w[mt][nt][e], dp[mt][nt][e], delta[acc_col(nt, e)]);
      });
      product_rs(dk_acc, w, q_tile(i));
    }
    ring.release(i);
  }

  // K and V tiles are free once every consumer is past its last product: stage
  // dK (times c) and dV there, then store both.
  consumers_sync<Tr::kWarpgroups>();
  store_acc(k_tile, dk_acc, warp_row0(), p.scale);
  store_acc(v_tile, dv_acc, warp_row0(), 1.0f);
  consumers_sync<Tr::kWarpgroups>();
  const size_t ld = static_cast<size_t>(3) * p.H * D;
  store_tile<128 * Tr::kWarpgroups>(k_tile, p.dqkv + qkv_offset(b, k0, 1, h, p.T, p.H, D), ld,
                                    p.T - k0);
  store_tile<128 * Tr::kWarpgroups>(v_tile, p.dqkv + qkv_offset(b, k0, 2, h, p.T, p.H, D), ld,
                                    p.T - k0);
}

// dQ of one query block; each warpgroup owns 64 query rows. The producer
// streams (K, V) of each key block.
template <class Tr, class Softmax>
__device__ __forceinline__ void backward_dq_block(const BackwardTmaParams& params, BlockIndex at,
                                                  unsigned char* smem) {
  constexpr int D = Tr::kHeadDim, BM = Tr::kBlockM, BN = Tr::kBlockN, S = Tr::kStages;
  const BackwardParams& p = params.p;
  const SmemTile<BM, D> q_tile{reinterpret_cast<bf16*>(smem)};  // (BM, d)
  const SmemTile<BM, D> do_tile{q_tile.data + BM * D};          // (BM, d)
  bf16* kv_tiles = do_tile.data + BM * D;                       // S x [(BN, d) K, (BN, d) V]
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + Tr::kTileBytes);
  const Ring<S> ring{q_full + 1, q_full + 1 + S};
  auto k_tile = [&](int j) { return SmemTile<BN, D>{kv_tiles + 2 * Ring<S>::stage(j) * BN * D}; };
  auto v_tile = [&](int j) {
    return SmemTile<BN, D>{kv_tiles + (2 * Ring<S>::stage(j) + 1) * BN * D};
  };

  const int q_block = at.block, h = at.h, b = at.b;
  const int q0 = q_block * BM;
  const int n_kblocks = (min(p.T, q0 + BM) + BN - 1) / BN;
  if (threadIdx.x == 0) {
    barrier_init(q_full, 1);
    ring.init(1, 128 * Tr::kWarpgroups);
    barrier_init_fence();
  }
  __syncthreads();

  if (is_producer(Tr::kWarpgroups)) {
    producer_registers();
    if (is_copy_issuer()) {
      const int row0 = b * p.T;
      barrier_arrive_expect_bytes(q_full, 2 * tile_bytes<BM, D>());
      tma_load_tile(q_tile, &params.qkv, row0 + q0, h * D, q_full);
      tma_load_tile(do_tile, &params.dout, row0 + q0, h * D, q_full);
      for (int j = 0; j < n_kblocks; ++j) {
        uint64_t* full = &ring.full[Ring<S>::stage(j)];
        ring.acquire(j, 2 * tile_bytes<BN, D>());
        tma_load_tile(k_tile(j), &params.qkv, row0 + j * BN, (p.H + h) * D, full);
        tma_load_tile(v_tile(j), &params.qkv, row0 + j * BN, (2 * p.H + h) * D, full);
      }
    }
    return;
  }
  consumer_registers<Tr::kWarpgroups>();

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
  barrier_wait(q_full, 0);
  for (int j = 0; j < n_kblocks; ++j) {
    const int k0 = j * BN;
    ring.wait_full(j);
    if (k0 <= wg_row_last) {
      float w[1][BN / 8][4];   // (64 queries, BN keys): S, then P, then dS
      float dp[1][BN / 8][4];  // (64 queries, BN keys): dP
      issue_ss(w, q_tile, wg_row0, k_tile(j));
      issue_ss(dp, do_tile, wg_row0, v_tile(j));  // runs while P is computed
      wait_for<1>(w);
      for_each_acc<1, BN / 8>([&](int mt, int nt, int e) {
        w[mt][nt][e] = k0 + acc_col(nt, e) <= row_first + acc_row(mt, e)
                           ? Softmax::probability(w[mt][nt][e], lse[e / 2], p.scale_log2)
                           : 0.0f;
      });
      wait_for<0>(dp);
      for_each_acc<1, BN / 8>([&](int mt, int nt, int e) {
        w[mt][nt][e] = Softmax::grad_score(w[mt][nt][e], dp[mt][nt][e], delta[e / 2]);
      });
      product_rs(dq_acc, w, k_tile(j));
    }
    ring.release(j);
  }

  // Stage dQ (times c) in the Q tile: a warp writes rows only its own warpgroup read.
  store_acc(q_tile, dq_acc, warp_row0(), p.scale);
  consumers_sync<Tr::kWarpgroups>();
  store_tile<128 * Tr::kWarpgroups>(q_tile, p.dqkv + qkv_offset(b, q0, 0, h, p.T, p.H, D),
                                    static_cast<size_t>(3) * p.H * D, p.T - q0);
}

// The dQ half as a launch of its own (grid (ceil(T / kBlockM), H, B)), for
// K-interval's probability-STE backward, which needs FPA's dQ.
template <class Tr, class Softmax>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    flash_backward_dq_kernel(const __grid_constant__ BackwardTmaParams params) {
#if QATTN_SM90A_DEVICE
  extern __shared__ __align__(1024) unsigned char smem[];
  backward_dq_block<Tr, Softmax>(params, last_first(block_by_rank()), smem);
#endif
}

// The backward as one launch, grid as flash_backward_kernel's, blocks ranked over
// all heads (block_by_rank): dK/dV blocks first (key block 0, which sees every
// query, leading), then dQ blocks (the last query block leading).
template <class DkDvTr, class DqTr, class Softmax>
__global__ void __launch_bounds__(DkDvTr::kThreads, 1)
    flash_backward_kernel(const __grid_constant__ BackwardTmaParams params) {
#if QATTN_SM90A_DEVICE
  static_assert(DkDvTr::kThreads == DqTr::kThreads,
                "both halves of the launch share its block size");
  extern __shared__ __align__(1024) unsigned char smem[];
  const int n_kv_blocks = (params.p.T + DkDvTr::kBlockN - 1) / DkDvTr::kBlockN;
  const BlockIndex at = block_by_rank();
  if (at.block < n_kv_blocks)
    backward_dkdv_block<DkDvTr, Softmax>(params, at, smem);
  else
    backward_dq_block<DqTr, Softmax>(params, last_first(at), smem);
#endif
}

}  // namespace qattn::cuda::flash::sm90
