// SageBwd's dQ (docs/attention-maths.md §4.5) on Hopper (sm_90a), as sage_forward_sm90.cuh
// does the forward: qk int8 or fp8, dp bf16, int8 or fp8 (OverD, sage_sm90.cuh),
// dq int8 with ψ per row (bwd_granularity rowcol) or fp8; sage.cu's mma.sync
// kernel runs every other combination. Both share the softmax policies' backward (sage_softmax.cuh:
// load_rows, score_grads, the K-interval row sweep) and the int8 helpers.
//
// A block: three consumer warpgroups of 64 query rows (two with the K-interval
// block; Layout::kWarpgroups, sage_sm90.cuh) and a producer warpgroup whose one
// thread copies by TMA Q̂ (int8) and dO (bf16, in place), resident, then per
// 64-key step K̂ (64, d), V (64, d; bf16, in place from qkv) and K̂ᵀ (d, 64) into
// a two-stage ring.
// Per warpgroup and key block j up to the diagonal:
//   S = Q̂ K̂ᵀ (s32, wgmma ss; fp32 e4m3 wgmma at qk = fp8) · s_Q s_K (+ smooth_q
//   bias; for the exact softmax the sums, its exponent scaled, HopperScores);
//   dP = dO Vᵀ (bf16 wgmma ss, fp32; or dÔ V̂ᵀ · s_dO s_V at dp = int8 / fp8)
//   issued before S is waited for; dS = policy(S, dP) masked;
//   dŜ quantised per row into s8 A fragments; dQ += dŜ K̂ · s_dS s_K (s32
//   wgmma rs into fresh accumulators, one per 64 columns of d, weight_product;
//   B = K̂ᵀ, K-major along the permuted keys)
// and at the end dQ·c into the q slot of dqkv. With dq = fp8 (kDqFp8, exact
// softmax; docs/attention-maths.md §4.12) K̂ᵀ holds e4m3 values of K − μ_K on
// power-of-two block scales (t_scale), dŜ = e4m3(dS · 2^-e(B_r) · s_Kj /
// s_K,top) per row r (B_r = ‖dO_r‖·max‖V‖ + |δ_r|, from the backward pre-pass),
// and the e4m3 wgmma accumulates into the fp32 dQ itself over every key block;
// each row is scaled once by c · 2^e(B_r) · s_K,top at the end. With the K-interval block a
// first pass over (K̂, V) sweeps each row's terms and writes them for the dK/dV
// kernel, as the mma.sync kernel does.
#pragma once
#include "attention/common/feeds.cuh"
#include "attention/sage/int8_operands.cuh"
#include "attention/sage/quant.cuh"
#include "attention/sage/sage_sm90.cuh"
#include "attention/sage/sage_softmax.cuh"

namespace qattn::cuda::sage {

struct SageDqSm90Params : SageBackwardSm90Common {
  CUtensorMap q, k;  // Q̂, K̂ (B·H·Tp, d) int8 (qk = fp8: e4m3), boxes (64, d)
  CUtensorMap kt;    // K̂ᵀ (B·H·d, Tp) int8 (dq = fp8: e4m3), boxes (64, 64)
  // dp = bf16: dO (B·T, H·d) and qkv (B·T, 3·H·d), for V, as the backward gets
  // them, boxes (64, 64); dp = int8 or fp8: dÔ, V̂ (B·H·Tp, d), boxes (64, d)
  CUtensorMap dout, v;
};

// Shared memory, with R = kRows query rows per block: Q̂ (R, d) |
// dO (R, d) (bf16, or dÔ at dp = int8 / fp8: OverD) | 2 x [K̂ (64, d) | V (64, d)
// (as dO) | K̂ᵀ (d, 64)] | dQ (R, d) bf16 | barriers | the head's s_K, K̂ᵀ's
// s_K and s_V (stage_scales; kBytes ends with the barriers); every tile at a
// multiple of 1024 bytes.
template <int D, class Softmax, Precision kDp>
struct SageDqSm90Layout {
  static constexpr int kWarpgroups = !Softmax::kRowPass ? 3 : 2;  // sage_sm90.cuh
  static constexpr int kRows = sage_rows(kWarpgroups);
  using Feed = flash::TmaFeed<kWarpgroups * 128, false>;
  static constexpr int kVBytes = OverD<kDp>::template tile_bytes<kSageBlock, D>();
  static constexpr int kStage = kSageBlock * D + kVBytes + D * kSageBlock;
  static constexpr int kQ = 0, kDo = kRows * D,
                       kStages = kDo + OverD<kDp>::template tile_bytes<kRows, D>();
  static constexpr int kK = 0, kV = kSageBlock * D, kKt = kV + kVBytes;  // within a stage
  static constexpr int kDq = kStages + 2 * kStage;
  static constexpr int kBarriers = kDq + kRows * D * 2;
  static constexpr int kBytes = kBarriers + Feed::kBarrierBytes;
  static_assert(kDo % 1024 == 0 && kStages % 1024 == 0 && kStage % 1024 == 0 && kKt % 1024 == 0);
};

// Grid (ceil(blocks / kWarpgroups), B·H); every head's heaviest (last) query
// tile starts first (block_by_rank).
template <int D, class Softmax, Precision kQk, Precision kDp, bool kDqFp8>
__global__ void __launch_bounds__(
    flash::sm90::block_threads<SageDqSm90Layout<D, Softmax, kDp>::kWarpgroups>(), 1)
    sage_dq_sm90_kernel(const __grid_constant__ SageDqSm90Params params) {
  static_assert(!kDqFp8 || Softmax::kExact, "fp8 dS's bound takes the exact softmax's dS");
  static_assert(kQk != Precision::bf16, "S reads the pre-pass's 8-bit copies");
  static_assert((kQk != Precision::fp8 && kDp != Precision::fp8) || Softmax::kExact,
                "fp8 S and dP run with the exact softmax (sage_check_options)");
#if QATTN_SM90A_DEVICE
  using namespace flash;
  using namespace flash::sm90;
  using Layout = SageDqSm90Layout<D, Softmax, kDp>;
  using DpTile = OverD<kDp>;
  using Feed = typename Layout::Feed;
  constexpr int kRows = Layout::kRows;                    // query rows per block
  constexpr int kKeys = kSageBlock, kNTiles = kKeys / 8;  // keys per step: one quantisation block
  const SageDqSm90Params& p = params;
  const SageWorkspace& ws = p.ws;
  extern __shared__ __align__(1024) unsigned char smem[];
  const Int8SmemTile<kRows, D> q_tile{reinterpret_cast<int8_t*>(smem + Layout::kQ)};  // (R, d)
  const auto do_tile = DpTile::template tile_at<kRows, D>(smem + Layout::kDo);        // (R, d)
  auto stage = [&](int s) { return smem + Layout::kStages + s * Layout::kStage; };
  auto k_tile = [&](int s) {
    return Int8SmemTile<kKeys, D>{reinterpret_cast<int8_t*>(stage(s) + Layout::kK)};
  };
  auto v_tile = [&](int s) { return DpTile::template tile_at<kKeys, D>(stage(s) + Layout::kV); };
  auto kt_tile = [&](int s) {
    return Int8SmemTile<D, kKeys>{reinterpret_cast<int8_t*>(stage(s) + Layout::kKt)};
  };
  const SmemTile<kRows, D> dq_tile{reinterpret_cast<bf16*>(smem + Layout::kDq)};  // (R, d)

  const BlockIndex at = last_first(block_by_rank());  // grid (tiles, B H): at.h is b H + h
  const int q_tile_index = at.block, bh = at.h, b = bh / p.H, h = bh % p.H;
  const int q0 = q_tile_index * kRows;
  const int key_blocks = min(ws.blocks, (q0 + kRows - 1) / kKeys + 1);  // up to the tile's diagonal
  const int head_row0 = bh * ws.Tp;  // the head's first row in the quantised copies
  // The resident tiles' rows past the head's last block read the next
  // head's rows (or zeros past the tensor): finite, never stored.
  auto resident = [&](auto& to) {
    to.tile(q_tile, Int8TileSource{&p.q, head_row0 + q0, 0});
    if constexpr (DpTile::kBytes)
      to.tile(do_tile, Int8TileSource{&p.dout, head_row0 + q0, 0});
    else  // dO in place
      to.tile(do_tile, activation_tile(nullptr, &p.dout, p.H * D, b, p.T, q0, h * D));
  };
  auto scores = [&](int j, int s, auto& to) {  // what S and dP read
    to.tile(k_tile(s), Int8TileSource{&p.k, head_row0 + j * kKeys, 0});
    if constexpr (DpTile::kBytes)
      to.tile(v_tile(s), Int8TileSource{&p.v, head_row0 + j * kKeys, 0});
    else  // V in place
      to.tile(v_tile(s),
              activation_tile(nullptr, &p.v, 3 * p.H * D, b, p.T, j * kKeys, (2 * p.H + h) * D));
  };
  auto keys = [&](int j, int s, auto& to) {
    scores(j, s, to);
    to.tile(kt_tile(s), Int8TileSource{&p.kt, bh * D, j * kKeys});
  };

  Feed feed(smem + Layout::kBarriers);
  if (feed.producer()) {
    if constexpr (Softmax::kRowPass)
      feed.produce(resident, steps(0, key_blocks, scores), steps(0, key_blocks, keys));
    else
      feed.produce(resident, steps(0, key_blocks, keys));
    return;
  }
  feed.consumer_start();

  const size_t scale0 = ws.head_block0(bh);
  const float* scales =  // (3, blocks): s_K (of K̂), K̂ᵀ's s_K (t_scale), s_V of the head
      stage_scales<Feed::kConsumerThreads, 3>(
          smem + Layout::kBytes, {ws.k.scale + scale0, ws.k.t_scale + scale0, ws.v.scale + scale0},
          ws.blocks);
  const float *scale_kt = scales + ws.blocks, *scale_v = scales + 2 * ws.blocks;
  const QueryWarpgroup wg(ws, bh, q0, p.smooth_q, scales);
  // dP's scale s_dO of the warpgroup's query block (8-bit dp; a block past the last: the last)
  const float scale_do = ws.dout.scale[scale0 + min(wg.wg_first / kSageBlock, ws.blocks - 1)];
  float* terms =
      p.row_terms + static_cast<size_t>(bh) * ws.Tp * Softmax::kTermFloats;  // (Tp, kTerm)
  const Softmax softmax(p.softmax);
  typename Softmax::Row rows[2];  // with a row sweep the terms are made below
  load_rows<Softmax>(rows, p.stats + static_cast<size_t>(bh) * p.T * Softmax::kStatFloats, terms,
                     wg.first_query, p.T);
  feed.resident(resident);  // Q̂ and dO have landed (the step rings count only K̂, V, K̂ᵀ)

  // A warp whose rows all precede a key block the warpgroup sees gets dS = 0 there:
  // nothing added.
  // score, dp (64 queries, 64 keys; this warp's 16 rows) = S (as HopperScores has
  // it for the backward) and dP of key block j.
  using Scores = HopperScores<Softmax>;
  auto scores_and_dp = [&](float(&score)[1][kNTiles][4], float(&dp)[1][kNTiles][4], int j, int s) {
    if (wg.bias && j + 1 < key_blocks)
      prefetch_l1(wg.bias + (j + 1) * kKeys, kKeys * 4);  // the next block's
    typename OverD<kQk>::Acc sum[1][kNTiles][4];
    typename DpTile::Acc dp_sum[1][kNTiles][4];
    OverD<kQk>::issue(sum, q_tile, wg.wg_row0, k_tile(s));
    DpTile::issue(dp_sum, do_tile, wg.wg_row0, v_tile(s));  // runs while S is converted
    wait_for<1>(sum);
    Scores::template backward<D>(score, sum[0], wg.scale(j));
    add_key_bias(score, wg.bias, j * kKeys,
                 Scores::backward_unit(wg.scale(j)));  // score_grads and the sweep mask
    wait_for<0>(dp_sum);
    DpTile::template values<D>(dp, dp_sum, scale_do * scale_v[j]);
  };

  if constexpr (Softmax::kRowPass) {  // the row terms, before any dS is quantised
    typename Softmax::RowSums sums[2];
    feed.consume(0, key_blocks, scores, [&](int j, int s) {
      if (!wg.sees(j, p.T)) return;
      float score[1][kNTiles][4], dp[1][kNTiles][4];
      scores_and_dp(score, dp, j, s);
      softmax.sweep(sums, score, dp, rows, j * kKeys, wg.first_query, p.T);
    });
    softmax.make_terms(rows, sums, terms, wg.first_query, p.T, ws.Tp);
  }

  float dq_acc[1][D / 8][4];  // (64, d) rows of dQ of the warpgroup; this warp's 16
  zero(dq_acc);
  // fp8: dS's scale 2^e(B_r) of the thread's two rows r (frag_row) and the
  // head's s_K,top; the head's maxima are each warp's own reduction.
  float ds_scale[2] = {1.0f, 1.0f}, inv_ds_scale[2] = {1.0f, 1.0f};
  float k_top = 1.0f;
  if constexpr (kDqFp8) {
    k_top = head_max(ws.k.t_scale + scale0, ws.blocks, 1);
    const float v_top = head_max(ws.v_norm_block_max + scale0, ws.blocks, 1);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      // rows past T: ‖dO‖ = δ = 0 (padded), bound 0, scale 1; past Tp never stored
      const size_t row =
          static_cast<size_t>(bh) * ws.Tp + min(wg.first_query + frag_row(2 * r), ws.Tp - 1);
      ds_scale[r] = fp8_bound_scale(ws.do_norm[row] * v_top + fabsf(ws.delta[row]));
      inv_ds_scale[r] = 1.0f / ds_scale[r];
    }
  }
  const float inv_k_top = 1.0f / k_top;

  feed.consume(0, key_blocks, keys, [&](int j, int s) {
    if (!wg.sees(j, p.T)) return;
    float score[1][kNTiles][4], dp[1][kNTiles][4];  // S, dP
    scores_and_dp(score, dp, j, s);
    float w[1][kNTiles][4];  // dS
    score_grads(w, score, dp, Scores::backward_policy(softmax, wg.scale(j)), rows, j * kKeys,
                wg.first_query, p.T);
    uint32_t ds_hat[1][kNTiles / 4][4];  // dŜ (64, 64) s8/e4m3 A fragments over the permuted keys
    if constexpr (kDqFp8) {  // dQ += dŜ K̂ over all of d into dQ itself, one scale per row
      const float fold_k = ws.k.t_scale[scale0 + j] * inv_k_top;  // 2^-(e_K,top − e_Kj)
      const float factor[2] = {inv_ds_scale[0] * fold_k, inv_ds_scale[1] * fold_k};
      pack_weights_e4m3(ds_hat[0], w, factor);
      issue_e4m3_rs(dq_acc, ds_hat, kt_tile(s));
      wait_for<0>(dq_acc, ds_hat);
    } else {
      float s_ds[2], inv_s_ds[2];  // ψ's scale of each of the thread's two rows
      weight_scales<1>(w, false, nullptr, s_ds, inv_s_ds);
      pack_weights(ds_hat[0], w, inv_s_ds);
      const float row_scale[2] = {s_ds[0] * scale_kt[j], s_ds[1] * scale_kt[j]};
      weight_product<D / 64, D / 64>(dq_acc, ds_hat, kt_tile(s),
                                     row_scale);  // dQ += dŜ K̂ · s_dS s_K
    }
  });

  if constexpr (kDqFp8)  // the rows' scales 2^e(B_r) · s_K,top (c below)
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dq_acc[0][dt][e] *= ds_scale[e / 2] * k_top;
  store_acc(dq_tile, dq_acc, warp_row0(), p.c);
  feed.sync();
  const size_t ld = static_cast<size_t>(3) * p.H * D;
  store_tile<Feed::kConsumerThreads>(
      dq_tile, p.dqkv + (static_cast<size_t>(b) * p.T + q0) * ld + static_cast<size_t>(h) * D, ld,
      p.T - q0);
#endif
}

}  // namespace qattn::cuda::sage
