// Operand precision policy of the flash skeleton: the six products of SPEC §3's
// precision keys (qk, pv, dp, dv, dk, dq), here all bf16 x bf16 -> fp32 on the
// tensor cores. FPA uses it for every product; a kind with int8 products
// supplies a policy with the same six functions (quantised tiles, block scales).
//
// `a` operands are A fragments of the warp's rows (from shared memory); `w`
// operands are fp32 accumulators of the previous step (weights P or dS), which
// are rounded to bf16 here; tiles are (rows, d) shared-memory tiles, except the
// bf16 dSᵀ tile (keys, queries) that the dK/dV blocks share among their warps for dQ.
#pragma once
#include "tile_mma.cuh"

namespace qattn::cuda::flash {

struct Bf16Operands {
  // S = Q Kᵀ (forward, and recomputed in the dQ pass); Sᵀ = K Qᵀ in the dK/dV pass.
  template <int kRT, int kNT, int kKS, int kR, int kC>
  __device__ static __forceinline__ void qk(float (&s)[kRT][kNT][4],
                                            const uint32_t (&a)[kRT][kKS][4], SmemTile<kR, kC> b) {
    mma_b_nk(s, a, b);
  }
  // dP = dO Vᵀ (dQ pass); dPᵀ = V dOᵀ (dK/dV pass).
  template <int kRT, int kNT, int kKS, int kR, int kC>
  __device__ static __forceinline__ void dp(float (&d)[kRT][kNT][4],
                                            const uint32_t (&a)[kRT][kKS][4], SmemTile<kR, kC> b) {
    mma_b_nk(d, a, b);
  }
  // O += P V.
  template <int kRT, int kDT, int kNT, int kR, int kC>
  __device__ static __forceinline__ void pv(float (&o)[kRT][kDT][4], const float (&w)[kRT][kNT][4],
                                            SmemTile<kR, kC> v) {
    accumulate(o, w, v);
  }
  // dV += Pᵀ dO.
  template <int kRT, int kDT, int kNT, int kR, int kC>
  __device__ static __forceinline__ void dv(float (&acc)[kRT][kDT][4],
                                            const float (&w)[kRT][kNT][4], SmemTile<kR, kC> dout) {
    accumulate(acc, w, dout);
  }
  // dK += dSᵀ Q.
  template <int kRT, int kDT, int kNT, int kR, int kC>
  __device__ static __forceinline__ void dk(float (&acc)[kRT][kDT][4],
                                            const float (&w)[kRT][kNT][4], SmemTile<kR, kC> q) {
    accumulate(acc, w, q);
  }
  // dQ += dS K (the dQ kernel, dS in the warp's accumulators).
  template <int kRT, int kDT, int kNT, int kR, int kC>
  __device__ static __forceinline__ void dq(float (&acc)[kRT][kDT][4],
                                            const float (&w)[kRT][kNT][4], SmemTile<kR, kC> k) {
    accumulate(acc, w, k);
  }
  // dQ[rows, col0 : col0 + 8 kDT] += dS K for the rows [row0, row0 + 16 kRT) of dS,
  // read from the shared dSᵀ tile (keys x queries) the dK/dV block has written.
  template <int kRT, int kDT, int kKeys, int kQueries, int kR, int kC>
  __device__ static __forceinline__ void dq(float (&acc)[kRT][kDT][4],
                                            SmemTile<kKeys, kQueries> ds_t, int row0,
                                            SmemTile<kR, kC> k, int col0) {
    // One 16-key slice at a time (views 16 rows down keep the swizzle), so the A
    // fragments hold 4 registers, not 4 per slice, beside the dK and dV accumulators.
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks) {
      uint32_t a[kRT][1][4];
      load_a_transposed(a, SmemTile<16, kQueries>{ds_t.data + ks * 16 * kQueries}, row0);
      mma_b_kn(acc, a, SmemTile<16, kC>{k.data + ks * 16 * kC}, col0);
    }
  }

 private:
  template <int kRT, int kDT, int kNT, int kR, int kC>
  __device__ static __forceinline__ void accumulate(float (&acc)[kRT][kDT][4],
                                                    const float (&w)[kRT][kNT][4],
                                                    SmemTile<kR, kC> b) {
    uint32_t a[kRT][kNT / 2][4];
    acc_to_a(a, w);
    mma_b_kn(acc, a, b);
  }
};

}  // namespace qattn::cuda::flash
