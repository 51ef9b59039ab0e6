// FPA's tiled flash-attention kernels on mma.sync (sm_80 and up): causal,
// T x T never materialised, bf16 tiles in shared memory, fp32 accumulators in
// registers, bf16 x bf16 -> fp32 products (tile_mma.cuh) and the exact online
// softmax (online_softmax.cuh). A forward kernel, a backward (one launch, or its
// dK/dV and dQ halves as launches of their own) and the δ pre-pass.
//
// What the other kinds take from here: K-interval (kinterval.cu) writes its
// kernels once over a row group (row_groups.cuh) and a feed (feeds.cuh) for
// both tensor-core families, and shares the kernel shapes (the traits below),
// the K/V stage layout, the δ pre-pass and, for its probability STE, FPA's dQ
// pass. SageBwd (sage.cu) reads its operands from a quantised workspace with
// run-time precision flags, so it keeps loop bodies of its own and shares the
// warp primitives (tile_mma.cuh), the pipeline and launcher (pipeline.cuh) and
// OnlineSoftmax. The Hopper kernels of FPA (wgmma, TMA, warp-specialised) are
// in flash_skeleton_sm90.cuh.
//
// Layouts (attention.cuh): q, k, v are rows of the fused activation
// (B, T, 3, H, d), row stride 3·H·d; o, dout are (B, T, H, d); L and δ are
// (B, H, T) fp32. Rows past T are zero-filled on load and never stored.
//
// Forward (per block of kBlockM query rows, key blocks in order 0 .. diagonal):
//   S = c Q Kᵀ -> causal mask -> online softmax (m, l; O rescaled) -> O += P V;
//   at the end O /= l and L = c m + log l.
// Backward, deterministic (no atomics; every output element has one writer):
//   δ = rowsum(dO ∘ O)                                  (delta pre-pass)
//   then one launch whose blocks do either of
//   per key block, over query blocks:   Pᵀ, dV += Pᵀ dO, dSᵀ = Pᵀ ∘ (dPᵀ − δ), dK += dSᵀ Q
//   per query block, over key blocks:   P, dS = P ∘ (dP − δ), dQ += dS K
// The dQ blocks recompute S and dP (two more products than an atomic dQ) so that
// dQ is summed in a fixed order; sharing one launch lets them fill the tail of
// the dK/dV blocks.
#pragma once
#include "attention/common/online_softmax.cuh"
#include "attention/common/pipeline.cuh"

namespace qattn::cuda::flash {

struct ForwardParams {
  const bf16* qkv;  // (B, T, 3, H, d)
  bf16* o;          // (B, T, H, d)
  float* lse;       // (B, H, T)
  int B, H, T;
  float scale_log2;  // c · log2(e)
};

struct BackwardParams {
  const bf16* qkv;   // (B, T, 3, H, d)
  const bf16* o;     // (B, T, H, d)
  const bf16* dout;  // (B, T, H, d)
  const float* lse;  // (B, H, T)
  float* delta;      // (B, H, T), written by the pre-pass
  bf16* dqkv;        // (B, T, 3, H, d)
  int B, H, T;
  float scale;       // c
  float scale_log2;  // c · log2(e)
};

// Offset of row t of slot (0 q, 1 k, 2 v) of head h, batch b in (B, T, 3, H, d).
__device__ __forceinline__ size_t qkv_offset(int b, int t, int slot, int h, int T, int H, int d) {
  return ((static_cast<size_t>(b) * T + t) * 3 + slot) * H * d + static_cast<size_t>(h) * d;
}
// Offset of row t of head h, batch b in (B, T, H, d).
__device__ __forceinline__ size_t head_offset(int b, int t, int h, int T, int H, int d) {
  return (static_cast<size_t>(b) * T + t) * H * d + static_cast<size_t>(h) * d;
}

// Shapes of the three kernels. Warps split the rows of the resident tile:
// 16 kRowTiles rows each.
template <int kHeadDim_, int kWarps_, int kRowTiles_, int kBlockN_>
struct ForwardTraits {
  static constexpr int kHeadDim = kHeadDim_, kWarps = kWarps_, kThreads = 32 * kWarps_;
  static constexpr int kRowTiles = kRowTiles_;
  static constexpr int kBlockM = 16 * kRowTiles_ * kWarps_;  // query rows per block
  static constexpr int kBlockN = kBlockN_;                   // keys per step
  // Q tile, then two stages of (K tile, V tile).
  static constexpr int kSmemBytes = (kBlockM + 4 * kBlockN) * kHeadDim * 2;
};

template <int kHeadDim_, int kWarps_, int kRowTiles_, int kBlockM_>
struct DkDvTraits {
  static constexpr int kHeadDim = kHeadDim_, kWarps = kWarps_, kThreads = 32 * kWarps_;
  static constexpr int kRowTiles = kRowTiles_;
  static constexpr int kBlockN = 16 * kRowTiles_ * kWarps_;  // keys per block
  static constexpr int kBlockM = kBlockM_;                   // query rows per step
  // K and V tiles, two stages of (Q tile, dO tile), two stages of (L, δ).
  static constexpr int kSmemBytes = (2 * kBlockN + 4 * kBlockM) * kHeadDim * 2 + 4 * kBlockM * 4;
};

template <int kHeadDim_, int kWarps_, int kRowTiles_, int kBlockN_>
struct DqTraits {
  static constexpr int kHeadDim = kHeadDim_, kWarps = kWarps_, kThreads = 32 * kWarps_;
  static constexpr int kRowTiles = kRowTiles_;
  static constexpr int kBlockM = 16 * kRowTiles_ * kWarps_;  // query rows per block
  static constexpr int kBlockN = kBlockN_;                   // keys per step
  // Q and dO tiles, two stages of (K tile, V tile).
  static constexpr int kSmemBytes = (2 * kBlockM + 4 * kBlockN) * kHeadDim * 2;
};

// A kind's tile shapes for one head dim: the traits of its three kernels.
template <class Forward_, class DkDv_, class Dq_>
struct KernelTiles {
  using Forward = Forward_;
  using DkDv = DkDv_;
  using Dq = Dq_;
};

// Two stages of (K tile, V tile), each (kBlockN, d), at data (2 x [K, V]); step j
// fills a stage with keys [j kBlockN, (j + 1) kBlockN) of one head (rows past T: zero).
template <class Tr>
struct KvStages {
  static constexpr int BN = Tr::kBlockN, D = Tr::kHeadDim;
  bf16* data;
  const bf16* k_src;  // (T, d) keys of the head, row stride ld
  const bf16* v_src;  // (T, d) values
  size_t ld;
  int T;

  __device__ __forceinline__ SmemTile<BN, D> k(int s) const {
    return SmemTile<BN, D>{data + (2 * s) * BN * D};
  }
  __device__ __forceinline__ SmemTile<BN, D> v(int s) const {
    return SmemTile<BN, D>{data + (2 * s + 1) * BN * D};
  }
  __device__ __forceinline__ void load(int j, int s) const {
    load_tile_async<Tr::kThreads>(k(s), k_src + j * BN * ld, ld, T - j * BN);
    load_tile_async<Tr::kThreads>(v(s), v_src + j * BN * ld, ld, T - j * BN);
  }
};

// ---------------------------------------------------------------------------
// Forward. Grid (ceil(T / kBlockM), H, B); the heaviest (last) query blocks start first.
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads) flash_forward_kernel(const ForwardParams p) {
  constexpr int D = Tr::kHeadDim, BM = Tr::kBlockM, BN = Tr::kBlockN, RT = Tr::kRowTiles;
  extern __shared__ __align__(128) unsigned char smem[];
  const SmemTile<BM, D> q_tile{reinterpret_cast<bf16*>(smem)};  // (BM, d)
  bf16* kv_stages = q_tile.data + BM * D;                       // 2 x [(BN, d) K, (BN, d) V]

  const int q_block = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32;
  const int q0 = q_block * BM;           // first query row of the block
  const int warp_row0 = warp * 16 * RT;  // first row of the warp, within the block
  const int row_first = q0 + warp_row0, row_last = row_first + 16 * RT - 1;
  const size_t ld = static_cast<size_t>(3) * p.H * D;
  const bf16* q_src = p.qkv + qkv_offset(b, 0, 0, h, p.T, p.H, D);  // (T, d), row stride ld
  const KvStages<Tr> kv{kv_stages, p.qkv + qkv_offset(b, 0, 1, h, p.T, p.H, D),
                        p.qkv + qkv_offset(b, 0, 2, h, p.T, p.H, D), ld, p.T};
  auto load_kv = [&](int j, int s) { kv.load(j, s); };

  load_tile_async<Tr::kThreads>(q_tile, q_src + q0 * ld, ld, p.T - q0);
  // Causal: keys up to the block's last row.
  const int n_kblocks = (min(p.T, q0 + BM) + BN - 1) / BN;

  uint32_t q_frag[RT][D / 16][4];
  float o_acc[RT][D / 8][4];  // (16 RT, d) rows of O owned by this warp
  zero(o_acc);
  OnlineSoftmax<RT> softmax(p.scale_log2);
  pipelined(0, n_kblocks, load_kv, [&](int j, int stage) {
    if (j == 0) load_a(q_frag, q_tile, warp_row0);
    const int k0 = j * BN;
    if (k0 > row_last) return;  // every key of the block is in the future of every row of the warp
    float s[RT][BN / 8][4];     // (16 RT, BN) scores
    zero(s);
    mma_b_nk(s, q_frag, kv.k(stage));
    if (k0 + BN - 1 > row_first) {  // the diagonal: hide keys after the query
      for_each_acc<RT, BN / 8>([&](int mt, int nt, int e) {
        if (k0 + acc_col(nt, e) > row_first + acc_row(mt, e)) s[mt][nt][e] = -INFINITY;
      });
    }
    softmax.update(s, o_acc);  // s now holds the weights
    mma_weights_kn(o_acc, s, kv.v(stage));
  });

  softmax.finalize(o_acc);
  softmax.store_lse(p.lse + (static_cast<size_t>(b) * p.H + h) * p.T, row_first, p.T);
  store_acc(q_tile, o_acc, warp_row0, 1.0f);  // the Q tile is free: stage O there
  __syncthreads();
  store_tile<Tr::kThreads>(q_tile, p.o + head_offset(b, q0, h, p.T, p.H, D),
                           static_cast<size_t>(p.H) * D, p.T - q0);
}

// ---------------------------------------------------------------------------
// Backward pre-pass: δ = rowsum(dO ∘ O) in fp32. A (b, t, h) row is d / 8
// threads, each reading 8 elements of O and dO with one 16-byte load apiece.
template <int kHeadDim>
__global__ void attention_delta_kernel(const BackwardParams p) {
  constexpr int kThreadsPerRow = kHeadDim / 8;
  const long long row =
      (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kThreadsPerRow;
  const int part = threadIdx.x % kThreadsPerRow;
  const bool valid = row < static_cast<long long>(p.B) * p.T * p.H;
  float sum = 0.0f;
  if (valid) {
    float o[8], dout[8];
    load8_f32(p.o + row * kHeadDim + part * 8, o);
    load8_f32(p.dout + row * kHeadDim + part * 8, dout);
#pragma unroll
    for (int k = 0; k < 8; ++k) sum += o[k] * dout[k];
  }
#pragma unroll
  for (int offset = kThreadsPerRow / 2; offset > 0; offset /= 2)
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (valid && part == 0) {
    const int h = static_cast<int>(row % p.H), t = static_cast<int>((row / p.H) % p.T);
    const int b = static_cast<int>(row / (static_cast<long long>(p.H) * p.T));
    p.delta[(static_cast<size_t>(b) * p.H + h) * p.T + t] = sum;
  }
}

// Launches the pre-pass over every (b, t, h) row: p.delta <- δ.
inline void attention_delta(const BackwardParams& p, int d, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const long long threads = static_cast<long long>(p.B) * p.T * p.H * (d / 8);
  if (d == 64)
    attention_delta_kernel<64><<<ceil_div(threads, kThreads), kThreads, 0, stream>>>(p);
  else
    attention_delta_kernel<128><<<ceil_div(threads, kThreads), kThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}
// The bytes it moves (PhaseWork): O and dO in, δ out.
inline double attention_delta_bytes(const BackwardParams& p, int d) {
  const double rows = static_cast<double>(p.B) * p.T * p.H;
  return rows * (2 * 2.0 * d + 4.0);
}

// ---------------------------------------------------------------------------
// dK, dV of one key block (k_block) of head blockIdx.y, batch blockIdx.z.
// Each warp owns 16 kRowTiles keys and computes the transposed tiles Sᵀ, Pᵀ, dPᵀ, dSᵀ
// (keys x queries), so Pᵀ and dSᵀ go from accumulators straight into the A
// operand of dV += Pᵀ dO and dK += dSᵀ Q without a trip through shared memory.
template <class Tr>
__device__ __noinline__ void backward_dkdv_block(const BackwardParams p, int k_block,
                                                 unsigned char* smem) {
  constexpr int D = Tr::kHeadDim, BM = Tr::kBlockM, BN = Tr::kBlockN, RT = Tr::kRowTiles;
  const SmemTile<BN, D> k_tile{reinterpret_cast<bf16*>(smem)};  // (BN, d)
  const SmemTile<BN, D> v_tile{k_tile.data + BN * D};           // (BN, d)
  bf16* q_stages = v_tile.data + BN * D;                        // 2 x [(BM, d) Q, (BM, d) dO]
  float* stat_stages = reinterpret_cast<float*>(q_stages + 4 * BM * D);  // 2 x [(BM) L, (BM) δ]

  const int h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32;
  const int k0 = k_block * BN;
  const int warp_row0 = warp * 16 * RT;  // first key of the warp, within the block
  const int warp_key0 = k0 + warp_row0;
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

  float dk_acc[RT][D / 8][4], dv_acc[RT][D / 8][4];  // (16 RT, d) rows of dK, dV owned by this warp
  zero(dk_acc);
  zero(dv_acc);
  // Causal: queries before the block's first key see none of it.
  pipelined(k0 / BM, (p.T + BM - 1) / BM, load_queries, [&](int i, int s) {
    const int q0 = i * BM;
    // Skip when every key of the warp is after every query of the block, or past T.
    if (warp_key0 > q0 + BM - 1 || warp_key0 >= p.T) return;
    const float* lse = lse_stage(s);
    const float* delta = delta_stage(s);
    uint32_t k_frag[RT][D / 16][4];
    load_a(k_frag, k_tile, warp_row0);
    float w[RT][BM / 8][4];  // (16 RT keys, BM queries): Sᵀ, then Pᵀ, then dSᵀ
    zero(w);
    mma_b_nk(w, k_frag, q_stage(s));
    for_each_acc<RT, BM / 8>([&](int mt, int nt, int e) {
      const int key = warp_key0 + acc_row(mt, e), qi = acc_col(nt, e), query = q0 + qi;
      w[mt][nt][e] = (query < p.T && key <= query)
                         ? OnlineSoftmax<RT>::probability(w[mt][nt][e], lse[qi], p.scale_log2)
                         : 0.0f;
    });
    mma_weights_kn(dv_acc, w, do_stage(s));
    uint32_t v_frag[RT][D / 16][4];
    load_a(v_frag, v_tile, warp_row0);
    float dp[RT][BM / 8][4];  // (16 RT keys, BM queries): dPᵀ
    zero(dp);
    mma_b_nk(dp, v_frag, do_stage(s));
    for_each_acc<RT, BM / 8>([&](int mt, int nt, int e) {
      w[mt][nt][e] =
          OnlineSoftmax<RT>::grad_score(w[mt][nt][e], dp[mt][nt][e], delta[acc_col(nt, e)]);
    });
    mma_weights_kn(dk_acc, w, q_stage(s));
  });

  // K and V tiles are free: stage dK (times c) and dV there, then store both.
  store_acc(k_tile, dk_acc, warp_row0, p.scale);
  store_acc(v_tile, dv_acc, warp_row0, 1.0f);
  __syncthreads();
  store_tile<Tr::kThreads>(k_tile, p.dqkv + qkv_offset(b, k0, 1, h, p.T, p.H, D), ld, p.T - k0);
  store_tile<Tr::kThreads>(v_tile, p.dqkv + qkv_offset(b, k0, 2, h, p.T, p.H, D), ld, p.T - k0);
}

// ---------------------------------------------------------------------------
// dQ of one query block (q_block) of head blockIdx.y, batch blockIdx.z.
template <class Tr>
__device__ __noinline__ void backward_dq_block(const BackwardParams p, int q_block,
                                               unsigned char* smem) {
  constexpr int D = Tr::kHeadDim, BM = Tr::kBlockM, BN = Tr::kBlockN, RT = Tr::kRowTiles;
  const SmemTile<BM, D> q_tile{reinterpret_cast<bf16*>(smem)};  // (BM, d)
  const SmemTile<BM, D> do_tile{q_tile.data + BM * D};          // (BM, d)
  bf16* kv_stages = do_tile.data + BM * D;                      // 2 x [(BN, d) K, (BN, d) V]

  const int h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32;
  const int q0 = q_block * BM;
  const int warp_row0 = warp * 16 * RT;
  const int row_first = q0 + warp_row0, row_last = row_first + 16 * RT - 1;
  const size_t ld = static_cast<size_t>(3) * p.H * D, ld_o = static_cast<size_t>(p.H) * D;
  const size_t stat0 = (static_cast<size_t>(b) * p.H + h) * p.T;
  const KvStages<Tr> kv{kv_stages, p.qkv + qkv_offset(b, 0, 1, h, p.T, p.H, D),
                        p.qkv + qkv_offset(b, 0, 2, h, p.T, p.H, D), ld, p.T};
  auto load_kv = [&](int j, int s) { kv.load(j, s); };

  // L and δ of this thread's two rows (rows past T: 0, never stored).
  float lse[RT][2], delta[RT][2];
#pragma unroll
  for (int mt = 0; mt < RT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row_first + acc_row(mt, 2 * half);
      lse[mt][half] = row < p.T ? p.lse[stat0 + row] : 0.0f;
      delta[mt][half] = row < p.T ? p.delta[stat0 + row] : 0.0f;
    }

  load_tile_async<Tr::kThreads>(q_tile, p.qkv + qkv_offset(b, q0, 0, h, p.T, p.H, D), ld, p.T - q0);
  load_tile_async<Tr::kThreads>(do_tile, p.dout + head_offset(b, q0, h, p.T, p.H, D), ld_o,
                                p.T - q0);
  const int n_kblocks = (min(p.T, q0 + BM) + BN - 1) / BN;

  uint32_t q_frag[RT][D / 16][4], do_frag[RT][D / 16][4];
  float dq_acc[RT][D / 8][4];  // (16 RT, d) rows of dQ owned by this warp
  zero(dq_acc);
  pipelined(0, n_kblocks, load_kv, [&](int j, int s) {
    if (j == 0) {
      load_a(q_frag, q_tile, warp_row0);
      load_a(do_frag, do_tile, warp_row0);
    }
    const int k0 = j * BN;
    if (k0 > row_last) return;
    float w[RT][BN / 8][4];  // (16 RT queries, BN keys): S, then P, then dS
    zero(w);
    mma_b_nk(w, q_frag, kv.k(s));
    for_each_acc<RT, BN / 8>([&](int mt, int nt, int e) {
      w[mt][nt][e] =
          k0 + acc_col(nt, e) <= row_first + acc_row(mt, e)
              ? OnlineSoftmax<RT>::probability(w[mt][nt][e], lse[mt][e / 2], p.scale_log2)
              : 0.0f;
    });
    float dp[RT][BN / 8][4];  // (16 RT queries, BN keys): dP
    zero(dp);
    mma_b_nk(dp, do_frag, kv.v(s));
    for_each_acc<RT, BN / 8>([&](int mt, int nt, int e) {
      w[mt][nt][e] = OnlineSoftmax<RT>::grad_score(w[mt][nt][e], dp[mt][nt][e], delta[mt][e / 2]);
    });
    mma_weights_kn(dq_acc, w, kv.k(s));
  });

  store_acc(q_tile, dq_acc, warp_row0, p.scale);  // the Q tile is free: stage dQ (times c) there
  __syncthreads();
  store_tile<Tr::kThreads>(q_tile, p.dqkv + qkv_offset(b, q0, 0, h, p.T, p.H, D), ld, p.T - q0);
}

// The dQ half as a launch of its own (grid as in flash_backward_kernel), for
// K-interval's probability-STE backward, which needs FPA's dQ.
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads) flash_backward_dq_kernel(const BackwardParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  backward_dq_block<Tr>(p, gridDim.x - 1 - blockIdx.x, smem);
}

// The backward as one launch. Grid (ceil(T / DkDvTr::kBlockN) + ceil(T / DqTr::kBlockM), H, B):
// the dK/dV blocks first, key block 0 (which sees every query) leading, then the
// dQ blocks, the last query block (which sees every key) leading.
template <class DkDvTr, class DqTr>
__global__ void __launch_bounds__(DkDvTr::kThreads) flash_backward_kernel(const BackwardParams p) {
  static_assert(DkDvTr::kThreads == DqTr::kThreads,
                "both halves of the launch share its block size");
  extern __shared__ __align__(128) unsigned char smem[];
  const int n_kv_blocks = (p.T + DkDvTr::kBlockN - 1) / DkDvTr::kBlockN;
  if (static_cast<int>(blockIdx.x) < n_kv_blocks)
    backward_dkdv_block<DkDvTr>(p, blockIdx.x, smem);
  else
    backward_dq_block<DqTr>(p, gridDim.x - 1 - blockIdx.x, smem);
}

}  // namespace qattn::cuda::flash
