// CPU reference of every attention kind (docs/attention-maths.md §2, §4, §5).
// One (batch, head) at a time: q, k, v, o, dout, dq, dk, dv are (T, d)
// row-major, causal. Plain loops; instantiated for float (training) and double
// (tests). Quantised kinds simulate the quantisation bit for bit as those
// sections define it: these are what the CUDA kernels are tested against.
#pragma once
#include "qattn/attention.hpp"

namespace qattn::cpu {

// o = Attention_kind(q, k, v). The backward recomputes what it needs from the
// inputs, so nothing is saved between the two calls.
template <typename F>
void attention_forward(const AttentionConfig& cfg, int T, int d, const F* q, const F* k,
                       const F* v, F* o);

// dq, dk, dv = gradients of <dout, o> (overwritten, not accumulated).
template <typename F>
void attention_backward(const AttentionConfig& cfg, int T, int d, const F* q, const F* k,
                        const F* v, const F* o, const F* dout, F* dq, F* dk, F* dv);

// docs/attention-maths.md §7: one head's comparison of a kind against FPA on the same inputs, in
// double. P and dS are compared over the visible (causal) entries.
struct AttentionComparison {
  double cos_o, cos_p, cos_ds, cos_dq, cos_dk, cos_dv;
  double rel_o, rel_p, rel_ds, rel_dq, rel_dk, rel_dv;
  double max_abs_score;  // max |c q.k| over visible entries
};
AttentionComparison compare_to_fpa(const AttentionConfig& cfg, int T, int d, const float* q,
                                   const float* k, const float* v, const float* dout);

}  // namespace qattn::cpu
