// One row of K-interval quantised softmax (docs/attention-maths.md §5) over the n visible scores
// s_j = c q.k_j of a query. Used by kind "kinterval" and by sage's composition
// with a quantised softmax.
#pragma once
#include "qattn/attention.hpp"

namespace qattn::cpu {

// w (n) = the quantised weights w^_j: grid values in (0, 1], 1 at the row max,
// exactly 0 below the fwm window.
template <typename F>
void kinterval_weights(const KIntervalOptions& opt, int n, const F* s, F* w);

// p (n) = w^ / sum(w^).
template <typename F>
void kinterval_probs(const KIntervalOptions& opt, int n, const F* s, F* p);

// ds (n) = dL/ds given g (n) = dL/dp^, as §5.6-§5.10's backward for the configured
// rounding, STE and calibration, including the paths through the row max m and
// min l unless detach_extrema.
template <typename F>
void kinterval_grad(const KIntervalOptions& opt, int n, const F* s, const F* g, F* ds);

}  // namespace qattn::cpu
