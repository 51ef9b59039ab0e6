// Token + position embedding, forward and backward (deterministic).
#pragma once
#include <cstdint>

#include "common.cuh"

namespace qattn::cuda {

// out (B, T, C) = wte[inp] + wpe[t]; inp (B, T) device token ids. C % 8 == 0.
void encoder_forward(bf16* out, const int32_t* inp, const bf16* wte, const bf16* wpe, int B, int T,
                     int C, cudaStream_t stream);

// The positions of each distinct token, built on the host from the token ids
// (counting sort, ascending token, positions in order): the backward of wte then
// sums each token's rows in a fixed order, without atomics.
struct TokenBuckets {
  int num_tokens = 0;        // distinct tokens in the batch
  const int32_t* token;      // (num_tokens) the token of each bucket
  const int32_t* start;      // (num_tokens + 1) bucket b owns position[start[b] .. start[b+1])
  const int32_t* position;   // (B*T) flat positions b*T + t
};

// dwte[token] += sum of dout over the token's positions; dwpe[t] += sum over b of
// dout[b, t]. Gradients fp32, accumulated.
void encoder_backward(float* dwte, float* dwpe, const bf16* dout, const TokenBuckets& buckets,
                      int B, int T, int C, cudaStream_t stream);

}  // namespace qattn::cuda
