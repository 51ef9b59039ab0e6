// Fused softmax + cross-entropy (+ its gradient) over padded logits, in place:
// the probabilities are never stored. With the gradient, a row that fits in
// shared memory (GPT-2's 50,304 padded columns are 100 KB; Hopper gives a block
// up to 227 KB) is read from global memory once and written once.
#pragma once
#include <cstdint>

#include "common.cuh"

namespace qattn::cuda {

// logits (N, Vp) bf16, of which columns [0, V) are real (Vp % 8 == 0).
// losses (N) fp32 = logsumexp(row) - row[target]. When write_grad, the logits
// are overwritten with dlogits = (softmax - onehot(target)) * dloss, and the
// padded columns with 0.
void classifier_forward_backward(bf16* logits, float* losses, const int32_t* targets, int N, int V,
                                 int Vp, float dloss, bool write_grad, cudaStream_t stream);

// The longest row, in bytes, that the gradient pass keeps in shared memory on
// the current device; longer rows are read from global memory twice.
int classifier_shared_row_limit();

}  // namespace qattn::cuda
