// SageBwd's quantisation pre-pass (docs/attention-maths.md §4.2-§4.5):
// per block of kSageBlock rows of one (batch, head), ψ of c·(Q − μ_Q), K − μ_K,
// V (the forward's, kept for the backward) and dO (the backward's), each in the
// layouts the sage kernels read, plus the fp32 terms that go with them (μ_K,
// μ_Q, the smooth_q bias, δ).
//
// The buffers pad T to Tp = whole blocks; padded rows are zero in every copy
// (and never change a scale), so the kernels load whole tiles without bounds.
#pragma once
#include <cuda_runtime.h>

#include <cfloat>
#include <cstddef>
#include <cstdint>

#include "attention/attention.cuh"
#include "common.cuh"

namespace qattn::cuda {

// Rows per quantisation block = the kernels' tile (block_q, block_k: §4.8).
constexpr int kSageBlock = 64;

// The transposed copies hold T permuted within each group of 16: position p of
// a group holds its row kPermuted(p), the order in which a thread's fp32
// accumulator columns form an int8 A fragment (int8_operands.cuh).
__host__ __device__ constexpr int kPermuted(int p) {
  return 2 * (p / 4) + (p % 2) + 8 * ((p % 4) / 2);
}

// One operand of one attention call, all (b, h) heads: X quantised per block
// of kSageBlock rows, and the same X rounded to bf16 (for products set to bf16).
struct QuantOperand {
  int8_t* i8;    // (B·H, Tp, d)  X̂, row-major (int8 levels or e4m3 bytes)
  int8_t* i8t;   // (B·H, d, Tp)  X̂ᵀ, T permuted within groups of 16 (int8_operands.cuh)
  bf16* bf;      // (B·H, Tp, d)  bf16(X)
  float* scale;  // (B·H, Tp / kSageBlock)  the natural copy's scale per block
  // The transposed copy's scale per block: `scale` itself, or its own array
  // where one of i8 and i8t holds e4m3 on power-of-two scales and the other
  // ψ's int8 levels (the products reading them differ in fp8: qk against dk
  // or dq, dp against pv or dv; quant.cu).
  float* t_scale;
};

// The kernels' view of both buffers (sage_workspace below): saved by the
// forward, q, k, v, the key sums and means, the query means and bias; the
// backward's scratch, dout, delta, row_terms.
struct SageWorkspace {
  int Tp, blocks;              // T padded to whole blocks; Tp / kSageBlock
  QuantOperand q, k, v, dout;  // c·(Q − μ_Q), K − μ_K, V, dO
  float* key_block_sums;  // (B·H, blocks, d)  Σ of K over each block (for μ_K; smooth_k, else null)
  float* key_mean;        // (B·H, d)          μ_K (zeros without smooth_k)
  float* query_mean;      // (B·H, blocks, d)  μ_Q per block (smooth_q, else null)
  float* query_bias;      // (B·H, blocks, Tp) c·μ_Qi·(K_j − μ_K) (smooth_q; else null)
  float* delta;           // (B·H, Tp)         δ = rowsum(dO ∘ O) (backward)
  // dq or dk = fp8 (docs/attention-maths.md §4.12), else null: what dS's bounds
  // B_i = ‖dO_i‖·max‖V‖ + |δ_i| and C_j = ‖V_j‖·max‖dO‖ + max|δ| are made of,
  // V's from the forward (saved), dO's and δ's from the backward (scratch).
  float* v_norm;              // (B·H, Tp)         ‖V_t‖ (0 past T)
  float* v_norm_block_max;    // (B·H, blocks)     per block: max ‖V_t‖
  float* do_norm;             // (B·H, Tp)         ‖dO_t‖ (0 past T)
  float* backward_block_max;  // (B·H, blocks, 2)  per block: max ‖dO_t‖, max |δ_t|
  float* row_terms;           // (B·H, Tp, 4)      the K-interval composition's backward row
                     //                   terms (sage_softmax.cuh; softmax block only, else null)
  // Head bh's first block in the per-block arrays (scales, query_mean, query_bias).
  __host__ __device__ size_t head_block0(int bh) const { return static_cast<size_t>(bh) * blocks; }
};

// Which copies of each operand the kernels read, so that the pre-pass writes
// (and the buffers hold) only those: int8 natural (products over d at int8),
// int8 transposed (products over T at int8), bf16 (any product at bf16).
struct OperandCopies {
  bool i8 = true, i8t = true, bf = true;
};
struct SageCopies {
  OperandCopies q, k, v, dout;
};
// The copies a training step reads under opt's precision flags: of Q, K, V
// those of the forward's and the backward's kernels (the forward's pre-pass
// writes them once, the backward reads them from the saved buffer), of dO the
// backward's.
SageCopies sage_copies(const SageOptions& opt);
// What each pre-pass writes of those: the forward Q, K, V's (V's bf16 copy only
// under pv = bf16, the one the forward reads); the backward dO's and V's bf16
// copy where an mma.sync kernel reads them and the forward did not write it
// (`in_place`: both backward kernels run on wgmma, which read V and dO as the
// activations hold them).
SageCopies sage_forward_copies(const SageOptions& opt);
SageCopies sage_backward_copies(const SageOptions& opt, bool in_place);

// The forward's pre-pass writes Q, K, V's copies, their scales, μ_K, μ_Q, the
// smooth_q bias and ‖V_t‖ into the *saved* buffer, which the backward of the
// same call reads (a model keeps one per layer, as it keeps the row
// statistics); the backward's pre-pass writes dO's copies, δ, ‖dO_t‖ and the
// K-interval row terms into the *scratch* buffer, which every layer may share. V's bf16 copy is the
// forward's (saved) under pv = bf16, else the backward's (scratch): the wgmma
// backward kernels read V and dO in place, so on Hopper it is written only for
// an mma.sync kernel. Both 256-byte aligned; the copies not in `copies` take no
// space (their pointers are null).
size_t sage_saved_bytes(const SageOptions& opt, const AttentionShape& s, const SageCopies& copies);
size_t sage_workspace_bytes(const SageOptions& opt, const AttentionShape& s,
                            const SageCopies& copies);
// Carves the buffers out of `saved` and `scratch` (either may be null: its
// buffers are then null, as in the forward, which has no scratch).
SageWorkspace sage_workspace(const SageOptions& opt, const AttentionShape& s, void* saved,
                             void* scratch, const SageCopies& copies);

// The forward's pre-pass: qkv (B, T, 3, H, d) -> ws.q, ws.k, ws.v (the copies
// named in `copies`, and their scales), μ_K, μ_Q and the bias per the options,
// and under dq or dk = fp8 ‖V_t‖ and its block maxima.
// `phases` (phases.cuh), where given, times its launches: "key_block_sums" and
// "key_mean" (smooth_k), "quantise_qkv", "query_bias" (smooth_q).
void sage_quantise_inputs(const SageOptions& opt, const AttentionShape& s, const bf16* qkv,
                          const SageWorkspace& ws, const SageCopies& copies, cudaStream_t stream,
                          PhaseRecorder* phases = nullptr);
// The backward's: dout, o (B, T, H, d) -> ws.dout (its copies and scales) and
// ws.delta (under dq or dk = fp8 also ‖dO_t‖ and the block maxima of it and
// |δ_t|); and V's bf16 copy from qkv where copies.v.bf names it. One launch,
// "quantise_dout".
void sage_quantise_gradient(const SageOptions& opt, const AttentionShape& s, const bf16* qkv,
                            const bf16* o, const bf16* dout, const SageWorkspace& ws,
                            const SageCopies& copies, cudaStream_t stream,
                            PhaseRecorder* phases = nullptr);

#ifdef __CUDACC__
// ψ's level of x at scale s (§4.1): round(x / s), half away from zero, as the
// CPU reference rounds, as a byte (two's complement).
//
// By definition: an IEEE division and roundf, each a conversion-unit
// instruction per element (MUFU.RCP, F2I: 16 per clock per SM on sm_90, a
// quarter of the FP32 rate; Nsight Compute had that pipe 60% busy in the
// forward pre-pass). quantise_level below avoids both: the forward pre-pass
// takes 7% less time with it (tools/dev/profile_attention.sh --kind sage), the
// backward's the same.
__device__ __forceinline__ uint32_t quantise_level_by_division(float x, float s) {
  return static_cast<uint32_t>(static_cast<int>(roundf(x / s))) & 0xFFu;
}
// The same on the FP32 pipes, given r = 1/s rounded to nearest (once per block):
// q = x·r is within about an ulp of x/s, and one correction by the exact
// residual x − q·s (an FMA) gives the correctly rounded quotient (Markstein's
// step; the GPU test "sage pre-pass: ψ's levels by reciprocal equal those by
// division" compares the two on random and near-tie inputs). Then n = round to
// nearest even of |q| by adding and subtracting 2^23, a tie (|q| − n = ½)
// moved away from zero, and the signed level's byte from the 1.5·2^23 bias
// (int8_operands.cuh). Needs a normal 1/s: s ≥ kReciprocalScaleMin.
constexpr float kReciprocalScaleMin = 0x1p-120f;
__device__ __forceinline__ uint32_t quantise_level(float x, float s, float r) {
  const float q0 = x * r;
  const float q = fmaf(fmaf(-q0, s, x), r, q0);
  const float a = fabsf(q);
  float n = (a + 8388608.0f) - 8388608.0f;  // |q| < 2^22
  if (a - n == 0.5f) n += 1.0f;
  return __float_as_uint(copysignf(n, q) + 12582912.0f) & 0xFFu;
}

// fp8's scale of a block whose largest magnitude is amax (docs/attention-maths.md
// §4.12): 2^e with e the smallest such that amax <= 2^(e + 8). A block of zeros
// gets 0, where the definition has 1: its values are zeros either way, and 0
// keeps it out of the head's largest scale, which the forward folds against.
__device__ __forceinline__ float fp8_block_scale(float amax) {
  if (amax == 0.0f) return 0.0f;
  int e = 0;
  const float f = frexpf(amax, &e);  // amax = f·2^e, f in [0.5, 1)
  return ldexpf(1.0f, (f == 0.5f ? e - 1 : e) - 8);
}
// dS's scale from its bound b (§4.12): 2^e(b), with e(0) = 0 (a row or column
// whose bound is 0 has dS = 0 there), and at least FLT_MIN, so that its
// reciprocal, which multiplies dS before the cast, is finite: a bound under
// 2^-118 (a head whose V or dO is all zeros makes one of about FLT_MIN) would
// give 2^e(b) a subnormal whose reciprocal is inf, and 0 · inf = NaN in dŜ.
// |dS| ≤ b keeps dS / FLT_MIN below 2^8.
__device__ __forceinline__ float fp8_bound_scale(float bound) {
  return bound == 0.0f ? 1.0f : fmaxf(fp8_block_scale(bound), FLT_MIN);
}
// 2^8 / top, the factor that puts a head's e4m3 block scales s_j (top: their
// largest) under e4m3's 2^8 (s_j · fold ≤ 2^8). top is taken at least 2^-118,
// so that the fold and its reciprocal (which scales the product back) are
// normal floats: a head whose V or dO is all zeros has top = 0 or FLT_MIN, and
// 2^8 / FLT_MIN overflows, making a zero block's s_j · fold = 0 · inf = NaN.
// Below the floor every s_j · fold stays under 2^8, as above it.
__device__ __forceinline__ float fp8_fold(float top) { return 256.0f / fmaxf(top, 0x1p-118f); }
// The head's largest of n per-block values x[0], x[stride], … (each warp its
// own reduction; at least FLT_MIN, so that its reciprocal is finite).
__device__ __forceinline__ float head_max(const float* x, int n, int stride) {
  float top = FLT_MIN;
  for (int j = static_cast<int>(threadIdx.x % 32); j < n; j += 32)
    top = fmaxf(top, x[static_cast<size_t>(j) * stride]);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, offset));
  return top;
}
#endif  // __CUDACC__

}  // namespace qattn::cuda
