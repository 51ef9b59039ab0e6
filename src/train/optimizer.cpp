#include <cmath>

#include "qattn/optimizer.hpp"

namespace qattn {

double learning_rate(const TrainConfig& c, int64_t step) {
  const double floor_lr = c.lr * c.final_lr_frac;
  if (step < c.warmup) return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup);
  const double span = static_cast<double>(std::max<int64_t>(1, c.steps - c.warmup));
  const double progress = std::min(1.0, static_cast<double>(step - c.warmup) / span);  // 0 -> 1
  switch (c.schedule) {
    case Schedule::constant:
      return c.lr;
    case Schedule::linear:
      return c.lr + (floor_lr - c.lr) * progress;
    case Schedule::cosine:
      return floor_lr + 0.5 * (c.lr - floor_lr) * (1.0 + std::cos(M_PI * progress));
    case Schedule::wsd: {
      const double decay_start = 1.0 - c.wsd_decay_frac;
      if (progress <= decay_start || c.wsd_decay_frac <= 0) return c.lr;
      return c.lr + (floor_lr - c.lr) * (progress - decay_start) / c.wsd_decay_frac;
    }
  }
  return c.lr;
}

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n,
                  const AdamWHyper& h, bool decay, float grad_mult, int64_t t) {
  const float bc1 = 1.0f - std::pow(h.beta1, static_cast<float>(t));
  const float bc2 = 1.0f - std::pow(h.beta2, static_cast<float>(t));
  const float wd = decay ? h.weight_decay : 0.0f;
#pragma omp parallel for
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i] * grad_mult;
    m[i] = h.beta1 * m[i] + (1.0f - h.beta1) * g;
    v[i] = h.beta2 * v[i] + (1.0f - h.beta2) * g * g;
    const float mhat = m[i] / bc1, vhat = v[i] / bc2;
    param[i] -= h.lr * (mhat / (std::sqrt(vhat) + h.eps) + wd * param[i]);
  }
}

}  // namespace qattn
