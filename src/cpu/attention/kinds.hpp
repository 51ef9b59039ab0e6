// Internal interface of the CPU attention kinds (docs/attention-maths.md §2, §4, §5).
// dispatch.cpp picks one by AttentionConfig::kind; tests call them directly.
// One (batch, head): q, k, v, o, dout, dq, dk, dv are (T, d) row-major, causal.
#pragma once
#include <vector>

#include "qattn/attention.hpp"

namespace qattn::cpu {

// What a backward pass computed on the way, for the diagnostics (§7) and tests:
// probabilities P and score gradients dS, (T, T) row-major, zero above the diagonal.
template <typename F>
struct AttentionInternals {
  std::vector<F> p;   // (T, T)
  std::vector<F> ds;  // (T, T)
  F fp8_peak = 0;     // sage: the largest |x / s| of any fp8 operand before its cast (§4.12)
};

// Backward functions overwrite dq, dk, dv; `keep` (may be null) receives P and dS.
template <typename F>
void fpa_forward(int T, int d, const F* q, const F* k, const F* v, F* o);
template <typename F>
void fpa_backward(int T, int d, const F* q, const F* k, const F* v, const F* dout, F* dq, F* dk,
                  F* dv, AttentionInternals<F>* keep);

template <typename F>
void kinterval_forward(const KIntervalOptions& opt, int T, int d, const F* q, const F* k,
                       const F* v, F* o);
template <typename F>
void kinterval_backward(const KIntervalOptions& opt, int T, int d, const F* q, const F* k,
                        const F* v, const F* dout, F* dq, F* dk, F* dv,
                        AttentionInternals<F>* keep);

// sage's backward reads the forward output o (§4.5: delta_i = rowsum(dO_i * O_i)).
template <typename F>
void sage_forward(const SageOptions& opt, int T, int d, const F* q, const F* k, const F* v,
                  F* o);
template <typename F>
void sage_backward(const SageOptions& opt, int T, int d, const F* q, const F* k, const F* v,
                   const F* o, const F* dout, F* dq, F* dk, F* dv, AttentionInternals<F>* keep);

}  // namespace qattn::cpu
