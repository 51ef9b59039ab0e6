// Operand precision policy of the flash skeleton: the six products of the
// precision keys qk, pv, dp, dv, dk, dq (docs/attention-maths.md §4.7), here
// all bf16 x bf16 -> fp32 on the tensor cores. FPA uses it for every product;
// a kind with int8 products supplies a policy with the same six functions
// (quantised tiles, block scales).
//
// `a` operands are A fragments of the warp's rows (from shared memory); `w`
// operands are fp32 accumulators of the previous step (weights P or dS), which
// are rounded to bf16 here; tiles are (rows, d) shared-memory tiles.
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
  // dQ += dS K.
  template <int kRT, int kDT, int kNT, int kR, int kC>
  __device__ static __forceinline__ void dq(float (&acc)[kRT][kDT][4],
                                            const float (&w)[kRT][kNT][4], SmemTile<kR, kC> k) {
    accumulate(acc, w, k);
  }

  // acc += w b: the weights rounded to bf16 as A fragments, b (k, N) with N contiguous.
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
