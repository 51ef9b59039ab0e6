// Host-side comparison of the CUDA attention's outputs with the fp64 CPU
// reference (qattn::cpu), one (b, h) head at a time, on the same bf16 inputs.
// Used by tests/gpu and by `qattn bench attention` for its error column.
#pragma once
#include <cuda_bf16.h>

#include <vector>

#include "attention/attention.cuh"

namespace qattn::cuda {

// One (b, h) head as contiguous (T, d) fp64 from a (B, T, nslots, H, d) bf16
// host tensor (qkv: nslots 3, slot 0 q, 1 k, 2 v; o, dout: nslots 1, slot 0).
std::vector<double> head_slice(const std::vector<__nv_bfloat16>& x, const AttentionShape& s,
                               int nslots, int slot, int b, int h);

// Squared-error sums of one head; relative L2 = sqrt(err / ref) after summing
// over heads. NaN anywhere in the GPU output makes err NaN.
struct AttentionErrorSums {
  double err_o = 0, ref_o = 0, err_lse = 0, ref_lse = 0;
  double err_dq = 0, ref_dq = 0, err_dk = 0, ref_dk = 0, err_dv = 0, ref_dv = 0;
  void add(const AttentionErrorSums& o);
};

struct AttentionErrors {
  double o, lse, dq, dk, dv;  // relative L2 errors
};
AttentionErrors relative_errors(const AttentionErrorSums& s);

// qkv, dqkv (B, T, 3, H, d); dout, o (B, T, H, d); lse (B, H, T): host copies.
// lse is compared when it is non-null (FPA's saved L = log-sum-exp of c q.k).
AttentionErrorSums compare_head_with_cpu(const AttentionConfig& cfg, const AttentionShape& s, int b,
                                         int h, const std::vector<__nv_bfloat16>& qkv,
                                         const std::vector<__nv_bfloat16>& dout,
                                         const std::vector<__nv_bfloat16>& o,
                                         const std::vector<__nv_bfloat16>& dqkv, const float* lse);

}  // namespace qattn::cuda
