// One row of the exact softmax and its gradient: FPA's row map
// (docs/attention-maths.md §2), also the surrogate of K-interval's probability
// STE (§5.8).
#pragma once

namespace qattn::cpu {

// p (n) = softmax(s (n)).
template <typename F>
void softmax_row(int n, const F* s, F* p);

// ds (n) = p * (g - sum_j p_j g_j), where g = dL/dp.
template <typename F>
void softmax_row_grad(int n, const F* p, const F* g, F* ds);

}  // namespace qattn::cpu
