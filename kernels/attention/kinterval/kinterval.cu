// K-interval quantised-softmax attention (docs/attention-maths.md §5), fused: T x T is never
// materialised. Built from the flash skeleton's tiles and products
// (tile_mma.cuh); the per-score maths is in kinterval_softmax.cuh.
//
// Forward, one kernel per query block, two passes over the visible keys:
//   pass 1: raw S = Q Kᵀ -> each row's max and min (pairs of keys first), with
//           their lowest indices where the backward routes a term to them -> the
//           row's grid (RowStats);
//   pass 2: S again -> ŵ -> Ẑ = Σ ŵ, O += ŵ V; at the end O /= Ẑ.
//   Saved per row: the grid, 1/Ẑ, argmax and argmin (8 fp32, RowStats); for the
//   probability STE also the exact softmax's L and output (Saved).
// Backward, deterministic (every output element has one writer, sums in a fixed order):
//   δ = rowsum(dO ∘ O) = ḡ (the skeleton's delta pre-pass, or at d = 64 the dQ
//     pass of a two-launch backward; O = p̂ V);
//   dQ pass (per query block, over key blocks): S, dP, dS_direct by the rule,
//     dQ += dS_direct K, and the row sums dL/dm, dL/dℓ of the calibration terms;
//     at the end dQ_i += dL/dm_i k_argmax + dL/dℓ_i k_argmin; dL/dm, dL/dℓ saved;
//   dK/dV pass (per key block, over query blocks, after the dQ pass): Sᵀ, dPᵀ,
//     p̂ᵀ for dV += p̂ᵀ dO, dSᵀ = dS_direct plus dL/dm_i where the key is row
//     i's argmax and dL/dℓ_i where it is its argmin, dK += dSᵀ Q.
// The probability STE's dS is the exact softmax gradient: its forward's pass 2
// also computes the exact softmax from pass 1's max (L and output, saved after
// the RowStats; δ from that output), its backward runs FPA's dQ pass and the
// dK/dV pass above with exact P for dK and p̂ for dV.
// Where the dK/dV pass needs nothing from the dQ pass (detached extrema: no
// routing; the probability STE) the wgmma family runs the two in one launch,
// as FPA's backward does (dkdv_dq_kernel).
// The dK/dV pass computes p̂ᵀ from Sᵀ while dPᵀ is still on the tensor cores
// (d = 64; d = 128 has no registers for it), and the dQ pass folds 1/Ẑ into the
// weights' exponents per row.
//
// Rounding x STE (the rule), calibration and which indices pass 1 tracks are
// compile-time options; K, the window, detach and the window mask are run-time values.
// The kernels are bound by instructions per score (docs/kinterval.md, "Cost").
//
// Each kernel is written once over a row group (row_groups.cuh) and a feed
// (feeds.cuh), and runs in two families, picked at run time as FPA's (FpaKernels):
// on Hopper (sm_90a) wgmma, a warpgroup of 64 rows reading Q, K, V, dO from
// shared memory, fed by TMA from a producer warpgroup; elsewhere mma.sync, a warp
// of 16 or 32 rows with register fragments, fed by cp.async.
//
// Tile shapes, wgmma: 2 consumer warpgroups, 128 rows per block (and the producer);
//   forward 128-key steps, at d = 64 with 3 consumer warpgroups (192 rows), its
//   blocks ending at T (the short one first);
//   dK/dV 64-query steps; dQ 128-key steps (at d = 128 its accumulators hold
//   192 registers per thread, as dK/dV's 64-query step does, of the 240 the
//   producer leaves).
// mma.sync: forward d=64 4 warps x 32 rows (FPA's), d=128 8 x 16, 64-key steps;
// dQ 8 warps x 16 rows, 64-key steps; dK/dV 8 warps x 16 keys, 64-query steps.
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "attention/common/feeds.cuh"
#include "attention/common/online_softmax.cuh"
#include "attention/common/row_groups.cuh"
#include "attention/fpa/flash_skeleton.cuh"
#include "attention/fpa/flash_skeleton_sm90.cuh"
#include "attention/fpa/fpa.cuh"
#include "attention/kinterval/kinterval.cuh"
#include "attention/kinterval/kinterval_softmax.cuh"
#include "attention/phases.cuh"

namespace qattn::cuda {
namespace {

using namespace flash;
using namespace kinterval;

struct Params {
  const bf16* qkv;   // (B, T, 3, H, d)
  bf16* o;           // (B, T, H, d): the forward's output, which the d = 64 dQ pass reads (δ)
  const bf16* dout;  // (B, T, H, d)
  bf16* dqkv;        // (B, T, 3, H, d)
  RowStats* stats;   // (B, H, T)
  float* delta;      // (B, H, T): ḡ = dO·O; for the probability STE the exact softmax's δ
  float* dm;         // (B, H, T): dL/dm of each row (0 when detached)
  float* dl;         // (B, H, T): dL/dℓ of each row
  // The probability STE's exact softmax, saved by the forward beside the RowStats
  // (Saved, below): its L and output.
  float* lse;     // (B, H, T)
  bf16* o_exact;  // (B, T, H, d)
  int B, H, T;
  float scale;       // c
  float scale_log2;  // c · log2(e)
  GridOptions grid;
  float window;  // fwm's W in nats
  // Weight STE: entries with u < mask_below get dS = 0: 0 with fwm and
  // ste_window_mask (below the window), else −inf (none); a threshold, not a branch.
  float mask_below;
  bool detach;  // no derivative through m and ℓ
  // The activations as TMA tensor maps (qkv: (B T, 3 H d); dout, o: (B T, H d)) for
  // the TMA feed; unused by the cp.async feed.
  CUtensorMap qkv_map, dout_map, o_map;
};

// The (rows x d) tile at row t0 of slot (0 q, 1 k, 2 v) of head h, batch b, and of dout.
__device__ __forceinline__ TileSource qkv_source(const Params& p, int b, int t0, int slot, int h,
                                                 int d) {
  return activation_tile(p.qkv, &p.qkv_map, 3 * p.H * d, b, p.T, t0, (slot * p.H + h) * d);
}
// The (rows x d) tile at row t0 of head h, batch b, of a (B, T, H, d) activation.
__device__ __forceinline__ TileSource head_source(const Params& p, const bf16* x,
                                                  const CUtensorMap* map, int b, int t0, int h,
                                                  int d) {
  return activation_tile(x, map, p.H * d, b, p.T, t0, h * d);
}
__device__ __forceinline__ TileSource dout_source(const Params& p, int b, int t0, int h, int d) {
  return head_source(p, p.dout, &p.dout_map, b, t0, h, d);
}

// The dK/dV pass stages each query's RowStats as two arrays of 16-byte halves:
// a quad's four threads read columns two apart, which as 32-byte structs would
// put two of them on the same banks.
struct StagedStats {
  float4* lo;  // (rows) u_offset, u_scale, step, rho
  float4* hi;  // (rows) w_base, inv_z, argmax, argmin
  __device__ RowStats load(int i) const {
    const float4 a = lo[i], b = hi[i];
    return {a.x, a.y, a.z, a.w, b.x, b.y, __float_as_int(b.z), __float_as_int(b.w)};
  }
};

// kRows RowStats into a StagedStats, this thread's share of `threads`; rows
// past rows_valid read as 0.
template <int kRows, class Copier>
__device__ __forceinline__ void copy_row_stats(StagedStats dst, const RowStats* src, int rows_valid,
                                               int thread, int threads, Copier) {
  for (int c = thread; c < 2 * kRows; c += threads) {
    const int r = c % kRows, half = c / kRows;
    const bool valid = r < rows_valid;
    Copier::copy16((half ? dst.hi : dst.lo) + r,
                   reinterpret_cast<const float4*>(src + (valid ? r : 0)) + half, valid);
  }
}

// What a query row brings to the dK/dV pass besides its RowStats, 8 bytes in
// shared memory so that one load fetches it; lerp minmax's dL/dℓ comes in an
// array of its own (one 16-byte struct of all three measured slower for each of
// the four benchmarked settings: docs/kinterval.md, "Design decisions").
struct alignas(8) QueryValues {
  float delta;   // ḡ = dO·O, or for the probability STE the exact softmax's δ
  float second;  // dL/dm, or for the probability STE the exact L
};

// kRows QueryValues and (l_dst not null) dL/dℓ into shared memory from three (T)
// row values (second and l_grad may be null: zeros), this thread's share of
// `threads`; rows past rows_valid read as 0.
template <int kRows, class Copier>
__device__ __forceinline__ void copy_query_values(QueryValues* dst, float* l_dst,
                                                  const float* delta, const float* second,
                                                  const float* l_grad, int rows_valid, int thread,
                                                  int threads, Copier) {
  for (int c = thread; c < 2 * kRows; c += threads) {
    const int r = c / 2, v = c % 2;
    const float* src = v == 0 ? delta : second;
    const bool valid = r < rows_valid && src != nullptr;
    Copier::copy4(reinterpret_cast<float*>(dst + r) + v, valid ? src + r : delta, valid);
  }
  if (l_dst != nullptr)
    for (int r = thread; r < kRows; r += threads) {
      const bool valid = r < rows_valid && l_grad != nullptr;
      Copier::copy4(l_dst + r, valid ? l_grad + r : delta, valid);
    }
}

// Calls hide(mt, nt, e) for the entries of a warp's (16 kRowTiles rows, 8 kNTiles
// keys) accumulator whose key is after the row's query: the causal mask, needed
// only when the tile crosses the diagonal.
template <int kRowTiles, int kNTiles, class Hide>
__device__ __forceinline__ void hide_future_keys(int k0, int row_first, Hide&& hide) {
  if (k0 + 8 * kNTiles - 1 <= row_first) return;  // every key is visible to every row
  for_each_acc<kRowTiles, kNTiles>([&](int mt, int nt, int e) {
    if (k0 + acc_col(nt, e) > row_first + acc_row(mt, e)) hide(mt, nt, e);
  });
}

// Every kernel below is a __device__ body over a row group (Rows) and the
// block's tile shapes (Tr), launched by a __global__ wrapper that keeps it only
// where the group's instructions exist (wgmma bodies: sm_90a code only).
template <class Rows, class Feed, int kResidentRows>
__device__ __forceinline__ void check_row_group() {
  static_assert(Feed::kConsumerThreads / Rows::kThreads * Rows::kRows == kResidentRows,
                "the row groups of a block split the rows of its resident tile");
}

// ---------------------------------------------------------------------------
// Forward. Grid (ceil(T / kBlockM), H, B); every head's heaviest (last) query block starts
// first (block_by_rank).
// kIndices: the extrema whose key the backward routes a calibration term to
// (index tracking costs a compare and two selects per pair of keys besides the
// pair's min or max; the values alone one min or max).
enum class Indices { none, argmax, both };

// No path through m and ℓ when detached or under the probability STE.
bool tracks_indices(const KIntervalOptions& opt) {
  return !opt.detach_extrema && rule_of(opt) != Rule::prob_ste;
}
// The indices tracked, given that some are: dL/dℓ is 0 for fwm (no ℓ) and for
// the weight STE (w = exp(s − m)), so argmin only for lerp minmax.
constexpr Indices indices_tracked(Rounding rounding, Calibration calibration) {
  const bool lerp_minmax = rounding == Rounding::lerp && calibration == Calibration::minmax;
  return lerp_minmax ? Indices::both : Indices::argmax;
}

// kExact (the probability STE): pass 2 also computes the exact softmax, whose
// L and output (hence δ) that rule's backward needs: p = exp(s − m) with pass
// 1's max (no rescaling), ℓ_exact = Σ p, O_exact = Σ p V / ℓ_exact.
template <class Rows, class Feed, class Tr, Rounding kRounding, Calibration kCalibration,
          Indices kIndices, bool kExact>
__device__ __forceinline__ void forward_block(const Params& p, unsigned char* smem) {
  check_row_group<Rows, Feed, Tr::kBlockM>();
  constexpr int D = Tr::kHeadDim, BM = Tr::kBlockM, BN = Tr::kBlockN, RT = Rows::kRowTiles;
  constexpr bool kFwm = kCalibration == Calibration::fwm;
  const SmemTile<BM, D> q_tile{reinterpret_cast<bf16*>(smem)};  // (BM, d)
  bf16* kv_stages = q_tile.data + BM * D;                       // 2 x [(BN, d) K, (BN, d) V]

  const BlockIndex at = last_first(block_by_rank());
  const int q_block = at.block, h = at.h, b = at.b;
  // Where the feed allows, the blocks end at T, so that a block short of BM rows
  // (T mod BM of them) is the first, which sees the fewest keys, not the last,
  // which sees them all (the 192-row blocks at d = 64 and T = 1024 or 2048);
  // its rows before 0 read zeros (the first batch) or the previous batch's rows.
  const int q0 = Feed::kZeroFillsBeforeRow0 ? p.T - (static_cast<int>(gridDim.x) - q_block) * BM
                                            : q_block * BM;
  const int warp_row0 = Rows::warp_first_row();  // first row of the warp, within the block
  const int row_first = q0 + warp_row0;          // the warp's first query row
  const int group_row_first = q0 + Rows::first_row();
  const int group_row_last = group_row_first + Rows::kRows - 1;
  // A group whose rows all lie outside [0, T) (in the first or last block) computes nothing.
  const bool group_valid = group_row_first < p.T && group_row_last >= 0;
  const size_t ld = static_cast<size_t>(3) * p.H * D;
  const KvStages<Tr> kv{kv_stages, p.qkv + qkv_offset(b, 0, 1, h, p.T, p.H, D),
                        p.qkv + qkv_offset(b, 0, 2, h, p.T, p.H, D), ld, p.T};
  // Causal: keys up to the block's last row.
  const int n_kblocks = (min(p.T, q0 + BM) + BN - 1) / BN;
  auto resident = [&](auto& to) { to.tile(q_tile, qkv_source(p, b, q0, 0, h, D)); };
  auto keys = [&](int j, int s, auto& to) { to.tile(kv.k(s), qkv_source(p, b, j * BN, 1, h, D)); };
  auto keys_values = [&](int j, int s, auto& to) {
    keys(j, s, to);
    to.tile(kv.v(s), qkv_source(p, b, j * BN, 2, h, D));
  };
  Feed feed(smem + Tr::kSmemBytes);
  if (feed.producer()) {
    feed.produce(resident, steps(0, n_kblocks, keys), steps(0, n_kblocks, keys_values));
    return;
  }
  feed.consumer_start();
  feed.resident(resident);
  typename Rows::template A<BM, D> q_a;  // the group's rows of Q

  // Pass 1: max and min of each row's visible raw scores (this thread's columns, then the row's
  // four threads). Indices not tracked stay 0.
  Extremum hi[RT][2], lo[RT][2];
#pragma unroll
  for (int mt = 0; mt < RT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      hi[mt][half] = {-INFINITY, 0};
      lo[mt][half] = {INFINITY, 0};
    }
  feed.consume(0, n_kblocks, keys, [&](int j, int s) {
    if (j == 0) q_a.load(q_tile);
    const int k0 = j * BN;
    if (k0 > group_row_last || !group_valid) return;  // every key is in the rows' future
    float r[RT][BN / 8][4];                           // (16 RT, BN) raw scores
    Rows::scores(r, q_a, kv.k(s));
    // NaN fails the comparisons below, and fmaxf / fminf ignore it.
    hide_future_keys<RT, BN / 8>(k0, row_first, [&](int mt, int nt, int e) { r[mt][nt][e] = NAN; });
    // A thread's columns come in pairs of neighbouring keys (e, e + 1): each pair's
    // max and min first, with which of the two it is, then one compare per pair
    // against the running extremum. A thread meets its pairs in increasing order:
    // strict comparisons keep the lowest index, within a pair too (row_extremum4
    // applies the full tie rule across threads). A pair's second key is in the
    // row's future whenever its first is, so a NaN first never hides a visible second.
#pragma unroll
    for (int mt = 0; mt < RT; ++mt)
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const float v0 = r[mt][nt][2 * half], v1 = r[mt][nt][2 * half + 1];
          const int key = k0 + acc_col(nt, 0);
          Extremum& h = hi[mt][half];
          Extremum& l = lo[mt][half];
          const float pair_max = fmaxf(v0, v1), pair_min = fminf(v0, v1);
          if constexpr (kIndices != Indices::none) {
            if (pair_max > h.value) h = {pair_max, key + (v1 > v0)};
          } else {
            h.value = fmaxf(h.value, pair_max);
          }
          if constexpr (kIndices == Indices::both) {
            if (pair_min < l.value) l = {pair_min, key + (v1 < v0)};
          } else if constexpr (!kFwm) {  // fwm's grid hangs from the max alone
            l.value = fminf(l.value, pair_min);
          }
        }
  });
  RowStats st[RT][2];
#pragma unroll
  for (int mt = 0; mt < RT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      st[mt][half] =
          make_row_stats(row_extremum4<true>(hi[mt][half]), row_extremum4<false>(lo[mt][half]),
                         p.scale, p.grid, kFwm, p.window);

  // Pass 2: the quantised weights, their row sums Ẑ and O = Σ ŵ V (kExact: also
  // the exact p, ℓ_exact and O_exact).
  float o_acc[RT][D / 8][4];       // (16 RT, d) rows of O owned by this warp
  float oe_acc[RT][D / 8][4];      // (16 RT, d) rows of O_exact (kExact)
  float z[RT][2], l_exact[RT][2];  // Ẑ and ℓ_exact over this thread's columns
  zero(o_acc);
  if constexpr (kExact) zero(oe_acc);
#pragma unroll
  for (int mt = 0; mt < RT; ++mt) z[mt][0] = z[mt][1] = l_exact[mt][0] = l_exact[mt][1] = 0.0f;
  feed.consume(0, n_kblocks, keys_values, [&](int j, int s) {
    const int k0 = j * BN;
    if (k0 > group_row_last || !group_valid) return;
    float w[RT][BN / 8][4];   // (16 RT, BN): raw scores, then ŵ
    float pe[RT][BN / 8][4];  // (16 RT, BN): the exact p (kExact)
    Rows::scores(w, q_a, kv.k(s));
    for_each_acc<RT, BN / 8>([&](int mt, int nt, int e) {
      const RowStats& r = st[mt][e / 2];
      const float raw = w[mt][nt][e];
      // Future keys (u past the grid) are hidden below; minmax never has u < 0.
      const float u = grid_position(r, raw);
      const float on_grid =
          grid_weight<kRounding>(kRounding == Rounding::lerp ? fmaxf(u, 0.0f) : u, r, p.grid);
      w[mt][nt][e] = kFwm && u < 0.0f ? 0.0f : on_grid;
      if constexpr (kExact) pe[mt][nt][e] = unquantised_weight(r, raw, p.scale_log2);
    });
    hide_future_keys<RT, BN / 8>(k0, row_first, [&](int mt, int nt, int e) {
      w[mt][nt][e] = 0.0f;
      if constexpr (kExact) pe[mt][nt][e] = 0.0f;
    });
    for_each_acc<RT, BN / 8>([&](int mt, int nt, int e) {
      z[mt][e / 2] += w[mt][nt][e];
      if constexpr (kExact) l_exact[mt][e / 2] += pe[mt][nt][e];
    });
    Rows::accumulate(o_acc, w, kv.v(s));                          // O += ŵ V
    if constexpr (kExact) Rows::accumulate(oe_acc, pe, kv.v(s));  // O_exact += p V
  });

  RowStats* stats = p.stats + (static_cast<size_t>(b) * p.H + h) * p.T;  // (T)
#pragma unroll
  for (int mt = 0; mt < RT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      st[mt][half].inv_z = 1.0f / row_sum4(z[mt][half]);
      const float l = kExact ? row_sum4(l_exact[mt][half]) : 1.0f, inv_l = 1.0f / l;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        o_acc[mt][dt][2 * half] *= st[mt][half].inv_z;
        o_acc[mt][dt][2 * half + 1] *= st[mt][half].inv_z;
        if constexpr (kExact) {
          oe_acc[mt][dt][2 * half] *= inv_l;
          oe_acc[mt][dt][2 * half + 1] *= inv_l;
        }
      }
      const int row = row_first + acc_row(mt, 2 * half);
      if (threadIdx.x % 4 == 0 && row >= 0 && row < p.T) {
        stats[row] = st[mt][half];
        // L = c m + log ℓ_exact, as FPA's forward saves it.
        if constexpr (kExact)
          p.lse[(static_cast<size_t>(b) * p.H + h) * p.T + row] =
              log_sum_exp(st[mt][half].w_base, l);
      }
    }
  // Stage O in the Q tile (a warp writes only rows its own group read) and
  // O_exact in the K/V stages, once both groups are done with them.
  const SmemTile<BM, D> oe_tile{kv_stages};
  static_assert(4 * BN >= BM, "the K/V stages hold a (BM, d) tile");
  if constexpr (kExact) feed.sync();
  store_acc(q_tile, o_acc, warp_row0, 1.0f);
  if constexpr (kExact) store_acc(oe_tile, oe_acc, warp_row0, 1.0f);
  feed.sync();
  const size_t ld_o = static_cast<size_t>(p.H) * D;
  const int first = max(0, -q0);  // the block's first row in [0, T)
  store_tile<Feed::kConsumerThreads>(q_tile, p.o + head_offset(b, q0 + first, h, p.T, p.H, D), ld_o,
                                     p.T - q0, first);
  if constexpr (kExact)
    store_tile<Feed::kConsumerThreads>(
        oe_tile, p.o_exact + head_offset(b, q0 + first, h, p.T, p.H, D), ld_o, p.T - q0, first);
}

template <class Rows, class Feed, class Tr, Rounding kRounding, Calibration kCalibration,
          Indices kIndices, bool kExact>
__global__ void __launch_bounds__(Feed::kThreads, 1)
    forward_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(1024) unsigned char smem[];
  if constexpr (Rows::kCompiledHere)
    forward_block<Rows, Feed, Tr, kRounding, kCalibration, kIndices, kExact>(p, smem);
}

// δ = dO·O of this thread's two rows per row tile, from the block's (BM, d) dO and
// O tiles: each of a row's four threads sums its accumulator columns, then the
// four add their shares (rows past T: 0). Thread 0 of each four stores it to
// delta_out (the (b, h) slice of the row values) for the dK/dV pass.
template <int kRowTiles, int BM, int D>
__device__ __forceinline__ void row_deltas(float (&delta)[kRowTiles][2], SmemTile<BM, D> do_tile,
                                           SmemTile<BM, D> o_tile, int warp_row0, int row_first,
                                           int T, float* delta_out) {
#pragma unroll
  for (int mt = 0; mt < kRowTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = warp_row0 + acc_row(mt, 2 * half);  // within the block
      float sum = 0.0f;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        const int col = acc_col(dt, 0);
        const float2 g =
            __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(do_tile.at(r, col)));
        const float2 o =
            __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(o_tile.at(r, col)));
        sum = fmaf(g.x, o.x, fmaf(g.y, o.y, sum));
      }
      const int row = row_first + acc_row(mt, 2 * half);
      delta[mt][half] = row < T ? row_sum4(sum) : 0.0f;
      if (row < T && threadIdx.x % 4 == 0) delta_out[row] = delta[mt][half];
    }
}

// ---------------------------------------------------------------------------
// dQ for the lerp and weight-STE rules. Grid (ceil(T / kBlockM), H, B).
// kDelta: the block computes its rows' δ = dO·O itself (from a resident O tile)
// and stores it for the dK/dV pass, in place of the skeleton's delta pre-pass:
// the two-launch backward at d = 64, where dK/dV runs after the dQ pass anyway
// (one launch and one read of dO fewer: lerp's backward 0.231 → 0.228 ms at
// (8, 12, 1024, 64) by `qattn bench attention --kind kinterval`). At d = 128 the
// third resident tile made the dQ pass slower than the pre-pass it saves
// (docs/kinterval.md, "Design decisions"); a one-launch backward runs the pre-pass.
template <int D>
constexpr bool dq_computes_delta() {
  return D == 64;
}
template <class Tr, bool kDelta>
constexpr int dq_smem_bytes() {
  return Tr::kSmemBytes + (kDelta ? Tr::kBlockM * Tr::kHeadDim * 2 : 0);
}

template <class Rows, class Feed, class Tr, Rule kRule, Calibration kCalibration, bool kDelta>
__device__ __forceinline__ void dq_block(const Params& p, BlockIndex at, unsigned char* smem) {
  static_assert(kRule != Rule::prob_ste, "the probability STE uses FPA's dQ pass");
  check_row_group<Rows, Feed, Tr::kBlockM>();
  constexpr int D = Tr::kHeadDim, BM = Tr::kBlockM, BN = Tr::kBlockN, RT = Rows::kRowTiles;
  constexpr bool kFwm = kCalibration == Calibration::fwm;
  const SmemTile<BM, D> q_tile{reinterpret_cast<bf16*>(smem)};  // (BM, d)
  const SmemTile<BM, D> do_tile{q_tile.data + BM * D};          // (BM, d)
  bf16* kv_stages = do_tile.data + BM * D;                      // 2 x [(BN, d) K, (BN, d) V]
  const SmemTile<BM, D> o_tile{reinterpret_cast<bf16*>(smem + Tr::kSmemBytes)};  // (BM, d), kDelta

  const int q_block = at.block, h = at.h, b = at.b;
  const int q0 = q_block * BM;
  const int warp_row0 = Rows::warp_first_row();
  const int row_first = q0 + warp_row0;
  const int group_row_last = q0 + Rows::first_row() + Rows::kRows - 1;
  const size_t ld = static_cast<size_t>(3) * p.H * D;
  const size_t stat0 = (static_cast<size_t>(b) * p.H + h) * p.T;  // (b, h) slice of the row values
  const KvStages<Tr> kv{kv_stages, p.qkv + qkv_offset(b, 0, 1, h, p.T, p.H, D),
                        p.qkv + qkv_offset(b, 0, 2, h, p.T, p.H, D), ld, p.T};
  const int n_kblocks = (min(p.T, q0 + BM) + BN - 1) / BN;
  auto resident = [&](auto& to) {
    to.tile(q_tile, qkv_source(p, b, q0, 0, h, D));
    to.tile(do_tile, dout_source(p, b, q0, h, D));
    if constexpr (kDelta) to.tile(o_tile, head_source(p, p.o, &p.o_map, b, q0, h, D));
  };
  auto keys_values = [&](int j, int s, auto& to) {
    to.tile(kv.k(s), qkv_source(p, b, j * BN, 1, h, D));
    to.tile(kv.v(s), qkv_source(p, b, j * BN, 2, h, D));
  };
  Feed feed(smem + dq_smem_bytes<Tr, kDelta>());
  if (feed.producer()) {
    feed.produce(resident, steps(0, n_kblocks, keys_values));
    return;
  }
  feed.consumer_start();

  // This thread's two rows per row tile (rows past T: zero statistics, never stored).
  // Lerp's dS = h v_a λ has the row's factor λ: the product takes h v_a (hv) and dQ's
  // rows are multiplied by λ after the loop. 1/Ẑ is folded into the weights' exponents:
  // v_a / Ẑ = 2^(a step + v_offset) (vz) and w / Ẑ = 2^(r c log2(e) + w_offset), so
  // that h = (g − δ) / Ẑ is never formed.
  // The calibration terms are row sums over this thread's columns. The weight STE:
  // dL/dm = −Σ ds, dL/dℓ = 0. Lerp (§5.11) takes h with δ = dO·O of the bf16 output
  // in place of ḡ = Σ p̂ g; they differ by ε = ḡ − δ = Σ_j h_j ŵ_j = Σ hv (1 + t ρ), and
  // the terms through m and ℓ, which are small beside h ŵ once Δ is large, would carry
  // ε/Ẑ times ∂Ẑ/∂m (of size ε). So the row's sums are taken with h and per unit h,
  //   Σ hv, Σ hv t, Σ vz and (minmax) Σ hv b, Σ vz b with b = lerp_m_bracket,
  // and the terms are those of ḡ: with Σ ds = λ (Σ hv − ε Σ vz),
  //   fwm: dL/dm = −Σ ds, dL/dℓ = 0;
  //   minmax: dL/dm = −(Σ hv b − ε Σ vz b) / K, dL/dℓ = −Σ ds − dL/dm.
  RowStats st[RT][2];
  float delta[RT][2];  // δ = dO·O
  float v_offset[RT][2], w_offset[RT][2];
  LerpSlopes slopes[RT][2];
  float ds_sum[RT][2];  // Σ hv (lerp) or Σ ds (the weight STE)
  float hvt_sum[RT][2], vz_sum[RT][2], hvb_sum[RT][2], vzb_sum[RT][2];  // lerp: Σ hv t, ...
  // The rows' statistics are loaded while the resident tiles land (one block per SM:
  // nothing else hides the latency of either).
#pragma unroll
  for (int mt = 0; mt < RT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row_first + acc_row(mt, 2 * half);
      st[mt][half] = row < p.T ? p.stats[stat0 + row] : RowStats{};
      if constexpr (!kDelta) delta[mt][half] = row < p.T ? p.delta[stat0 + row] : 0.0f;
    }
  feed.resident(resident);
#pragma unroll
  for (int mt = 0; mt < RT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const RowStats& r = st[mt][half];
      const float log2_inv_z = log2f(r.inv_z);  // rows past T: −inf, weights 0
      v_offset[mt][half] = fmaf(-p.grid.K, r.step, log2_inv_z);
      w_offset[mt][half] = log2_inv_z - r.w_base;
      slopes[mt][half] = lerp_slopes(r, r.u_scale / p.scale);
      ds_sum[mt][half] = hvt_sum[mt][half] = vz_sum[mt][half] = 0.0f;
      hvb_sum[mt][half] = vzb_sum[mt][half] = 0.0f;
    }
  constexpr bool kLerpMinmax = kRule == Rule::lerp && !kFwm;

  typename Rows::template A<BM, D> q_a, do_a;  // the group's rows of Q and dO
  float dq_acc[RT][D / 8][4];                  // (16 RT, d) rows of dQ owned by this warp
  zero(dq_acc);
  feed.consume(0, n_kblocks, keys_values, [&](int j, int s) {
    if (j == 0) {  // the resident tiles have landed (the cp.async feed: with step 0's)
      q_a.load(q_tile);
      do_a.load(do_tile);
      if constexpr (kDelta)
        row_deltas<RT>(delta, do_tile, o_tile, warp_row0, row_first, p.T, p.delta + stat0);
    }
    const int k0 = j * BN;
    if (k0 > group_row_last) return;
    float w[RT][BN / 8][4];   // (16 RT queries, BN keys): raw S, then dS_direct
    float dp[RT][BN / 8][4];  // (16 RT queries, BN keys): dP = dO Vᵀ
    Rows::issue_scores(w, q_a, kv.k(s));
    Rows::issue_scores(dp, do_a, kv.v(s));  // back to back on the tensor cores
    Rows::template wait<0>(w, dp);
    // Future keys: g = ḡ gives dL/dŵ = 0 and a raw score of −inf gives w = 0, so
    // they add nothing below (and no inf · 0).
    hide_future_keys<RT, BN / 8>(k0, row_first, [&](int mt, int nt, int e) {
      w[mt][nt][e] = -INFINITY;
      dp[mt][nt][e] = delta[mt][e / 2];
    });
    for_each_acc<RT, BN / 8>([&](int mt, int nt, int e) {
      const int half = e / 2;
      const RowStats& r = st[mt][half];
      const float raw = w[mt][nt][e];  // future keys: −inf
      const float u = grid_position(r, raw);
      const float g = dp[mt][nt][e] - delta[mt][half];  // dL/dŵ = g / Ẑ
      float ds;                                         // lerp: dS / λ
      if constexpr (kRule == Rule::lerp) {
        // Below the fwm window ŵ is the constant 0, and so is a future key's (u = −inf;
        // a visible minmax u is at least 0 up to rounding): the cell is taken at
        // max(u, 0) (also a flat row's NaN, whose terms are dropped) and vz zeroed.
        const float uc = fmaxf(u, 0.0f);
        float a, t;
        lerp_cell(uc, p.grid.K, a, t);
        const float vz_grid = fast_exp2(fmaf(a, r.step, v_offset[mt][half]));  // v_a / Ẑ
        const float vz = u < (kFwm ? 0.0f : -1.0f) ? 0.0f : vz_grid;
        ds = g * vz;  // h v_a
        hvt_sum[mt][half] = fmaf(ds, t, hvt_sum[mt][half]);
        vz_sum[mt][half] += vz;
        if constexpr (kLerpMinmax) {
          const float b = lerp_m_bracket(a, t, uc, slopes[mt][half], p.grid.K);
          hvb_sum[mt][half] = fmaf(ds, b, hvb_sum[mt][half]);
          vzb_sum[mt][half] = fmaf(vz, b, vzb_sum[mt][half]);
        }
      } else {  // weight STE: w = exp(s − m) in place of ŵ
        const float ds_w = g * fast_exp2(fmaf(raw, p.scale_log2, w_offset[mt][half]));
        ds = kFwm && u < p.mask_below ? 0.0f : ds_w;
      }
      ds_sum[mt][half] += ds;
      w[mt][nt][e] = ds;
    });
    Rows::accumulate(dq_acc, w, kv.k(s));  // dQ += dS K (lerp: dS / λ)
  });
  if constexpr (kRule == Rule::lerp)
#pragma unroll
    for (int mt = 0; mt < RT; ++mt)
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) dq_acc[mt][dt][e] *= slopes[mt][e / 2].lambda;

          // The calibration terms land on the argmax and argmin keys: dQ_i += dL/dm k_argmax +
          // dL/dℓ k_argmin.
#pragma unroll
  for (int mt = 0; mt < RT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const RowStats& r = st[mt][half];
      const LerpSlopes& sl = slopes[mt][half];
      float ds_row = row_sum4(ds_sum[mt][half]), eps = 0.0f;
      if constexpr (kRule == Rule::lerp) {
        eps = fmaf(sl.rho, row_sum4(hvt_sum[mt][half]), ds_row);  // ε = ḡ − δ
        ds_row = sl.lambda * fmaf(-eps, row_sum4(vz_sum[mt][half]), ds_row);
      }
      float m_grad = -ds_row, l_grad = 0.0f;
      if constexpr (kLerpMinmax) {
        const float bracket = fmaf(-eps, row_sum4(vzb_sum[mt][half]), row_sum4(hvb_sum[mt][half]));
        m_grad = -p.grid.inv_K * bracket;
        l_grad = -ds_row - m_grad;
      }
      // A flat lerp row has constant weights: nothing flows through m or ℓ.
      if (p.detach || (kRule == Rule::lerp && r.u_scale == 0.0f)) m_grad = l_grad = 0.0f;
      const int row = row_first + acc_row(mt, 2 * half);
      if (row >= p.T) continue;
      const bf16* k_max = kv.k_src + static_cast<size_t>(r.argmax) * ld;
      const bf16* k_min = kv.k_src + static_cast<size_t>(r.argmin) * ld;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        const int col = acc_col(dt, 0);
        const float2 kx = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(k_max + col));
        const float2 kn = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(k_min + col));
        dq_acc[mt][dt][2 * half] += m_grad * kx.x + l_grad * kn.x;
        dq_acc[mt][dt][2 * half + 1] += m_grad * kx.y + l_grad * kn.y;
      }
      if (threadIdx.x % 4 == 0) {
        p.dm[stat0 + row] = m_grad;
        p.dl[stat0 + row] = l_grad;
      }
    }

  // Stage dQ (times c) in the Q tile: a warp writes only rows its own group read.
  store_acc(q_tile, dq_acc, warp_row0, p.scale);
  feed.sync();
  store_tile<Feed::kConsumerThreads>(q_tile, p.dqkv + qkv_offset(b, q0, 0, h, p.T, p.H, D), ld,
                                     p.T - q0);
}

template <class Rows, class Feed, class Tr, Rule kRule, Calibration kCalibration>
__global__ void __launch_bounds__(Feed::kThreads, 1) dq_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(1024) unsigned char smem[];
  if constexpr (Rows::kCompiledHere)
    dq_block<Rows, Feed, Tr, kRule, kCalibration, dq_computes_delta<Tr::kHeadDim>()>(
        p, last_first(block_by_rank()), smem);
}

// ---------------------------------------------------------------------------
// dK, dV for every rule, after the dQ pass. Grid (ceil(T / kBlockN), H, B).
// Each row group owns keys of the block and computes the transposed tiles (keys
// x queries) so p̂ᵀ and dSᵀ go from accumulators straight into the A operands.
template <int kHeadDim, int kBlockN, int kBlockM>
constexpr int dkdv_smem_bytes() {
  // K and V tiles, two stages of (Q tile, dO tile), two stages of the queries'
  // RowStats, QueryValues and dL/dℓ.
  return (2 * kBlockN + 4 * kBlockM) * kHeadDim * 2 +
         2 * kBlockM * (sizeof(RowStats) + sizeof(QueryValues) + sizeof(float));
}

// Bit q set: query q of a kQueries-query step has its argmax (kMin: or argmin)
// among the kKeys keys from key0 (a warp's keys). Two queries a lane, one ballot each.
template <int kQueries, int kKeys, bool kMin>
__device__ __forceinline__ uint64_t queries_routing_to(int key0, const StagedStats& stats) {
  static_assert(kQueries == 64, "a ballot per 32 queries, two of them");
  uint64_t bits = 0;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float4 r = stats.hi[32 * half + threadIdx.x % 32];
    const bool hit = static_cast<unsigned>(__float_as_int(r.z) - key0) < kKeys ||
                     (kMin && static_cast<unsigned>(__float_as_int(r.w) - key0) < kKeys);
    bits |= static_cast<uint64_t>(__ballot_sync(0xffffffffu, hit)) << (32 * half);
  }
  return bits;
}

// kRoutes: the calibration terms enter dSᵀ at the argmax / argmin keys (lerp
// and the weight STE); without them the loop has no compares per entry for
// them. Off in the one-launch backward (dkdv_dq_kernel: the probability STE and
// detached extrema); in the two-launch one (dkdv_kernel, which the mma.sync family
// also runs detached) a detached run finds no tile that routes.
template <class Rows, class Feed, class Tr, Rule kRule, Calibration kCalibration, bool kRoutes>
__device__ __forceinline__ void dkdv_block(const Params& p, BlockIndex at, unsigned char* smem) {
  check_row_group<Rows, Feed, Tr::kBlockN>();
  constexpr int D = Tr::kHeadDim, BM = Tr::kBlockM, BN = Tr::kBlockN, RT = Rows::kRowTiles;
  constexpr bool kFwm = kCalibration == Calibration::fwm;
  constexpr bool kLerpMinmax = kRule == Rule::lerp && !kFwm;
  const SmemTile<BN, D> k_tile{reinterpret_cast<bf16*>(smem)};  // (BN, d)
  const SmemTile<BN, D> v_tile{k_tile.data + BN * D};           // (BN, d)
  bf16* q_stages = v_tile.data + BN * D;                        // 2 x [(BM, d) Q, (BM, d) dO]
  float4* stat_stages = reinterpret_cast<float4*>(q_stages + 4 * BM * D);  // 2 x [(BM) lo, (BM) hi]
  QueryValues* value_stages = reinterpret_cast<QueryValues*>(stat_stages + 4 * BM);  // 2 x (BM)
  float* l_grad_stages = reinterpret_cast<float*>(value_stages + 2 * BM);            // 2 x (BM)

  const int h = at.h, b = at.b;
  const int k0 = at.block * BN;
  const int warp_row0 = Rows::warp_first_row();  // first key of the warp, within the block
  const int warp_key0 = k0 + warp_row0;
  const int group_key0 = k0 + Rows::first_row();  // first key of the group
  const size_t ld = static_cast<size_t>(3) * p.H * D;
  const size_t stat0 = (static_cast<size_t>(b) * p.H + h) * p.T;
  static_assert(!kRoutes || kRule != Rule::prob_ste, "the probability STE routes nothing");
  // The row values besides δ: dL/dm and dL/dℓ, or for the probability STE the exact L.
  // Detached, dL/dm = dL/dℓ = 0 are not read (zeros).
  const bool routes = kRoutes && !p.detach;
  const float* second = kRule == Rule::prob_ste ? p.lse + stat0 : routes ? p.dm + stat0 : nullptr;
  const float* l_grad = routes && kLerpMinmax ? p.dl + stat0 : nullptr;
  auto q_stage = [&](int s) { return SmemTile<BM, D>{q_stages + (2 * s) * BM * D}; };
  auto do_stage = [&](int s) { return SmemTile<BM, D>{q_stages + (2 * s + 1) * BM * D}; };
  auto stat_stage = [&](int s) {
    return StagedStats{stat_stages + 2 * s * BM, stat_stages + (2 * s + 1) * BM};
  };
  auto resident = [&](auto& to) {
    to.tile(k_tile, qkv_source(p, b, k0, 1, h, D));
    to.tile(v_tile, qkv_source(p, b, k0, 2, h, D));
  };
  auto queries = [&](int i, int s, auto& to) {
    const int q0 = i * BM;
    to.tile(q_stage(s), qkv_source(p, b, q0, 0, h, D));
    to.tile(do_stage(s), dout_source(p, b, q0, h, D));
    to.rows([&](int thread, int threads, auto copier) {
      copy_row_stats<BM>(stat_stage(s), p.stats + stat0 + q0, p.T - q0, thread, threads, copier);
      copy_query_values<BM>(value_stages + s * BM,
                            kRoutes && kLerpMinmax ? l_grad_stages + s * BM : nullptr,
                            p.delta + stat0 + q0, second ? second + q0 : nullptr,
                            l_grad ? l_grad + q0 : nullptr, p.T - q0, thread, threads, copier);
    });
  };
  // Causal: queries before the block's first key see none of it.
  const int i_first = k0 / BM, i_last = (p.T + BM - 1) / BM;
  Feed feed(smem + dkdv_smem_bytes<D, BN, BM>());
  if (feed.producer()) {
    feed.produce(resident, steps(i_first, i_last, queries));
    return;
  }
  feed.consumer_start();
  feed.resident(resident);
  const float inv_scale = 1.0f / p.scale;

  float dk_acc[RT][D / 8][4], dv_acc[RT][D / 8][4];  // (16 RT, d) rows of dK, dV owned by this warp
  zero(dk_acc);
  zero(dv_acc);
  feed.consume(i_first, i_last, queries, [&](int i, int s) {
    const int q0 = i * BM;
    // Skip when every key of the group is after every query of the block, or past T.
    if (group_key0 > q0 + BM - 1 || group_key0 >= p.T) return;
    const StagedStats stats = stat_stage(s);
    const QueryValues* values = value_stages + s * BM;
    const float* l_grads = l_grad_stages + s * BM;
    typename Rows::template A<BN, D> k_a, v_a;  // the group's rows of K and V (mma.sync: loaded
    k_a.load(k_tile);                           // per step, fewer live registers)
    v_a.load(v_tile);
    float w[RT][BM / 8][4];  // (16 RT keys, BM queries): raw Sᵀ = K Qᵀ, then dSᵀ / (dPᵀ − ḡ)
    float dp[RT][BM / 8][4];  // (16 RT keys, BM queries): dPᵀ = V dOᵀ, then dSᵀ
    // dPᵀ runs while p̂ᵀ is computed where the registers allow (d = 64: at d = 128
    // dK and dV alone hold 128 per thread); else it is issued beside dV's product.
    constexpr bool kEarlyDp = D == 64;
    Rows::issue_scores(w, k_a, q_stage(s));
    if constexpr (kEarlyDp) Rows::issue_scores(dp, v_a, do_stage(s));
    Rows::template wait<kEarlyDp ? 1 : 0>(w);
    // Entries whose key is after the query, or whose query is past T, are hidden
    // (the TMA feed reads the next batch's Q and dO rows there, not zeros). Most
    // steps have none: every key of the warp precedes every query, all before T.
    const bool all_visible = warp_key0 + 16 * RT - 1 <= q0 && q0 + BM <= p.T;
    auto hidden = [&](int mt, int nt, int e) {
      const int qi = acc_col(nt, e);
      return warp_key0 + acc_row(mt, e) > q0 + qi || q0 + qi >= p.T;
    };
    uint32_t p_a[RT][BM / 16][4];  // p̂ᵀ rounded to bf16: the A operand of dV += p̂ᵀ dO
    // From Sᵀ alone: p̂ᵀ, and the factor f with dSᵀ_direct = f (dPᵀ − ḡ), kept in w.
    with_mask(all_visible, [&](auto unmasked) {
#pragma unroll
      for (int mt = 0; mt < RT; ++mt)
#pragma unroll
        for (int nt = 0; nt < BM / 8; ++nt) {
          float pw[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const RowStats r = stats.load(acc_col(nt, e));
            const float raw = w[mt][nt][e];
            const float u =
                grid_position(r, raw);  // future keys (u past the grid) are hidden below
            // Below the fwm window ŵ is 0, and so is lerp's gradient: 1/Ẑ is replaced by 0.
            const float inv_z = kFwm && u < 0.0f ? 0.0f : r.inv_z;
            float f;
            if constexpr (kRule == Rule::lerp) {
              const LerpPoint c = lerp_point(fmaxf(u, 0.0f), r, p.grid);  // one cell for p̂ and dS
              pw[e] = c.weight() * inv_z;
              f = c.dv * (inv_z * (r.u_scale * inv_scale));  // dL/dŵ = (g − ḡ) / Ẑ, times dv / Δ
            } else {
              pw[e] = grid_value(nearest_point(u), r, p.grid) * inv_z;
              if constexpr (kRule == Rule::weight_ste) {  // w = exp(s − m) in place of ŵ
                const float h = kFwm && u < p.mask_below ? 0.0f : r.inv_z;
                f = unquantised_weight(r, raw, p.scale_log2) * h;
              } else {  // exact P = exp(c r − L)
                f = fast_exp2(fmaf(raw, p.scale_log2, -values[acc_col(nt, e)].second * kLog2e));
              }
            }
            if (!decltype(unmasked)::value && hidden(mt, nt, e)) pw[e] = f = 0.0f;
            w[mt][nt][e] = f;
          }
          // The accumulator pairs of acc_to_a (tile_mma.cuh).
          p_a[mt][nt / 2][2 * (nt % 2)] = pack_bf16x2(pw[0], pw[1]);
          p_a[mt][nt / 2][2 * (nt % 2) + 1] = pack_bf16x2(pw[2], pw[3]);
        }
    });
    if constexpr (!kEarlyDp) Rows::issue_scores(dp, v_a, do_stage(s));
    Rows::accumulate(dv_acc, p_a, do_stage(s));  // dV += p̂ᵀ dO; its wait covers dPᵀ's group too
    Rows::template wait<0>(dp);
    // dSᵀ = f (dPᵀ − ḡ), plus (kRoutes) the calibration terms on the key that is the
    // row's argmax (argmin; dL/dℓ is 0 but for lerp minmax); detached, dL/dm = dL/dℓ = 0.
    // Hidden entries have f = 0, and their key is never the argmax or argmin
    // (a visible key; a query past T has zero values).
    // Few of a step's queries route to one of the warp's 16 RT keys: a bit per query
    // that may (a ballot over the step's queries), and the per-entry compares only
    // in the 8-query tiles that have one.
    uint64_t routing = 0;  // detached: nothing to route, no compares
    if constexpr (kRoutes)
      if (routes) routing = queries_routing_to<BM, 16 * RT, kLerpMinmax>(warp_key0, stats);
#pragma unroll
    for (int mt = 0; mt < RT; ++mt)
#pragma unroll
      for (int nt = 0; nt < BM / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          dp[mt][nt][e] = (dp[mt][nt][e] - values[acc_col(nt, e)].delta) * w[mt][nt][e];
        if constexpr (kRoutes) {
          if (((routing >> (8 * nt)) & 0xffu) != 0) {  // uniform over the warp
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int qi = acc_col(nt, e);
              const float4 r = stats.hi[qi];
              const int key = warp_key0 + acc_row(mt, e);
              if (key == __float_as_int(r.z)) dp[mt][nt][e] += values[qi].second;
              if (kLerpMinmax && key == __float_as_int(r.w)) dp[mt][nt][e] += l_grads[qi];
            }
          }
        }
      }
    Rows::accumulate(dk_acc, dp, q_stage(s));  // dK += dSᵀ Q
  });

  // Stage dK (times c) and dV in the K and V tiles: a warp writes only rows its
  // own group read.
  store_acc(k_tile, dk_acc, warp_row0, p.scale);
  store_acc(v_tile, dv_acc, warp_row0, 1.0f);
  feed.sync();
  store_tile<Feed::kConsumerThreads>(k_tile, p.dqkv + qkv_offset(b, k0, 1, h, p.T, p.H, D), ld,
                                     p.T - k0);
  store_tile<Feed::kConsumerThreads>(v_tile, p.dqkv + qkv_offset(b, k0, 2, h, p.T, p.H, D), ld,
                                     p.T - k0);
}

template <class Rows, class Feed, class Tr, Rule kRule, Calibration kCalibration>
__global__ void __launch_bounds__(Feed::kThreads, 1) dkdv_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(1024) unsigned char smem[];
  if constexpr (Rows::kCompiledHere)
    dkdv_block<Rows, Feed, Tr, kRule, kCalibration, kRule != Rule::prob_ste>(p, block_by_rank(),
                                                                             smem);
}

// The dQ half of a combined launch (below): K-interval's dQ blocks, or FPA's
// (Hopper) for the probability STE. kSmemBytes includes the feed's barriers.
template <class Rows, class Feed, class Tr, Rule kRule, Calibration kCalibration>
struct KIntervalDq {
  static constexpr int kBlockM = Tr::kBlockM, kThreads = Feed::kThreads;
  static constexpr int kSmemBytes = Tr::kSmemBytes + Feed::kBarrierBytes;
  __device__ static void run(const Params& p, const sm90::BackwardTmaParams&, BlockIndex at,
                             unsigned char* smem) {
    dq_block<Rows, Feed, Tr, kRule, kCalibration, false>(p, at, smem);
  }
};
template <class Tr>
struct FpaDq {
  static constexpr int kBlockM = Tr::kBlockM, kThreads = Tr::kThreads;
  static constexpr int kSmemBytes = Tr::kSmemBytes;
  __device__ static void run(const Params&, const sm90::BackwardTmaParams& fpa, BlockIndex at,
                             unsigned char* smem) {
    sm90::backward_dq_block<Tr>(fpa, at, smem);
  }
};

// dK/dV and dQ blocks in one launch where dK/dV needs nothing from the dQ pass
// (extrema detached, or the probability STE): FPA's backward order, blocks ranked
// over all heads, dK/dV blocks first (key block 0, which sees every query,
// leading), then dQ blocks (the last query block leading), so that the dQ blocks
// fill the tail of the dK/dV waves.
template <class Rows, class Feed, class Tr, class Dq, Rule kRule, Calibration kCalibration>
__global__ void __launch_bounds__(Feed::kThreads, 1)
    dkdv_dq_kernel(const __grid_constant__ Params p,
                   const __grid_constant__ sm90::BackwardTmaParams fpa) {
  static_assert(Dq::kThreads == Feed::kThreads, "both halves of the launch share its block size");
  extern __shared__ __align__(1024) unsigned char smem[];
  if constexpr (Rows::kCompiledHere) {
    const int n_kv_blocks = (p.T + Tr::kBlockN - 1) / Tr::kBlockN;
    const BlockIndex at = block_by_rank();
    if (at.block < n_kv_blocks)
      dkdv_block<Rows, Feed, Tr, kRule, kCalibration, false>(p, at, smem);
    else
      Dq::run(p, fpa, last_first(at), smem);
  }
}

// ---------------------------------------------------------------------------
// Launchers.

// The two kernel families: the row group and the feed of each kernel, and the
// tiles per head dim. The backward of both uses 8 warps x 16 rows (two
// warpgroups) and 64-query dK/dV steps.
struct MmaSyncFamily {
  static constexpr FpaKernels kKernels = FpaKernels::mma_sync;
  template <int D>
  using Tiles = std::conditional_t<
      D == 64,
      KernelTiles<ForwardTraits<64, 4, 2, 64>, DkDvTraits<64, 8, 1, 64>, DqTraits<64, 8, 1, 64>>,
      KernelTiles<ForwardTraits<128, 8, 1, 64>, DkDvTraits<128, 8, 1, 64>,
                  DqTraits<128, 8, 1, 64>>>;
  // The forward with the exact softmax beside (probability STE): a second d-wide
  // accumulator, so 16 rows per warp at d = 64 too, and 32-key steps at d = 128
  // (ptxas: 64-key steps spill 156 bytes there, 32-key steps 8-36; Q's
  // fragments, O and O_exact alone take 160 registers).
  template <int D>
  using ExactForward = ForwardTraits<D, 8, 1, D == 64 ? 64 : 32>;
  template <class Tr>
  using Rows = WarpRows<Tr::kRowTiles>;
  template <class Tr, bool kRowValues>
  using Feed = CpAsyncFeed<Tr::kThreads>;
};

struct WgmmaFamily {
  static constexpr FpaKernels kKernels = FpaKernels::wgmma;
  // Two consumer warpgroups of 64 rows (the shapes of 8 warps x 16 rows, whose
  // stage layout and shared-memory sizes the kernels share with the mma.sync
  // family), fed by TMA from a producer warpgroup.
  // The forward at d = 64 has three consumer warpgroups (192 rows, 160 registers a
  // thread): a third warp per scheduler to switch to through its long
  // element-wise work per score. dQ takes 128-key steps at both head dims (at
  // d = 128 its accumulators hold 192 registers of the 240, as dK/dV's do). Both
  // measured faster than the alternative (docs/kinterval.md, "Design decisions").
  template <int D>
  using Tiles = KernelTiles<ForwardTraits<D, D == 64 ? 12 : 8, 1, 128>, DkDvTraits<D, 8, 1, 64>,
                            DqTraits<D, 8, 1, 128>>;
  // With the exact softmax beside (probability STE): 64-key steps at d = 128,
  // where O, O_exact and 128 keys' scores would not fit in the 240 registers.
  template <int D>
  using ExactForward = ForwardTraits<D, 8, 1, D == 64 ? 128 : 64>;
  template <class Tr>
  using Rows = WarpgroupRows;
  template <class Tr, bool kRowValues>
  using Feed = TmaFeed<Tr::kThreads, kRowValues>;
};

// f(MmaSyncFamily{}) or f(WgmmaFamily{}), chosen as FPA chooses.
template <class F>
void with_family(FpaKernels kernels, F&& f) {
  if (resolve_kernels(kernels, "K-interval attention") == FpaKernels::wgmma)
    return f(WgmmaFamily{});
  f(MmaSyncFamily{});
}

void check_options(const KIntervalOptions& opt) {
  if (opt.K < 1)
    throw std::invalid_argument("kinterval: K = " + std::to_string(opt.K) +
                                " is not allowed (K >= 1)");
  if (opt.calibration == Calibration::fwm && !(opt.window > 0.0))
    throw std::invalid_argument("kinterval: window = " + std::to_string(opt.window) +
                                " is not allowed (fwm needs a window > 0)");
}

// Workspace of the backward: δ, dL/dm, dL/dℓ per row.
struct Workspace {
  float *delta, *dm, *dl;
};
Workspace carve(void* base, const AttentionShape& s) {
  const size_t rows = static_cast<size_t>(s.B) * s.H * s.T;
  float* f = static_cast<float*>(base);
  return {f, f + rows, f + 2 * rows};
}

// What the forward saves for the backward (kinterval_row_stats floats per row):
// the RowStats (B, H, T), then for the probability STE the exact softmax's
// output (B, T, H, d) bf16 and L (B, H, T).
struct Saved {
  RowStats* stats;
  bf16* o_exact;  // null but for the probability STE
  float* lse;     // likewise
};
Saved carve_saved(const KIntervalOptions& opt, const AttentionShape& s, const float* base) {
  const size_t rows = static_cast<size_t>(s.B) * s.H * s.T;
  RowStats* stats = reinterpret_cast<RowStats*>(const_cast<float*>(base));
  if (rule_of(opt) != Rule::prob_ste) return {stats, nullptr, nullptr};
  bf16* o_exact = reinterpret_cast<bf16*>(stats + rows);  // 32-byte aligned, as the RowStats
  return {stats, o_exact, reinterpret_cast<float*>(o_exact + rows * s.d)};
}

// The kernels' parameters, once the options are known to be allowed.
Params make_params(const KIntervalOptions& opt, const AttentionShape& s) {
  check_options(opt);
  Params p{};
  p.B = s.B, p.H = s.H, p.T = s.T;
  p.scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  p.scale_log2 = p.scale * kLog2e;
  const bool fwm = opt.calibration == Calibration::fwm;
  p.grid = {static_cast<float>(opt.K), 1.0f / static_cast<float>(opt.K), fwm ? -INFINITY : 0.0f};
  p.window = static_cast<float>(opt.window);
  p.mask_below = fwm && opt.ste_window_mask ? 0.0f : -INFINITY;
  p.detach = opt.detach_extrema;
  return p;
}

// The TMA feed's tensor maps of qkv and (backward) dout.
void add_tensor_maps(Params& p, const AttentionShape& s) {
  const uint64_t rows = static_cast<uint64_t>(s.B) * s.T, cols = 3ull * s.H * s.d;
  p.qkv_map = sm90::make_tensor_map(p.qkv, rows, cols, cols);
  if (p.dout != nullptr) {  // the backward
    p.dout_map = sm90::make_tensor_map(p.dout, rows, cols / 3, cols / 3);
    p.o_map = sm90::make_tensor_map(p.o, rows, cols / 3, cols / 3);
  }
}

// Run-time options as compile-time constants: f(std::integral_constant<Enum, value>).
template <class F>
void with_calibration(Calibration c, F&& f) {
  if (c == Calibration::fwm) return f(std::integral_constant<Calibration, Calibration::fwm>{});
  f(std::integral_constant<Calibration, Calibration::minmax>{});
}
template <class F>
void with_rounding(Rounding r, F&& f) {
  if (r == Rounding::lerp) return f(std::integral_constant<Rounding, Rounding::lerp>{});
  f(std::integral_constant<Rounding, Rounding::nearest>{});
}
template <class F>
void with_flag(bool b, F&& f) {
  if (b) return f(std::true_type{});
  f(std::false_type{});
}

template <class Family, int D, Rounding kRounding, Calibration kCal, Indices kIdx, bool kExact>
void launch_forward(const Params& p, cudaStream_t stream) {
  using Tr = std::conditional_t<kExact, typename Family::template ExactForward<D>,
                                typename Family::template Tiles<D>::Forward>;
  using Rows = typename Family::template Rows<Tr>;
  using Feed = typename Family::template Feed<Tr, false>;
  launch(forward_kernel<Rows, Feed, Tr, kRounding, kCal, kIdx, kExact>,
         dim3(ceil_div(p.T, Tr::kBlockM), p.H, p.B), Feed::kThreads,
         Tr::kSmemBytes + Feed::kBarrierBytes, stream, p);
}

template <class Family, int D>
void forward(const KIntervalOptions& opt, const Params& p, cudaStream_t stream) {
  with_calibration(opt.calibration, [&](auto calibration) {
    constexpr Calibration kCal = decltype(calibration)::value;
    if (rule_of(opt) == Rule::prob_ste)  // nearest rounding, no index tracked
      return launch_forward<Family, D, Rounding::nearest, kCal, Indices::none, true>(p, stream);
    with_rounding(opt.rounding, [&](auto rounding) {
      with_flag(tracks_indices(opt), [&](auto tracks) {
        constexpr Rounding kRounding = decltype(rounding)::value;
        constexpr Indices kIdx =
            decltype(tracks)::value ? indices_tracked(kRounding, kCal) : Indices::none;
        launch_forward<Family, D, kRounding, kCal, kIdx, false>(p, stream);
      });
    });
  });
}

template <class Family, int D, Rule kRule, Calibration kCal>
void launch_dkdv(const Params& p, cudaStream_t stream) {
  using Tr = typename Family::template Tiles<D>::DkDv;
  using Rows = typename Family::template Rows<Tr>;
  using Feed = typename Family::template Feed<Tr, true>;
  launch(dkdv_kernel<Rows, Feed, Tr, kRule, kCal>, dim3(ceil_div(p.T, Tr::kBlockN), p.H, p.B),
         Feed::kThreads, dkdv_smem_bytes<D, Tr::kBlockN, Tr::kBlockM>() + Feed::kBarrierBytes,
         stream, p);
}

// K-interval's dQ half of a one-launch backward (wgmma family).
template <int D, Rule kRule, Calibration kCal>
using WgmmaDq = KIntervalDq<WgmmaFamily::Rows<typename WgmmaFamily::Tiles<D>::Dq>,
                            WgmmaFamily::Feed<typename WgmmaFamily::Tiles<D>::Dq, false>,
                            typename WgmmaFamily::Tiles<D>::Dq, kRule, kCal>;

template <class Family, int D, Rule kRule, Calibration kCal>
void launch_dq(const Params& p, cudaStream_t stream) {
  using Dq = typename Family::template Tiles<D>::Dq;
  using Rows = typename Family::template Rows<Dq>;
  using Feed = typename Family::template Feed<Dq, false>;
  launch(dq_kernel<Rows, Feed, Dq, kRule, kCal>, dim3(ceil_div(p.T, Dq::kBlockM), p.H, p.B),
         Feed::kThreads, dq_smem_bytes<Dq, dq_computes_delta<D>()>() + Feed::kBarrierBytes, stream,
         p);
}

// dK/dV beside a dQ half (KIntervalDq or FpaDq) in one launch (wgmma family).
template <int D, class Dq, Rule kRule, Calibration kCal>
void launch_dkdv_dq(const Params& p, const sm90::BackwardTmaParams& fpa, cudaStream_t stream) {
  using Tr = typename WgmmaFamily::Tiles<D>::DkDv;
  using Rows = WgmmaFamily::Rows<Tr>;
  using Feed = WgmmaFamily::Feed<Tr, true>;
  const int dkdv_bytes = dkdv_smem_bytes<D, Tr::kBlockN, Tr::kBlockM>() + Feed::kBarrierBytes;
  launch(dkdv_dq_kernel<Rows, Feed, Tr, Dq, kRule, kCal>,
         dim3(ceil_div(p.T, Tr::kBlockN) + ceil_div(p.T, Dq::kBlockM), p.H, p.B), Feed::kThreads,
         std::max(dkdv_bytes, Dq::kSmemBytes), stream, p, fpa);
}

template <class Family, int D>
void backward(const KIntervalOptions& opt, const AttentionShape& s, const Params& p, const bf16* o,
              const Workspace& ws, cudaStream_t stream, PhaseRecorder* phases) {
  const Rule rule = rule_of(opt);
  // The skeleton's delta pre-pass and (probability STE) FPA's dQ pass read these:
  // that rule's δ and L are the exact softmax's, which the forward saved.
  BackwardParams fb{p.qkv,       rule == Rule::prob_ste ? p.o_exact : o,
                    p.dout,      p.lse,
                    ws.delta,    p.dqkv,
                    p.B,         p.H,
                    p.T,         p.scale,
                    p.scale_log2};
  // dK/dV needs the dQ pass's dL/dm and dL/dℓ unless the extrema are detached or
  // the rule is the probability STE; else the wgmma family runs both in one launch.
  const bool one_launch =
      Family::kKernels == FpaKernels::wgmma && (rule == Rule::prob_ste || opt.detach_extrema);
  // K-interval's own dQ pass of a two-launch backward computes δ at d = 64 (dq_block's kDelta).
  if (one_launch || rule == Rule::prob_ste || !dq_computes_delta<D>())
    in_phase(phases, "delta", {attention_delta_bytes(fb, D)}, stream,
             [&] { attention_delta(fb, D, stream); });
  with_calibration(opt.calibration, [&](auto calibration) {
    constexpr Calibration kCal = decltype(calibration)::value;
    auto run = [&](auto rule_constant) {
      constexpr Rule kRule = decltype(rule_constant)::value;
      // The work of K-interval's own kernels is not counted (their passes
      // depend on the rule and the calibration); FPA's dQ is S, dP and dQ.
      if (one_launch)
        return in_phase(phases, "dkdv+dq", {}, stream, [&] {
          if constexpr (kRule == Rule::prob_ste)
            launch_dkdv_dq<D, FpaDq<typename sm90::FpaTiles<D>::Dq>, kRule, kCal>(
                p, sm90::tma_params(fb, D), stream);
          else
            launch_dkdv_dq<D, WgmmaDq<D, kRule, kCal>, kRule, kCal>(p, sm90::BackwardTmaParams{},
                                                                    stream);
        });
      if constexpr (kRule == Rule::prob_ste)
        in_phase(phases, "dq", {0, causal_product_flops(s, 3)}, stream, [&] {
          fpa_backward_dq(s, p.qkv, p.dout, p.lse, ws.delta, p.dqkv, stream, Family::kKernels);
        });
      else
        in_phase(phases, "dq", {}, stream, [&] { launch_dq<Family, D, kRule, kCal>(p, stream); });
      in_phase(phases, "dkdv", {}, stream, [&] { launch_dkdv<Family, D, kRule, kCal>(p, stream); });
    };
    switch (rule) {
      case Rule::lerp:
        return run(std::integral_constant<Rule, Rule::lerp>{});
      case Rule::weight_ste:
        return run(std::integral_constant<Rule, Rule::weight_ste>{});
      case Rule::prob_ste:
        return run(std::integral_constant<Rule, Rule::prob_ste>{});
    }
  });
}

}  // namespace

int kinterval_row_stats(const KIntervalOptions& opt, int head_dim) {
  // The probability STE's exact output (d bf16 = d / 2 floats) and L.
  return kRowStats + (rule_of(opt) == Rule::prob_ste ? head_dim / 2 + 1 : 0);
}

size_t kinterval_workspace_bytes(const KIntervalOptions&, const AttentionShape& s) {
  return 3 * static_cast<size_t>(s.B) * s.H * s.T * sizeof(float);
}

void kinterval_forward(const KIntervalOptions& opt, const AttentionShape& s, const bf16* qkv,
                       bf16* o, float* stats, cudaStream_t stream, FpaKernels kernels,
                       PhaseRecorder* phases) {
  Params p = make_params(opt, s);
  const Saved saved = carve_saved(opt, s, stats);
  p.qkv = qkv, p.o = o, p.stats = saved.stats, p.o_exact = saved.o_exact, p.lse = saved.lse;
  with_family(kernels, [&](auto family) {
    using Family = decltype(family);
    if constexpr (Family::kKernels == FpaKernels::wgmma) add_tensor_maps(p, s);
    in_phase(phases, "forward", {}, stream, [&] {
      if (s.d == 64) return forward<Family, 64>(opt, p, stream);
      forward<Family, 128>(opt, p, stream);
    });
  });
}

void kinterval_backward(const KIntervalOptions& opt, const AttentionShape& s, const bf16* qkv,
                        const bf16* o, const bf16* dout, const float* stats, bf16* dqkv,
                        void* workspace, cudaStream_t stream, FpaKernels kernels,
                        PhaseRecorder* phases) {
  const Workspace ws = carve(workspace, s);
  Params p = make_params(opt, s);
  p.qkv = qkv, p.dout = dout, p.dqkv = dqkv;
  const Saved saved = carve_saved(opt, s, stats);  // read only in the backward
  p.stats = saved.stats, p.o_exact = saved.o_exact, p.lse = saved.lse;
  p.o = const_cast<bf16*>(o);  // only read here
  p.delta = ws.delta, p.dm = ws.dm, p.dl = ws.dl;
  with_family(kernels, [&](auto family) {
    using Family = decltype(family);
    if constexpr (Family::kKernels == FpaKernels::wgmma) add_tensor_maps(p, s);
    if (s.d == 64) return backward<Family, 64>(opt, s, p, o, ws, stream, phases);
    backward<Family, 128>(opt, s, p, o, ws, stream, phases);
  });
}

}  // namespace qattn::cuda
