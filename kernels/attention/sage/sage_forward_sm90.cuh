// SageBwd's forward (docs/attention-maths.md §4.4) on Hopper (sm_90a): the int8 and fp8 products
// on wgmma, the tiles by TMA through TmaFeed (feeds.cuh), for qk and pv each
// int8 (the default) or fp8. sage.cu's mma.sync kernel runs every other precision and the
// devices without sm_90a; both use the same helpers (int8_operands.cuh for the
// int8 sums, ψ of the weights and their fragments; sage_softmax.cuh for the
// bias, the mask and the softmax policies), so that for the same quantised
// operands they compute the same numbers, up to fp32 rounding where this kernel
// feeds the exact softmax rescaled scores (HopperScores).
//
// A block: three consumer warpgroups of 64 query rows (two with the K-interval
// block; Layout::kWarpgroups, sage_sm90.cuh), each warpgroup's rows in one
// quantisation block, so its S has one scale s_Q·s_K, and a producer warpgroup
// whose one thread copies, from the pre-pass's saved buffer, Q̂ (resident) and
// per 64-key step K̂ (64, d) and V̂ᵀ (d, 64) (T permuted, kPermuted) into a
// ring of stages (Layout::Feed). Per warpgroup and key block j up to the diagonal:
//   S = Q̂ K̂ᵀ (s32, wgmma ss) · s_Q s_K (+ smooth_q bias) -> causal mask
//   -> online softmax (O rescaled) -> P̃ quantised per row (s_P = max|P̃_row| / 127)
//   into s8 A fragments -> P̂ V̂ (s32, wgmma rs, a fresh accumulator: s32 cannot
//   be rescaled) -> O += P̂ V̂ · s_P s_V (fp32). The exact softmax takes S·log2(e)
//   from the int32 sums in one FFMA and rescales O only when a row's max has
//   grown by 2^8 (ExactSoftmax::update_rescaling_rarely);
// then O /= l and L (or, with the K-interval block, a first pass over K̂ for each
// row's max and min, ŵ for P̃, O /= Ẑ and the RowStats).
//
// With qk = fp8 (kQk, exact softmax; docs/attention-maths.md §4.12) Q̂ and K̂
// hold e4m3 values on power-of-two block scales and S = Q̂ K̂ᵀ is an e4m3
// wgmma into fresh fp32 accumulators, scaled once per tile by s_Q·s_K (OverD,
// sage_sm90.cuh). With pv = fp8 (kPvFp8, exact softmax; §4.12) V̂ᵀ holds
// e4m3 values on power-of-two block scales, the reference max is the running
// max (P̃ <= 1), and P̂ = e4m3(P̃ · 2^8 · s_Vj / s_V,top) goes straight into the
// fp32 O accumulator of the e4m3 wgmma: block j's scale is folded into P̂, so
// the accumulator runs over every key block with no conversion or fold, and O
// is scaled once by s_V,top · 2^-8 at the end. That product then runs one step
// deep (Layout::kOverlapped; FlashAttention-3's overlap within a warpgroup):
// step j issues S_j, then P̂_{j−1} V̂_{j−1}, waits for S_j alone, and computes
// block j's scores and softmax while P̂_{j−1} V̂_{j−1} is on the tensor cores;
// it then waits for that product, rescales O for block j where its max moved,
// packs P̂_j and releases block j − 1's stage. Each element sees the same
// operations in the same order as one step at a time (O's rescale for block j
// still comes after block j − 1's product and before block j's), so the
// outputs are the same bits.
#pragma once
#include "attention/common/feeds.cuh"
#include "attention/sage/int8_operands.cuh"
#include "attention/sage/quant.cuh"
#include "attention/sage/sage_sm90.cuh"
#include "attention/sage/sage_softmax.cuh"

namespace qattn::cuda::sage {

struct SageForwardSm90Params {
  SageWorkspace ws;
  float* stats;            // (B, H, T, Softmax::kStatFloats): L, or RowStats
  bf16* o;                 // (B, T, H, d)
  SoftmaxOptions softmax;  // the K-interval block's
  int B, H, T;
  bool smooth_q;
  CUtensorMap q, k;  // Q̂, K̂ (B·H·Tp, d), boxes (64, d)
  CUtensorMap vt;    // V̂ᵀ (B·H·d, Tp), boxes (64, 64)
};

// Shared memory, with R = kRows query rows per block:
// Q̂ (R, d) | kStages x K̂ (64, d) | kStages x V̂ᵀ (d, 64) | O (R, d) bf16 | barriers |
// the head's s_K, s_V (stage_scales; kBytes ends with the barriers).
// Each int8 tile starts at a multiple of 1024 bytes (its swizzle, tma.cuh).
template <int D, class Softmax, bool kPvFp8>
struct SageForwardSm90Layout {
  static constexpr int kWarpgroups = !Softmax::kRowPass ? 3 : 2;  // sage_sm90.cuh
  static constexpr int kRows = sage_rows(kWarpgroups);
  // fp8 P̂ V̂ runs one step deep (the kernel's comment); int8's does not: its
  // products need fresh s32 sums and a fold each, which one step deep spilled
  // and ran slower (docs/sage.md, "Tried and rejected").
  static constexpr bool kOverlapped = kPvFp8;
  // Two stages one step at a time: three (feeds.cuh) measured no faster
  // (`qattn bench attention --kind sage`, against the dK/dV kernel's three,
  // which are). One step deep holds two stages at once, and four keep two
  // steps' copies in flight ahead of it (TmaFeed::consume_overlapped).
  using Feed = flash::TmaFeed<kWarpgroups * 128, false, kOverlapped ? 4 : 2>;
  static constexpr int kQ = 0, kK = kRows * D, kVt = kK + Feed::kStages * kSageBlock * D;
  static constexpr int kO = kVt + Feed::kStages * D * kSageBlock;
  static constexpr int kBarriers = kO + kRows * D * 2;
  static constexpr int kBytes = kBarriers + Feed::kBarrierBytes;
  static_assert(kK % 1024 == 0 && kVt % 1024 == 0 && kO % 1024 == 0);
};

// Grid (ceil(blocks / kWarpgroups), B·H); every head's heaviest (last) query
// tile starts first (block_by_rank).
template <int D, class Softmax, Precision kQk, bool kPvFp8>
__global__ void __launch_bounds__(
    flash::sm90::block_threads<SageForwardSm90Layout<D, Softmax, kPvFp8>::kWarpgroups>(), 1)
    sage_forward_sm90_kernel(const __grid_constant__ SageForwardSm90Params params) {
  static_assert(!kPvFp8 || Softmax::kExact, "fp8 P̂ V̂ takes the exact softmax's P̃ <= 1");
  static_assert(kQk != Precision::bf16, "S reads the pre-pass's 8-bit copies");
  static_assert(kQk == Precision::int8 || Softmax::kExact,
                "fp8 S runs with the exact softmax (sage_check_options)");
#if QATTN_SM90A_DEVICE
  using namespace flash;
  using namespace flash::sm90;
  using Layout = SageForwardSm90Layout<D, Softmax, kPvFp8>;
  using Feed = typename Layout::Feed;
  constexpr int kRows = Layout::kRows;                    // query rows per block
  constexpr int kKeys = kSageBlock, kNTiles = kKeys / 8;  // keys per step: one quantisation block
  const SageForwardSm90Params& p = params;
  const SageWorkspace& ws = p.ws;
  extern __shared__ __align__(1024) unsigned char smem[];
  const Int8SmemTile<kRows, D> q_tile{reinterpret_cast<int8_t*>(smem + Layout::kQ)};  // (R, d)
  auto k_tile = [&](int s) {                                                          // (64, d)
    return Int8SmemTile<kKeys, D>{reinterpret_cast<int8_t*>(smem + Layout::kK) + s * kKeys * D};
  };
  auto vt_tile = [&](int s) {  // (d, 64)
    return Int8SmemTile<D, kKeys>{reinterpret_cast<int8_t*>(smem + Layout::kVt) + s * D * kKeys};
  };
  const SmemTile<kRows, D> o_tile{reinterpret_cast<bf16*>(smem + Layout::kO)};  // (R, d)

  const BlockIndex at = last_first(block_by_rank());  // grid (tiles, B H): at.h is b H + h
  const int q_tile_index = at.block, bh = at.h, b = bh / p.H, h = bh % p.H;
  const int q0 = q_tile_index * kRows;
  const int key_blocks = min(ws.blocks, (q0 + kRows - 1) / kKeys + 1);  // up to the tile's diagonal
  const int head_row0 = bh * ws.Tp;  // the head's first row in the natural copies
  // Q̂'s rows past the head's last block read the next head's rows (or
  // zeros past the tensor): finite, and those rows are never stored.
  auto resident = [&](auto& to) { to.tile(q_tile, Int8TileSource{&p.q, head_row0 + q0, 0}); };
  auto keys = [&](int j, int s, auto& to) {
    to.tile(k_tile(s), Int8TileSource{&p.k, head_row0 + j * kKeys, 0});
  };
  auto keys_values = [&](int j, int s, auto& to) {
    keys(j, s, to);
    to.tile(vt_tile(s), Int8TileSource{&p.vt, bh * D, j * kKeys});
  };

  Feed feed(smem + Layout::kBarriers);
  if (feed.producer()) {
    if constexpr (Softmax::kCalibrates)
      feed.produce(resident, steps(0, key_blocks, keys), steps(0, key_blocks, keys_values));
    else
      feed.produce(resident, steps(0, key_blocks, keys_values));
    return;
  }
  feed.consumer_start();

  // A warp whose rows all precede a block the warpgroup sees gets a fully
  // masked tile: weights 0, O unchanged.
  const size_t scale0 = ws.head_block0(bh);
  const float* scales =  // (2, blocks): s_K, and V̂ᵀ's s_V (t_scale) of the head
      stage_scales<Feed::kConsumerThreads, 2>(
          smem + Layout::kBytes, {ws.k.scale + scale0, ws.v.t_scale + scale0}, ws.blocks);
  const QueryWarpgroup wg(ws, bh, q0, p.smooth_q, scales);
  const float* scale_v = scales + ws.blocks;
  // fp8: 2^8 / s_V,top (fp8_fold), so that block j's P̂ = e4m3(P̃ · 2^8 · s_Vj /
  // s_V,top). A block of zeros has s_V = 0 (quant.cu), and a head whose V is
  // all zeros has s_V,top = 0, which fp8_fold floors.
  float v_top = 0.0f;
  if constexpr (kPvFp8)
    for (int j = 0; j < ws.blocks; ++j) v_top = fmaxf(v_top, scale_v[j]);
  const float fold_v = kPvFp8 ? fp8_fold(v_top) : 1.0f;
  // s (64, 64) = the scores of key block j (S·log2(e) for the exact softmax,
  // HopperScores), masked entries −inf; this warp's 16 rows: from the sums of
  // Q̂ K̂ᵀ once they have landed.
  using Sums = typename OverD<kQk>::Acc[1][kNTiles][4];
  auto scores_of = [&](float(&s)[1][kNTiles][4], const Sums& sum, int j) {
    HopperScores<Softmax>::template forward<D>(s, sum[0], wg.scale(j));
    bias_and_mask(s, wg.bias, j * kKeys, wg.first_query, HopperScores<Softmax>::kForwardUnit);
  };
  auto scores = [&](float(&s)[1][kNTiles][4], int j, int stage) {
    Sums sum;
    OverD<kQk>::issue(sum, q_tile, wg.wg_row0, k_tile(stage));
    wait_for<0>(sum);
    scores_of(s, sum, j);
  };

  float o_acc[1][D / 8][4];  // (64, d) rows of O of the warpgroup; this warp's 16
  zero(o_acc);
  Softmax softmax = HopperScores<Softmax>::forward_policy(p.softmax);
  feed.resident(resident);
  if constexpr (Softmax::kCalibrates) {  // pass 1: each row's max and min, then its grid
    feed.consume(0, key_blocks, keys, [&](int j, int stage) {
      if (!wg.sees(j, p.T)) return;
      float s[1][kNTiles][4];
      scores(s, j, stage);
      softmax.observe(s, j * kKeys);
    });
    softmax.calibrate();
  }
  if constexpr (Layout::kOverlapped) {
    // One step deep: S_j = Q̂ K̂_jᵀ is issued, then P̂_{j−1} V̂_{j−1} into O, and
    // block j's scores and softmax run while that product is on the tensor
    // cores; O's rescale for block j and P̂_j wait until it has landed (P̂_j
    // goes into the registers P̂_{j−1} is read from: packed into others and
    // copied, ptxas serialised the products, C7513).
    uint32_t p_hat[1][kNTiles / 4][4];  // P̂ (64, 64) e4m3 A fragments over the permuted keys
    // Block j from its landed sums: s becomes P̃_j, m and l move (O's factor
    // per row into `correction`); returns whether O is to be rescaled.
    auto softmax_step = [&](float(&s)[1][kNTiles][4], const Sums& sum, int j,
                            float(&correction)[2]) {
      scores_of(s, sum, j);
      return softmax.template update_deferring_rescale<0>(s, correction);  // P̃ <= 1
    };
    // Once O has landed: its rescale for block j where due, then P̂_j.
    auto finish_step = [&](const float(&s)[1][kNTiles][4], int j, bool rescale,
                           const float(&correction)[2]) {
      if (rescale)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          Softmax::scale_outputs(0, half, correction[half], o_acc);
      pack_weights_e4m3(p_hat[0], s, scale_v[j] * fold_v);
    };
    const int seen = wg.blocks_seen(p.T);
    feed.consume_overlapped(
        0, seen, keys_values,
        [&](int j, int stage) {  // block 0: nothing in flight
          Sums sum;
          OverD<kQk>::issue(sum, q_tile, wg.wg_row0, k_tile(stage));
          wait_for<0>(sum);
          float s[1][kNTiles][4], correction[2];
          finish_step(s, j, softmax_step(s, sum, j, correction), correction);
        },
        [&](int j, int stage, int previous) {
          Sums sum;
          OverD<kQk>::issue(sum, q_tile, wg.wg_row0, k_tile(stage));
          issue_e4m3_rs(o_acc, p_hat, vt_tile(previous));  // O += P̂_{j−1} V̂_{j−1}
          wait_for<1>(sum);
          float s[1][kNTiles][4], correction[2];
          const bool rescale = softmax_step(s, sum, j, correction);
          wait_for<0>(o_acc, p_hat);
          finish_step(s, j, rescale, correction);
        },
        [&](int stage) {
          issue_e4m3_rs(o_acc, p_hat, vt_tile(stage));
          wait_for<0>(o_acc, p_hat);
        });
    feed.consume(seen, key_blocks, keys_values, [](int, int) {});  // blocks past its rows
  } else {
    feed.consume(0, key_blocks, keys_values, [&](int j, int stage) {
      if (!wg.sees(j, p.T)) return;
      float s[1][kNTiles][4];
      scores(s, j, stage);
      float s_p[2], inv_s_p[2];  // ψ's scale of each of the thread's two rows
      if constexpr (Softmax::kExact) {
        float p_max[2];
        softmax.update_rescaling_rarely(s, o_acc, p_max);  // s now holds P̃ = exp(S − m)
        scales_of_amax(p_max, s_p, inv_s_p);
      } else {
        softmax.update(s, o_acc);  // s now holds ŵ
        weight_scales<1>(s, false, nullptr, s_p, inv_s_p);
      }
      uint32_t p_hat[1][kNTiles / 4][4];  // P̂ (64, 64) s8 A fragments over the permuted keys
      pack_weights(p_hat[0], s, inv_s_p);
      const float row_scale[2] = {s_p[0] * scale_v[j], s_p[1] * scale_v[j]};
      weight_product<D / 64, 1>(o_acc, p_hat, vt_tile(stage), row_scale);  // O += P̂ V̂ · s_P s_V
    });
  }

  softmax.finalize(o_acc);
  softmax.store(p.stats + static_cast<size_t>(bh) * p.T * Softmax::kStatFloats, wg.first_query,
                p.T);
  store_acc(o_tile, o_acc, warp_row0(), 1.0f / fold_v);
  feed.sync();
  store_tile<Feed::kConsumerThreads>(
      o_tile, p.o + (static_cast<size_t>(b) * p.T + q0) * p.H * D + static_cast<size_t>(h) * D,
      static_cast<size_t>(p.H) * D, p.T - q0);
#endif
}

}  // namespace qattn::cuda::sage
