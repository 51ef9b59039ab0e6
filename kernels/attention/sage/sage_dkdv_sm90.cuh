// SageBwd's dK/dV kernel (docs/attention-maths.md §4.5) on Hopper (sm_90a): the products on wgmma,
// the tiles by TMA through TmaFeed (feeds.cuh), for the default backward flags
// (qk = dv = dk = int8, dp = bf16, bwd_granularity rowcol) and what sage.cuh
// lists beside them (qk int8 or fp8, dp any: OverD, sage_sm90.cuh; dv and dk
// fp8, below). sage.cu's mma.sync kernel runs every other combination and the
// devices without sm_90a. Both use
// the same helpers (int8_operands.cuh: the int8 sums, ψ of the weights and their
// fragments; sage_softmax.cuh: the softmax policies), in the same order, so that
// for the same quantised operands Sᵀ's sums and dV's partial sums are the same
// numbers, and Pᵀ the same up to fp32 rounding (the exact softmax takes
// rescaled scores here, HopperScores); dPᵀ is a bf16 product whose fp32 sum
// order differs between the families, and with it dSᵀ by rounding.
//
// A block: R = Layout::kRows keys (sage_sm90.cuh: 192 for plain sage at
// d = 64, else 128), one consumer warpgroup per 64 keys (one quantisation block
// each, so one s_K per warpgroup), and a producer warpgroup: one thread
// copies K̂ (R, d) and V (R, d; bf16, in place from qkv) once, then per 64-query
// step Q̂ (64, d), Q̂ᵀ and dÔᵀ (d, 64) (T permuted, kPermuted) and dO (64, d;
// in place) into a three-stage ring, one warp the queries' saved statistics (L,
// or RowStats) and row terms (δ, or the row sweep's). Per warpgroup and query
// block i from the diagonal (transposed tiles, keys x queries):
//   Sᵀ = K̂ Q̂ᵀ (s32, wgmma ss; fp32 e4m3 at qk = fp8) and dPᵀ = V dOᵀ (fp32,
//   bf16 wgmma ss; or V̂ dÔᵀ · s_V s_dO at dp = int8 / fp8) issued back to back; Sᵀ · s_K s_Q (+
//   smooth_q bias; for the exact softmax the sums, its exponent scaled, HopperScores) -> Pᵀ (masked
//   0) while dPᵀ runs -> ψ(Pᵀ) per row (per key) into s8 A fragments -> dSᵀ = Pᵀ ∘ (dPᵀ − δ) (the
//   policy's grad) -> ψ(dSᵀ) per row into s8 A fragments -> dV += P̂ᵀ dÔ ·
//   s_P s_dO and dK += dŜᵀ Q̂ · s_dS s_Q (s32, wgmma rs, B the transposed
//   copies, per 64 columns of d, folded into the fp32 accumulators, dV's while
//   dK's runs) -> smooth_q: dK += c (dSᵀ 1) μ_Qᵀ.
//
// With dv = fp8 (kDvFp8, exact softmax; docs/attention-maths.md §4.12) dÔᵀ holds
// e4m3 values on power-of-two block scales, P̂ᵀ = e4m3(Pᵀ · 2^8 · s_dOi /
// s_dO,top) (query block i's scale folded in), and dV's e4m3 wgmma accumulates
// into the fp32 dV itself over every query block, issued over all of d before
// dK's chunks; dV is scaled once by s_dO,top · 2^-8 at the end. With dk = fp8
// as well (kDkFp8) Q̂ᵀ holds e4m3 values of c·(Q − μ_Q) on power-of-two block
// scales (t_scale), dŜᵀ = e4m3(dSᵀ · 2^-e(C_t) · s_Qi / s_Q,top) per key t (C_t
// = ‖V_t‖·max‖dO‖ + max|δ|, from the backward pre-pass), and dK's e4m3 wgmma
// accumulates into the fp32 dK itself; each key's row is scaled once by
// 2^e(C_t) · s_Q,top at the end (smooth_q's term enters the accumulator divided
// by it).
#pragma once
#include "attention/common/feeds.cuh"
#include "attention/sage/int8_operands.cuh"
#include "attention/sage/quant.cuh"
#include "attention/sage/sage_sm90.cuh"
#include "attention/sage/sage_softmax.cuh"

namespace qattn::cuda::sage {

struct SageDkDvSm90Params : SageBackwardSm90Common {
  CUtensorMap k, q;     // K̂, Q̂ (B·H·Tp, d) int8 (qk = fp8: e4m3), boxes (64, d)
  CUtensorMap qt, dot;  // Q̂ᵀ, dÔᵀ (B·H·d, Tp) int8 (or e4m3), T permuted, boxes (64, 64)
  // dp = bf16: qkv (B·T, 3·H·d), for V, and dO (B·T, H·d) as the backward gets
  // them, boxes (64, 64); dp = int8 or fp8: V̂, dÔ (B·H·Tp, d), boxes (64, d)
  CUtensorMap v, dout;
};

// Shared memory: K̂ (R, d) | V (R, d) bf16 (dp 8-bit: V̂, bytes) | kStages stages of [Q̂ (64, d) | Q̂ᵀ
// (d, 64) | dÔᵀ (d, 64) | dO (64, d) (as V) | statistics (64 rows) | row terms (64 rows)] |
// barriers. Every tile starts at a multiple of 1024 bytes (its swizzle). At the
// end dK and dV (R, d) bf16 are staged from offset 0.
template <int D, class Softmax, Precision kDp>
struct SageDkDvSm90Layout {
  static constexpr int kWarpgroups = D == 64 && !Softmax::kRowPass ? 3 : 2;  // sage_sm90.cuh
  static constexpr int kRows = sage_rows(kWarpgroups);
  // Three stages (feeds.cuh), so that a warpgroup a step ahead of the other
  // finds its tiles landed: backward 6.297-6.305 -> 6.240-6.244 ms at (1, 16,
  // 16384, 128); at (4, 16, 4096, 128) 1.747-1.763 -> 1.749-1.750, within the
  // noise (`qattn bench attention --kind sage`, two rounds of each binary).
  using Feed = flash::TmaFeed<kWarpgroups * 128, true, 3>;
  static constexpr int kK = 0, kV = kK + kRows * D,
                       kStage0 = kV + OverD<kDp>::template tile_bytes<kRows, D>();
  // Offsets within a stage.
  static constexpr int kQ = 0, kQt = kQ + kSageBlock * D, kDot = kQt + D * kSageBlock;
  static constexpr int kDo = kDot + D * kSageBlock,
                       kStats = kDo + OverD<kDp>::template tile_bytes<kSageBlock, D>();
  static constexpr int kTerms = kStats + kSageBlock * Softmax::kStatFloats * 4;
  static constexpr int kStageBytes =
      (kTerms + kSageBlock * Softmax::kTermFloats * 4 + 1023) / 1024 * 1024;
  static constexpr int kBarriers = kStage0 + Feed::kStages * kStageBytes;
  static constexpr int kBytes = kBarriers + Feed::kBarrierBytes;
  static_assert(kV % 1024 == 0 && kStage0 % 1024 == 0 && kQt % 1024 == 0 && kDot % 1024 == 0 &&
                kDo % 1024 == 0 && kTerms % 16 == 0);
  static_assert(2 * kRows * D * 2 <= kBarriers, "dK and dV are staged over the tiles");
};

// Grid (ceil(blocks / kWarpgroups), B·H); key tile 0, which sees every query,
// starts first.
template <int D, class Softmax, Precision kQk, Precision kDp, bool kDvFp8, bool kDkFp8>
__global__ void __launch_bounds__(
    flash::sm90::block_threads<SageDkDvSm90Layout<D, Softmax, kDp>::kWarpgroups>(), 1)
    sage_dkdv_sm90_kernel(const __grid_constant__ SageDkDvSm90Params params) {
  static_assert(!kDvFp8 || Softmax::kExact, "fp8 P̂ᵀ dÔ takes the exact softmax's P <= 1");
  static_assert(!kDkFp8 || kDvFp8, "fp8 dŜᵀ Q̂ runs beside fp8 P̂ᵀ dÔ (sage_check_options)");
  static_assert(kQk != Precision::bf16, "Sᵀ reads the pre-pass's 8-bit copies");
  static_assert((kQk != Precision::fp8 && kDp != Precision::fp8) || Softmax::kExact,
                "fp8 S and dP run with the exact softmax (sage_check_options)");
#if QATTN_SM90A_DEVICE
  using namespace flash;
  using namespace flash::sm90;
  using Layout = SageDkDvSm90Layout<D, Softmax, kDp>;
  using DpTile = OverD<kDp>;
  using Feed = typename Layout::Feed;
  constexpr int kRows = Layout::kRows;  // keys per block
  constexpr int kQueries = kSageBlock,
                kNTiles = kQueries / 8;   // queries per step: one quantisation block
  constexpr int kKSteps = kQueries / 32;  // k32 steps of the products over T
  constexpr int kStat = Softmax::kStatFloats, kTerm = Softmax::kTermFloats;
  const SageDkDvSm90Params& p = params;
  const SageWorkspace& ws = p.ws;
  extern __shared__ __align__(1024) unsigned char smem[];
  const Int8SmemTile<kRows, D> k_tile{reinterpret_cast<int8_t*>(smem + Layout::kK)};  // (R, d)
  const auto v_tile = DpTile::template tile_at<kRows, D>(smem + Layout::kV);          // (R, d)
  auto stage = [&](int s) { return smem + Layout::kStage0 + s * Layout::kStageBytes; };
  auto q_tile = [&](int s) {
    return Int8SmemTile<kQueries, D>{reinterpret_cast<int8_t*>(stage(s) + Layout::kQ)};
  };
  auto qt_tile = [&](int s) {
    return Int8SmemTile<D, kQueries>{reinterpret_cast<int8_t*>(stage(s) + Layout::kQt)};
  };
  auto dot_tile = [&](int s) {
    return Int8SmemTile<D, kQueries>{reinterpret_cast<int8_t*>(stage(s) + Layout::kDot)};
  };
  auto do_tile = [&](int s) {
    return DpTile::template tile_at<kQueries, D>(stage(s) + Layout::kDo);
  };
  auto stats_slot = [&](int s) {
    return reinterpret_cast<float*>(stage(s) + Layout::kStats);
  };  // (64, kStat)
  auto terms_slot = [&](int s) {
    return reinterpret_cast<float*>(stage(s) + Layout::kTerms);
  };  // (64, kTerm)

  const BlockIndex at = block_by_rank();  // grid (tiles, B H): at.h is b H + h
  const int bh = at.h, b = bh / p.H, h = bh % p.H;
  const int k0 = at.block * kRows;
  const int head_row0 = bh * ws.Tp;  // the head's first row in the natural copies
  const float* stats_src = p.stats + static_cast<size_t>(bh) * p.T * kStat;        // (T, kStat)
  const float* terms_src = p.row_terms + static_cast<size_t>(bh) * ws.Tp * kTerm;  // (Tp, kTerm)
  // K̂'s and V's rows past the head's last block read the next head's
  // rows (or zeros past the tensor): finite, and those keys are never computed on.
  auto resident = [&](auto& to) {
    to.tile(k_tile, Int8TileSource{&p.k, head_row0 + k0, 0});
    if constexpr (DpTile::kBytes)
      to.tile(v_tile, Int8TileSource{&p.v, head_row0 + k0, 0});
    else  // V in place
      to.tile(v_tile, activation_tile(nullptr, &p.v, 3 * p.H * D, b, p.T, k0, (2 * p.H + h) * D));
  };
  auto queries = [&](int i, int s, auto& to) {
    const int q0 = i * kQueries;
    to.tile(q_tile(s), Int8TileSource{&p.q, head_row0 + q0, 0});
    to.tile(qt_tile(s), Int8TileSource{&p.qt, bh * D, q0});
    to.tile(dot_tile(s), Int8TileSource{&p.dot, bh * D, q0});
    if constexpr (DpTile::kBytes)
      to.tile(do_tile(s), Int8TileSource{&p.dout, head_row0 + q0, 0});
    else  // dO in place
      to.tile(do_tile(s), activation_tile(nullptr, &p.dout, p.H * D, b, p.T, q0, h * D));
    to.rows([&](int thread, int threads, auto copier) {  // statistics past T read as 0
      const int stats_valid = (p.T - q0) * kStat;
      for (int f = thread; f < kQueries * kStat; f += threads)
        copier.copy4(stats_slot(s) + f, stats_src + q0 * kStat + f, f < stats_valid);
      for (int f = thread; f < kQueries * kTerm; f += threads)
        copier.copy4(terms_slot(s) + f, terms_src + q0 * kTerm + f, true);
    });
  };
  const int q_first = k0 / kQueries;  // causal: earlier query blocks see none of these keys
  Feed feed(smem + Layout::kBarriers);
  if (feed.producer()) {
    feed.produce(resident, steps(q_first, ws.blocks, queries));
    return;
  }
  feed.consumer_start();

  const int wg_row0 = warpgroup_row0();    // the warpgroup's first key in the tile
  const int wg_key0 = k0 + wg_row0;        // and its first key
  const int warp_key0 = k0 + warp_row0();  // the warp's first key
  const size_t scale0 = ws.head_block0(bh);
  // The warpgroup's quantisation block (a block past the last: the last, as sage.cu):
  // its s_K (Sᵀ) and s_V (dPᵀ at dp = int8 / fp8).
  const size_t k_block = scale0 + min(wg_key0 / kSageBlock, ws.blocks - 1);
  const float s_k = ws.k.scale[k_block], s_v = ws.v.scale[k_block];
  const Softmax softmax(p.softmax);
  auto visible = [&](int key, int query) { return query < p.T && key <= query; };
  // fp8: 2^8 / s_dO,top (fp8_fold), s_dO,top the largest of the head's dO block
  // scales (a block of zeros has scale 0, quant.cu), each warp's own max; a head
  // whose dO is all zeros has s_dO,top = FLT_MIN (head_max), which fp8_fold floors.
  float fold_do = 1.0f;
  if constexpr (kDvFp8) fold_do = fp8_fold(head_max(ws.dout.t_scale + scale0, ws.blocks, 1));
  // fp8 dK: dS's scale 2^e(C_t) of the thread's two keys t (frag_row) and the
  // head's s_Q,top.
  float ds_scale[2] = {1.0f, 1.0f}, inv_ds_scale[2] = {1.0f, 1.0f};
  float q_top = 1.0f;
  if constexpr (kDkFp8) {
    q_top = head_max(ws.q.t_scale + scale0, ws.blocks, 1);
    const float do_top = head_max(ws.backward_block_max + scale0 * 2, ws.blocks, 2);
    const float delta_top = head_max(ws.backward_block_max + scale0 * 2 + 1, ws.blocks, 2);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      // keys past T: ‖V‖ = 0 (padded), never stored
      const float v_norm =
          ws.v_norm[static_cast<size_t>(bh) * ws.Tp + min(warp_key0 + frag_row(2 * r), ws.Tp - 1)];
      ds_scale[r] = fp8_bound_scale(v_norm * do_top + delta_top);
      inv_ds_scale[r] = 1.0f / ds_scale[r];
    }
  }
  const float inv_q_top = 1.0f / q_top;

  float dk_acc[1][D / 8][4],
      dv_acc[1][D / 8][4];  // (64, d) rows of dK, dV of the warpgroup; this warp's 16
  zero(dk_acc);
  zero(dv_acc);
  // The products over the step's queries: dV += P̂ᵀ dÔ · s_P s_dO and dK +=
  // dŜᵀ Q̂ · s_dS s_Q, each as s32 sums of 64 columns of d at a time (B the
  // transposed copy's rows of those columns), folded into the fp32 accumulators.
  constexpr int kChunk = 64, kChunkTiles = kChunk / 8, kChunks = D / kChunk;
  uint32_t p_hat[1][kKSteps][4],
      ds_hat[1][kKSteps][4];       // P̂ᵀ, dŜᵀ (64 keys, 64 queries) s8 A fragments
  float dv_scale[2], dk_scale[2];  // of the thread's two keys
  auto issue = [&](int(&sum)[1][kChunkTiles][4], bool dv, int chunk, int s) {
    const Int8SmemTile<kChunk, kQueries> bt{(dv ? dot_tile(s) : qt_tile(s)).data +
                                            chunk * kChunk * kQueries};
    issue_s8_rs(sum, dv ? p_hat : ds_hat, bt);
  };
  auto fold = [&](bool dv, int chunk, const int(&sum)[1][kChunkTiles][4]) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {  // constant indices into the accumulators
      if (c != chunk) continue;
#pragma unroll
      for (int dt = 0; dt < kChunkTiles; ++dt) {
        if (dv)
          add_sum<kQueries>(dv_acc[0][c * kChunkTiles + dt], sum[0][dt], dv_scale);
        else
          add_sum<kQueries>(dk_acc[0][c * kChunkTiles + dt], sum[0][dt], dk_scale);
      }
    }
  };
  int sums[2][1][kChunkTiles][4];  // (64 keys, 64 columns) s32 of dV and dK

  feed.resident(resident);
  feed.consume(q_first, ws.blocks, queries, [&](int i, int s) {
    const int q0 = i * kQueries;
    // Every key of the warpgroup after every query of the block, or past T (uniform).
    if (wg_key0 > q0 + kQueries - 1 || wg_key0 >= p.T) return;
    // Read from global memory: staging them in shared memory (stage_scales, as
    // the forward and dQ do) measured slower here at d = 128 (`qattn bench
    // attention --kind sage`, three rounds: backward 1.747-1.763 vs 1.779-1.789
    // ms at (4, 16, 4096, 128), though 0.875 vs 0.858 at (4, 12, 4096, 64)).
    // s_Q, s_dO of Q̂ and dÔ (Sᵀ, dPᵀ), and of their transposed copies (dK, dV)
    const float s_q = ws.q.scale[scale0 + i], s_do = ws.dout.scale[scale0 + i];
    const float s_qt = ws.q.t_scale[scale0 + i], s_dot = ws.dout.t_scale[scale0 + i];
    const float* stats = stats_slot(s);
    const float* terms = terms_slot(s);
    auto query_row = [&](int qi) {
      return Softmax::load_row(stats + qi * kStat, terms + qi * kTerm);
    };
    // The warp's last key sees the step's first query, and every query is real.
    const bool all_visible = warp_key0 + 15 <= q0 && q0 + kQueries <= p.T;

    typename OverD<kQk>::Acc st_sum[1][kNTiles][4];  // (64 keys, 64 queries) K̂ Q̂ᵀ
    OverD<kQk>::issue(st_sum, k_tile, wg_row0, q_tile(s));
    typename DpTile::Acc dp_sum[1][kNTiles]
                               [4];  // (64 keys, 64 queries): dPᵀ, runs while Pᵀ is made
    DpTile::issue(dp_sum, v_tile, wg_row0, do_tile(s));
    wait_for<1>(st_sum);
    using Scores = HopperScores<Softmax>;
    float score[1][kNTiles][4];  // Sᵀ as HopperScores has it for the backward
    Scores::template backward<D>(score, st_sum[0], s_k * s_q);
    const Softmax tile_softmax = Scores::backward_policy(softmax, s_k * s_q);
    if (p.smooth_q)  // the bias of each key (c·μ_Qi·(K − μ_K))
      add_row_key_bias(score, ws.query_bias + (scale0 + i) * ws.Tp + warp_key0,
                       Scores::backward_unit(s_k * s_q));
    // w(nt, e) = f(nt, e, key, query index) where the key sees the query, else
    // 0, over the warp's (16 keys, 64 queries); the mask only off the diagonal.
    float w[1][kNTiles][4];  // Pᵀ, then dSᵀ
    auto visible_entries = [&](auto&& f) {
      with_mask(all_visible, [&](auto unmasked) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = warp_key0 + frag_row(e), qi = frag_col(nt, e);
            w[0][nt][e] = unmasked || visible(key, q0 + qi) ? f(nt, e, key, qi) : 0.0f;
          }
      });
    };
    visible_entries([&](int nt, int e, int, int qi) {
      return tile_softmax.probability(query_row(qi), score[0][nt][e]);
    });
    if constexpr (kDvFp8) {
      pack_weights_e4m3(p_hat[0], w, s_dot * fold_do);
    } else {
      float s_p[2], inv_s_p[2];  // ψ's scale of each of the thread's two keys
      weight_scales<1>(w, false, nullptr, s_p, inv_s_p);
      pack_weights(p_hat[0], w, inv_s_p);
      dv_scale[0] = s_p[0] * s_dot, dv_scale[1] = s_p[1] * s_dot;
    }
    wait_for<0>(dp_sum);
    float dp[1][kNTiles][4];  // dPᵀ
    DpTile::template values<D>(dp, dp_sum, s_v * s_do);
    visible_entries([&](int nt, int e, int key, int qi) {
      return tile_softmax.grad(query_row(qi), score[0][nt][e], w[0][nt][e], dp[0][nt][e], key);
    });
    if constexpr (kDkFp8) {
      const float fold_q = ws.q.t_scale[scale0 + i] * inv_q_top;  // 2^-(e_Q,top − e_Qi)
      const float factor[2] = {inv_ds_scale[0] * fold_q, inv_ds_scale[1] * fold_q};
      pack_weights_e4m3(ds_hat[0], w, factor);
    } else {
      float s_ds[2], inv_s_ds[2];
      weight_scales<1>(w, false, nullptr, s_ds, inv_s_ds);
      pack_weights(ds_hat[0], w, inv_s_ds);
      dk_scale[0] = s_ds[0] * s_qt, dk_scale[1] = s_ds[1] * s_qt;
    }
    float ds_sum[2] = {0.0f, 0.0f};  // smooth_q: dSᵀ 1 of the thread's two keys, unquantised
    if (p.smooth_q) {
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) ds_sum[e / 2] += w[0][nt][e];
      ds_sum[0] = row_sum4(ds_sum[0]);
      ds_sum[1] = row_sum4(ds_sum[1]);
    }

    // Per 64 columns of d, dV's and dK's products are issued together and dV's
    // is folded while dK's runs. The loop stays rolled: ptxas gives every wgmma
    // of unrolled code accumulator registers of its own, which spills at d = 128.
    if constexpr (kDkFp8) {  // dV += P̂ᵀ dÔ and dK += dŜᵀ Q̂ over all of d into dV and dK
      issue_e4m3_rs(dv_acc, p_hat, dot_tile(s));
      issue_e4m3_rs(dk_acc, ds_hat, qt_tile(s));
      wait_for<0>(dv_acc, p_hat, dk_acc, ds_hat);
    } else if constexpr (kDvFp8) {  // dV += P̂ᵀ dÔ over all of d into dV itself, beside dK's
                                    // chunks
      issue_e4m3_rs(dv_acc, p_hat, dot_tile(s));
#pragma unroll 1
      for (int chunk = 0; chunk < kChunks; ++chunk) {
        issue(sums[1], false, chunk, s);
        wait_for<0>(sums[1], ds_hat);
        fold(false, chunk, sums[1]);
      }
      wait_for<0>(dv_acc, p_hat);
    } else {
#pragma unroll 1
      for (int chunk = 0; chunk < kChunks; ++chunk) {
        issue(sums[0], true, chunk, s);
        issue(sums[1], false, chunk, s);
        wait_for<1>(sums[0], p_hat);
        fold(true, chunk, sums[0]);
        wait_for<0>(sums[1], ds_hat);
        fold(false, chunk, sums[1]);
      }
    }
    if (p.smooth_q) {  // dK_j += c (dSᵀ 1) μ_Qiᵀ
      const float* mu_q = ws.query_mean + (scale0 + i) * D;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e)  // fp8: in the accumulator's units (inv_ds_scale, inv_q_top)
          dk_acc[0][dt][e] +=
              p.c * ds_sum[e / 2] * inv_ds_scale[e / 2] * inv_q_top * mu_q[frag_col(dt, e)];
      // The next query block's bias of the warp's keys and μ_Q; not with three
      // warpgroups (160 registers), where its addresses spill 20 bytes more.
      if (Layout::kWarpgroups == 2 && i + 1 < ws.blocks) {
        prefetch_l1(ws.query_bias + (scale0 + i + 1) * ws.Tp + warp_key0, 16 * 4);
        prefetch_l1(mu_q + D, D * 4);
      }
    }
  });

  // Every product of both warpgroups is done and every copy has landed: stage
  // dK (Q̂ carried c) and dV over the tiles, then store both.
  feed.sync();
  const SmemTile<kRows, D> dk_tile{reinterpret_cast<bf16*>(smem)};
  const SmemTile<kRows, D> dv_tile{dk_tile.data + kRows * D};
  if constexpr (kDkFp8)  // the keys' scales 2^e(C_t) · s_Q,top
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk_acc[0][dt][e] *= ds_scale[e / 2] * q_top;
  store_acc(dk_tile, dk_acc, warp_row0(), 1.0f);
  store_acc(dv_tile, dv_acc, warp_row0(), 1.0f / fold_do);
  feed.sync();
  const size_t ld = static_cast<size_t>(3) * p.H * D;
  bf16* head = p.dqkv + (static_cast<size_t>(b) * p.T + k0) * ld + static_cast<size_t>(h) * D;
  store_tile<Feed::kConsumerThreads>(dk_tile, head + static_cast<size_t>(p.H) * D, ld, p.T - k0);
  store_tile<Feed::kConsumerThreads>(dv_tile, head + static_cast<size_t>(2) * p.H * D, ld,
                                     p.T - k0);
#endif
}

}  // namespace qattn::cuda::sage
