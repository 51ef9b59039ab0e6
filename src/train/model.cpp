// GPT-2 parameter layout, init and FLOP count, shared by every backend.
#include <algorithm>
#include <cmath>
#include <random>

#include "qattn/model.hpp"

namespace qattn {

ParamLayout::ParamLayout(const ModelConfig& m) {
  const size_t V = m.vocab, T = m.seq_len, L = m.layers, C = m.dim, hd = m.head_dim();
  const size_t H = m.heads;
  const size_t gain = m.qk_norm.form == QkNormForm::gain ? L * hd : 0;
  const size_t scale = m.qk_norm.form == QkNormForm::logit_scale ? L * H : 0;
  size = {V * C, T * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
          L * C, L * C, L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C, gain, gain, scale};
  for (int i = 0; i < P_COUNT; ++i) {
    offset[i] = total;
    total += size[i];
  }
}

bool ParamLayout::decayed(int t) {
  return t == P_WTE || t == P_WPE || t == P_QKVW || t == P_ATTPROJW || t == P_FCW || t == P_FCPROJW;
}

bool ParamLayout::qk_norm_param(int t) { return t == P_QGAMMA || t == P_KGAMMA || t == P_QKSCALE; }

bool ParamLayout::layered(int t) { return (t >= P_LN1W && t <= P_FCPROJB) || qk_norm_param(t); }

const char* ParamLayout::name(int t) {
  static const char* names[P_COUNT] = {"wte",      "wpe",      "ln1w",    "ln1b",   "qkvw",
                                       "qkvb",     "attprojw", "attprojb", "ln2w",  "ln2b",
                                       "fcw",      "fcb",      "fcprojw", "fcprojb", "lnfw",
                                       "lnfb",     "qgamma",   "kgamma",  "qkscale"};
  return names[t];
}

double lr_multiplier(const ModelConfig& m, int t) {
  return ParamLayout::qk_norm_param(t) ? m.qk_norm.lr_mult : 1.0;
}

void init_params(const ModelConfig& m, uint64_t seed, std::vector<float>& params) {
  const ParamLayout lay(m);
  params.assign(lay.total, 0.0f);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const float residual_scale = 1.0f / std::sqrt(2.0f * static_cast<float>(m.layers));
  for (int t = 0; t < P_COUNT; ++t) {
    float* p = params.data() + lay.offset[t];
    const size_t n = lay.size[t];
    const bool ones = t == P_LN1W || t == P_LN2W || t == P_LNFW || t == P_QGAMMA || t == P_KGAMMA;
    const bool matrix = ParamLayout::decayed(t);
    const float scale = (t == P_ATTPROJW || t == P_FCPROJW) ? residual_scale : 1.0f;
    const float constant = ones ? 1.0f : t == P_QKSCALE ? static_cast<float>(m.qk_norm.logit_scale_init) : 0.0f;
    for (size_t i = 0; i < n; ++i) p[i] = matrix ? normal(rng) * scale : constant;
  }
}

std::vector<float> params_for_context(const ModelConfig& from, const std::vector<float>& params,
                                      const ModelConfig& to) {
  const ParamLayout ours(to), theirs(from);
  std::vector<float> out(ours.total);
  for (int t = 0; t < P_COUNT; ++t)
    std::copy_n(params.begin() + static_cast<std::ptrdiff_t>(theirs.offset[t]), ours.size[t],
                out.begin() + static_cast<std::ptrdiff_t>(ours.offset[t]));
  return out;
}

size_t num_parameters(const ModelConfig& m) { return ParamLayout(m).total; }

double flops_per_token(const ModelConfig& m) {
  return 6.0 * static_cast<double>(num_parameters(m)) +
         6.0 * m.layers * static_cast<double>(m.dim) * m.seq_len;
}

}  // namespace qattn
