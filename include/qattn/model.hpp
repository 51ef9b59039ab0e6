// GPT-2 parameter layout shared by every backend, checkpoints and llm.c export.
// All parameters live in one flat buffer, tensors in the order below (llm.c's
// order, with the QK-norm parameters of model.qk_norm's form appended).
#pragma once
#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "qattn/config.hpp"

namespace qattn {

enum ParamTensor {
  P_WTE,       // (V, C)     token embedding, tied with the head
  P_WPE,       // (T, C)     position embedding
  P_LN1W,      // (L, C)
  P_LN1B,      // (L, C)
  P_QKVW,      // (L, 3C, C) fused QKV projection, rows are outputs
  P_QKVB,      // (L, 3C)
  P_ATTPROJW,  // (L, C, C)
  P_ATTPROJB,  // (L, C)
  P_LN2W,      // (L, C)
  P_LN2B,      // (L, C)
  P_FCW,       // (L, 4C, C)
  P_FCB,       // (L, 4C)
  P_FCPROJW,   // (L, C, 4C)
  P_FCPROJB,   // (L, C)
  P_LNFW,      // (C)
  P_LNFB,      // (C)
  P_QGAMMA,    // (L, hd)    QK-norm gain of q (form gain; size 0 otherwise)
  P_KGAMMA,    // (L, hd)    QK-norm gain of k (form gain; size 0 otherwise)
  P_QKSCALE,   // (L, H)     QK-norm logit scale g (form logit_scale; size 0 otherwise)
  P_COUNT
};

struct ParamLayout {
  std::array<size_t, P_COUNT> size{};
  std::array<size_t, P_COUNT> offset{};
  size_t total = 0;
  explicit ParamLayout(const ModelConfig& m);
  // True for the 2-D weight matrices that get weight decay (and wte, wpe).
  static bool decayed(int tensor);
  // True for QK-norm's parameters (γ_q, γ_k, g): model.qk_norm.lr_mult applies to them.
  static bool qk_norm_param(int tensor);
  // True for the tensors stacked per layer, (L, ...).
  static bool layered(int tensor);
  static const char* name(int tensor);
};

// The learning-rate multiplier of a tensor: model.qk_norm.lr_mult for QK-norm's
// parameters, 1 for the rest.
double lr_multiplier(const ModelConfig& m, int tensor);

// GPT-2 init: N(0, 0.02), residual projections / sqrt(2L), LayerNorm weights 1,
// biases 0, QK-norm gains 1, logit scales model.qk_norm.logit_scale_init.
// Deterministic in the seed.
void init_params(const ModelConfig& m, uint64_t seed, std::vector<float>& params);

// The parameters of model `from` for model `to`, which has the same sizes but
// a context of at most from.seq_len: wpe keeps its first to.seq_len rows (how
// a model file made for a longer context starts a shorter run).
std::vector<float> params_for_context(const ModelConfig& from, const std::vector<float>& params,
                                      const ModelConfig& to);

// FLOPs per token for MFU (llm.c's formula): 6 N + 6 L C T.
double flops_per_token(const ModelConfig& m);
size_t num_parameters(const ModelConfig& m);

}  // namespace qattn
