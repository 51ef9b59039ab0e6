// The CPU backend: Gpt2<float> + AdamW state behind the Backend interface.
#include <cmath>

#include "qattn/backend.hpp"
#include "qattn/cpu/attention.hpp"
#include "qattn/cpu/gpt2.hpp"
#include "qattn/optimizer.hpp"

namespace qattn {

namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const Config& c)
      : cfg_(c), model_(c.model, c.attention_per_layer()), m_(model_.layout().total, 0.0f),
        v_(model_.layout().total, 0.0f) {
    init_params(c.model, c.train.seed, model_.params);
  }
  std::string name() const override { return "cpu"; }
  const ParamLayout& layout() const override { return model_.layout(); }
  void get_params(std::vector<float>& out) override { out = model_.params; }
  void set_params(const std::vector<float>& in) override { model_.params = in; }
  void get_grads(std::vector<float>& out) override { out = model_.grads; }
  void get_adam_state(std::vector<float>& m, std::vector<float>& v) override { m = m_; v = v_; }
  void set_adam_state(const std::vector<float>& m, const std::vector<float>& v) override {
    m_ = m;
    v_ = v;
  }
  void zero_grad() override { std::fill(model_.grads.begin(), model_.grads.end(), 0.0f); }

  float forward_backward(const int32_t* in, const int32_t* tg, int B, int T, float scale) override {
    const float loss = model_.forward(in, tg, B, T);
    model_.backward(scale);
    return loss;
  }
  float forward_loss(const int32_t* in, const int32_t* tg, int B, int T) override {
    return model_.forward(in, tg, B, T);
  }
  float grad_norm() override {
    double s = 0;  // serial, in double: deterministic
    for (float g : model_.grads) s += static_cast<double>(g) * g;
    return static_cast<float>(std::sqrt(s));
  }
  void adamw_step(const AdamWHyper& h, float grad_mult, int64_t t) override {
    const ParamLayout& lay = model_.layout();
    for (int p = 0; p < P_COUNT; ++p) {
      const size_t o = lay.offset[p];
      AdamWHyper ht = h;
      ht.lr = static_cast<float>(h.lr * lr_multiplier(cfg_.model, p));
      adamw_update(model_.params.data() + o, model_.grads.data() + o, m_.data() + o, v_.data() + o,
                   lay.size[p], ht, ParamLayout::decayed(p), grad_mult, t);
    }
  }

  std::vector<LayerDiag> diagnostics(const int32_t* in, const int32_t* tg, int B, int T) override {
    const std::vector<float> saved = model_.grads;  // the probe must not touch training grads
    model_.forward(in, tg, B, T);
    model_.backward(1.0f);
    model_.grads = saved;
    const int H = cfg_.model.heads, hd = cfg_.model.head_dim();
    std::vector<LayerDiag> out;
    for (int l = 0; l < cfg_.model.layers; ++l) {
      const auto& io = model_.attention_io()[l];
      out.push_back(diagnose_layer(cfg_.attention_of(l), l, B, H, T, hd, io.q.data(), io.k.data(),
                                   io.v.data(), io.dout.data()));
    }
    return out;
  }

 private:
  Config cfg_;
  cpu::Gpt2<float> model_;
  std::vector<float> m_, v_;
};

}  // namespace

LayerDiag diagnose_layer(const AttentionConfig& a, int layer, int B, int H, int T, int hd,
                         const float* q, const float* k, const float* v, const float* dout) {
  LayerDiag d;
  d.layer = layer;
  d.kind = a.kind;
  const size_t n = static_cast<size_t>(B) * H * T * hd;
  double sq = 0, sk = 0;
  for (size_t i = 0; i < n; ++i) {
    sq += static_cast<double>(q[i]) * q[i];
    sk += static_cast<double>(k[i]) * k[i];
  }
  d.q_rms = std::sqrt(sq / n);
  d.k_rms = std::sqrt(sk / n);
  d.compared = a.kind != AttentionKind::fpa;
  // Heads of the first sequence: enough for the statistics. Each head is an
  // O(T^2 d) double-precision reference, so heads run in parallel; the reduction
  // below goes in head order, so the figures do not depend on the thread count.
  std::vector<cpu::AttentionComparison> per_head(H);
#pragma omp parallel for schedule(dynamic)
  for (int h = 0; h < H; ++h) {
    const size_t o = static_cast<size_t>(h) * T * hd;
    per_head[h] = cpu::compare_to_fpa(a, T, hd, q + o, k + o, v + o, dout + o);
  }
  for (const auto& c : per_head) {
    d.max_abs_score = std::max(d.max_abs_score, c.max_abs_score);
    if (!d.compared) continue;
    d.cos_o += c.cos_o / H, d.cos_p += c.cos_p / H, d.cos_ds += c.cos_ds / H;
    d.cos_dq += c.cos_dq / H, d.cos_dk += c.cos_dk / H, d.cos_dv += c.cos_dv / H;
    d.rel_o += c.rel_o / H, d.rel_p += c.rel_p / H, d.rel_ds += c.rel_ds / H;
    d.rel_dq += c.rel_dq / H, d.rel_dk += c.rel_dk / H, d.rel_dv += c.rel_dv / H;
  }
  return d;
}

std::unique_ptr<Backend> make_cpu_backend(const Config& cfg) {
  return std::make_unique<CpuBackend>(cfg);
}

}  // namespace qattn
