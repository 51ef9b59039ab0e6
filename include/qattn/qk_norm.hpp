// QK-norm's forms and options (model.qk_norm; docs/attention-maths.md §3).
// Light on purpose: the CUDA kernels include it.
#pragma once
#include <algorithm>
#include <cmath>

#include "qattn/value_names.hpp"

namespace qattn {

enum class QkNormForm {
  off,   // q and k go to attention as projected
  gain,  // §3.1: y = γ ∘ x / √(mean(x²) + ε), γ per channel, per layer, shared by heads
  logit_scale,  // §3.4: S = g_h · q̂·k̂ with unit q̂, k̂ and a learned g per head and layer
};

struct QkNormConfig {
  QkNormForm form = QkNormForm::off;
  double lr_mult = 1.0;           // AdamW's lr times this for the QK-norm parameters
  double logit_scale_init = 0.0;  // logit_scale: g at init (the reader fills the default)
  bool on() const { return form != QkNormForm::off; }
};

// The names configs and logs use (value_names.hpp); a config names the two forms,
// false is off.
inline constexpr ValueName<QkNormForm> kQkNormFormNames[] = {
    {"off", QkNormForm::off}, {"gain", QkNormForm::gain}, {"logit_scale", QkNormForm::logit_scale}};

inline const char* to_string(QkNormForm f) { return name_of(kQkNormFormNames, f); }

// log2(T² − T), Henry et al.'s initial g for sequences of T tokens; 1 for T ≤ 2, where the
// formula gives at most 1 (T = 1: log2 0).
inline double default_logit_scale_init(int seq_len) {
  const double T = seq_len;
  return std::log2(std::max(T * T - T, 2.0));
}

}  // namespace qattn
