// The whole model on the GPU against the CPU backend (the fp32 reference), on
// a small config with the same parameters and batches:
//   one step: loss within 1e-2 (absolute, nats), every parameter tensor's
//   gradient within a relative L2 of 3e-2 (bf16 activations through 2 layers; measured <= 1.1e-2);
//   20 AdamW steps: every step's loss within 1e-2 of the CPU run's.
// Both run without QK-norm and with each form of it (docs/attention-maths.md §3).
// With QK-norm's lr multiplier at 10, the first AdamW step moves QK-norm's
// parameters by lr * 10 (within 0.1%; at least 90% of it on average), 20 steps
// per form follow the CPU run's losses, and the QK-norm parameters end within a
// relative L2 of 3e-2 of the CPU's.
// Also: loss and grad norm are bit-identical when a step is repeated; the
// diagnostics agree with the CPU backend's and leave the gradients alone; a
// model with a different kind per layer (attention.layers) follows the CPU
// backend within the same loss and grad-norm tolerances for 5 steps.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "gpu_test_util.hpp"
#include "qattn/backend.hpp"

using namespace qattn;
using namespace qattn::test;

namespace {

constexpr double kLossTol = 1e-2;
constexpr double kGradTol = 3e-2;

Config small_config(QkNormForm qk_norm = QkNormForm::off, double qk_lr_mult = 1.0) {
  Config c;
  c.model.vocab = 1000;  // padded to 1024 inside the CUDA backend
  c.model.layers = 2;
  c.model.heads = 2;
  c.model.dim = 128;     // head_dim 64
  c.model.seq_len = 64;
  c.model.qk_norm.form = qk_norm;
  c.model.qk_norm.lr_mult = qk_lr_mult;
  c.model.qk_norm.logit_scale_init = default_logit_scale_init(c.model.seq_len);
  c.train.micro_batch = 4;
  c.train.seed = rng()();
  return c;
}

// Token streams with structure (a noisy affine recurrence), so the loss falls.
void make_batch(int B, int T, int V, std::vector<int32_t>& in, std::vector<int32_t>& tg) {
  const auto noise = random_tokens(static_cast<size_t>(B) * (T + 1), V);
  std::vector<int32_t> seq(static_cast<size_t>(B) * (T + 1));
  for (int b = 0; b < B; ++b) {
    int32_t x = noise[b * (T + 1)];
    for (int t = 0; t <= T; ++t) {
      seq[b * (T + 1) + t] = x;
      x = (noise[b * (T + 1) + t] % 8 == 0) ? noise[b * (T + 1) + t] : (7 * x + 3) % V;
    }
  }
  in.resize(B * T);
  tg.resize(B * T);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      in[b * T + t] = seq[b * (T + 1) + t];
      tg[b * T + t] = seq[b * (T + 1) + t + 1];
    }
}

double tensor_rel_l2(const std::vector<float>& a, const std::vector<float>& b, size_t off,
                     size_t n) {
  return rel_l2(std::vector<float>(a.begin() + off, a.begin() + off + n),
                std::vector<float>(b.begin() + off, b.begin() + off + n));
}

// The CPU backend (fp32 reference) and the CUDA backend, from the same parameters.
struct Twins {
  std::unique_ptr<Backend> cpu, gpu;
};

Twins make_twins(const Config& cfg) {
  Twins t{make_cpu_backend(cfg), make_cuda_backend(cfg)};
  std::vector<float> params;
  t.cpu->get_params(params);
  t.gpu->set_params(params);
  return t;
}

// Loss and clipped grad norm of one AdamW step, per backend (0 cpu, 1 cuda).
struct StepResult {
  double loss[2];
  float norm[2];
};

constexpr float kLr = 1e-3f;

// `steps` AdamW steps of both backends on the same fresh batches, `accum`
// micro-batches per step, counted from first_step; the per-step results,
// printed as they come.
std::vector<StepResult> train_both(Twins& t, const Config& cfg, int steps, int accum,
                                   int first_step = 1) {
  const int B = cfg.train.micro_batch, T = cfg.model.seq_len;
  const AdamWHyper h{kLr, 0.9f, 0.95f, 1e-8f, 0.1f};
  std::vector<StepResult> out;
  for (int step = first_step; step < first_step + steps; ++step) {
    std::vector<std::vector<int32_t>> ins(accum), tgs(accum);
    for (int a = 0; a < accum; ++a) make_batch(B, T, cfg.model.vocab, ins[a], tgs[a]);
    StepResult r{};
    Backend* backends[2] = {t.cpu.get(), t.gpu.get()};
    for (int i = 0; i < 2; ++i) {
      Backend& be = *backends[i];
      be.zero_grad();
      for (int a = 0; a < accum; ++a)
        r.loss[i] += be.forward_backward(ins[a].data(), tgs[a].data(), B, T, 1.0f / accum) / accum;
      r.norm[i] = be.grad_norm();
      be.adamw_step(h, r.norm[i] > 1.0f ? 1.0f / r.norm[i] : 1.0f, step);
    }
    std::printf("step %2d loss cpu %.5f cuda %.5f diff %+.5f; grad norm cpu %.4f cuda %.4f\n", step,
                r.loss[0], r.loss[1], r.loss[1] - r.loss[0], r.norm[0], r.norm[1]);
    out.push_back(r);
  }
  return out;
}

}  // namespace

TEST_CASE("CUDA model: one step's loss and every gradient match the CPU backend", "[model][qknorm]") {
  for (const QkNormForm qk_norm : {QkNormForm::off, QkNormForm::gain, QkNormForm::logit_scale}) {
    INFO("qk_norm = " << to_string(qk_norm));
    const Config cfg = small_config(qk_norm);
    Twins twins = make_twins(cfg);
    auto& cpu = twins.cpu;
    auto& gpu = twins.gpu;
    std::vector<float> params, back;
    cpu->get_params(params);
    gpu->get_params(back);
    CHECK(rel_l2(back, params) == 0.0);

    const int B = cfg.train.micro_batch, T = cfg.model.seq_len;
    std::vector<int32_t> in, tg;
    make_batch(B, T, cfg.model.vocab, in, tg);
    cpu->zero_grad();
    gpu->zero_grad();
    const float loss_cpu = cpu->forward_backward(in.data(), tg.data(), B, T, 0.5f);
    const float loss_gpu = gpu->forward_backward(in.data(), tg.data(), B, T, 0.5f);
    INFO("loss cpu " << loss_cpu << " gpu " << loss_gpu);
    CHECK(std::abs(loss_cpu - loss_gpu) < kLossTol);
    CHECK(std::abs(gpu->forward_loss(in.data(), tg.data(), B, T) - loss_gpu) < 1e-6);

    std::vector<float> g_cpu, g_gpu;
    cpu->get_grads(g_cpu);
    gpu->get_grads(g_gpu);
    const ParamLayout& lay = cpu->layout();
    for (int t = 0; t < P_COUNT; ++t) {
      if (lay.size[t] == 0) continue;
      const double err = tensor_rel_l2(g_gpu, g_cpu, lay.offset[t], lay.size[t]);
      std::printf("qk_norm=%s grad %-9s rel L2 %.2e\n", to_string(qk_norm), ParamLayout::name(t), err);
      INFO("tensor " << ParamLayout::name(t));
      CHECK(err < kGradTol);
    }
    const float norm_cpu = cpu->grad_norm(), norm_gpu = gpu->grad_norm();
    CHECK(std::abs(norm_gpu - norm_cpu) / norm_cpu < kGradTol);

    // Repeating the step gives bit-identical loss and grad norm.
    gpu->zero_grad();
    const float again = gpu->forward_backward(in.data(), tg.data(), B, T, 0.5f);
    CHECK(again == loss_gpu);
    CHECK(gpu->grad_norm() == norm_gpu);
  }
}

TEST_CASE("CUDA model: 20 training steps follow the CPU backend's losses", "[model]") {
  const Config cfg = small_config();
  Twins twins = make_twins(cfg);
  const auto steps = train_both(twins, cfg, 20, /*accum=*/2);
  for (size_t i = 0; i < steps.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(std::abs(steps[i].loss[0] - steps[i].loss[1]) < kLossTol);
  }
}

TEST_CASE("CUDA model: 20 steps with each QK-norm form at lr_mult 10 follow the CPU backend",
          "[model][qknorm]") {
  for (const QkNormForm form : {QkNormForm::gain, QkNormForm::logit_scale}) {
    INFO("qk_norm = " << to_string(form));
    const double mult = 10.0;
    const Config cfg = small_config(form, mult);
    Twins twins = make_twins(cfg);
    std::vector<float> init, p_cpu, p_gpu;
    twins.cpu->get_params(init);
    const ParamLayout& lay = twins.cpu->layout();
    // AdamW's first step moves a parameter by lr * g / (|g| + eps): by lr * lr_mult
    // for QK-norm's parameters (their gradients are far above eps), on both backends.
    auto steps = train_both(twins, cfg, 1, /*accum=*/1);
    twins.cpu->get_params(p_cpu);
    twins.gpu->get_params(p_gpu);
    for (int t = 0; t < P_COUNT; ++t) {
      if (!ParamLayout::qk_norm_param(t) || lay.size[t] == 0) continue;
      for (const auto* p : {&p_cpu, &p_gpu}) {
        INFO("tensor " << ParamLayout::name(t) << (p == &p_cpu ? " cpu" : " cuda"));
        double max_step = 0, mean_step = 0;
        for (size_t e = lay.offset[t]; e < lay.offset[t] + lay.size[t]; ++e) {
          const double step = std::abs(static_cast<double>((*p)[e]) - init[e]);
          max_step = std::max(max_step, step);
          mean_step += step / static_cast<double>(lay.size[t]);
        }
        std::printf("qk_norm=%s %-8s %s first step max %.4e mean %.4e (lr * lr_mult %.1e)\n",
                    to_string(form), ParamLayout::name(t), p == &p_cpu ? "cpu " : "cuda", max_step,
                    mean_step, kLr * mult);
        CHECK(max_step <= kLr * mult * (1 + 1e-3));
        CHECK(mean_step >= 0.9 * kLr * mult);
      }
    }
    const auto more = train_both(twins, cfg, 19, /*accum=*/1, /*first_step=*/2);
    steps.insert(steps.end(), more.begin(), more.end());
    for (size_t i = 0; i < steps.size(); ++i) {
      INFO("step " << i + 1);
      CHECK(std::abs(steps[i].loss[0] - steps[i].loss[1]) < kLossTol);
    }
    // After 20 steps both backends hold about the same QK-norm parameters.
    twins.cpu->get_params(p_cpu);
    twins.gpu->get_params(p_gpu);
    for (int t = 0; t < P_COUNT; ++t) {
      if (!ParamLayout::qk_norm_param(t) || lay.size[t] == 0) continue;
      INFO("tensor " << ParamLayout::name(t));
      const double err = tensor_rel_l2(p_gpu, p_cpu, lay.offset[t], lay.size[t]);
      std::printf("qk_norm=%s %-8s after 20 steps cuda vs cpu rel L2 %.2e\n", to_string(form),
                  ParamLayout::name(t), err);
      CHECK(err < kGradTol);
    }
  }
}

TEST_CASE("CUDA model: diagnostics match the CPU backend and leave the gradients alone",
          "[model]") {
  const Config cfg = small_config(QkNormForm::gain);
  Twins twins = make_twins(cfg);
  auto& cpu = twins.cpu;
  auto& gpu = twins.gpu;
  const int B = 2, T = cfg.model.seq_len;  // a probe batch smaller than the micro-batch
  std::vector<int32_t> in, tg;
  make_batch(cfg.train.micro_batch, T, cfg.model.vocab, in, tg);
  gpu->zero_grad();
  gpu->forward_backward(in.data(), tg.data(), cfg.train.micro_batch, T, 1.0f);
  std::vector<float> before, after;
  gpu->get_grads(before);

  make_batch(B, T, cfg.model.vocab, in, tg);
  const auto d_cpu = cpu->diagnostics(in.data(), tg.data(), B, T);
  const auto d_gpu = gpu->diagnostics(in.data(), tg.data(), B, T);
  gpu->get_grads(after);
  CHECK(rel_l2(after, before) == 0.0);
  REQUIRE(d_gpu.size() == d_cpu.size());
  for (size_t l = 0; l < d_cpu.size(); ++l) {
    INFO("layer " << l);
    CHECK(d_gpu[l].layer == d_cpu[l].layer);
    CHECK(d_gpu[l].compared == d_cpu[l].compared);
    CHECK(std::abs(d_gpu[l].q_rms - d_cpu[l].q_rms) / d_cpu[l].q_rms < kGradTol);
    CHECK(std::abs(d_gpu[l].k_rms - d_cpu[l].k_rms) / d_cpu[l].k_rms < kGradTol);
    CHECK(std::abs(d_gpu[l].max_abs_score - d_cpu[l].max_abs_score) / d_cpu[l].max_abs_score <
          kGradTol);
  }
}

TEST_CASE("CUDA model with sage trains like the CPU backend: the defaults, and with the K-interval softmax "
          "block (fwm, nearest, prob STE, K = 16)",
          "[model][sage][sage-kinterval]") {
  KIntervalOptions k;
  k.K = 16, k.calibration = Calibration::fwm, k.rounding = Rounding::nearest, k.ste = Ste::prob;
  for (const bool with_block : {false, true}) {
    INFO("softmax block: " << (with_block ? "kinterval" : "none"));
    Config cfg = small_config();
    cfg.model.seq_len = 128;  // two 64-row quantisation blocks
    cfg.attention.kind = AttentionKind::sage;
    if (with_block) cfg.attention.sage.softmax = k;
    // Two layers, each with its own saved buffer of quantised Q, K, V (that
    // they stay apart is checked bit for bit at the API level, "sage: each
    // layer's backward reads its own saved buffer", test_attention_sage.cpp).
    Twins twins = make_twins(cfg);
    const auto steps = train_both(twins, cfg, 5, /*accum=*/1);
    for (size_t i = 0; i < steps.size(); ++i) {
      INFO("step " << i + 1);
      // The CPU backend quantises fp32 activations, the GPU bf16 ones; the int8
      // and grid levels that differ still leave the norm within the gradient
      // tolerance (with the block, this test has measured <= 2.1e-3 relative).
      CHECK(std::abs(steps[i].loss[0] - steps[i].loss[1]) < kLossTol);
      CHECK(std::abs(steps[i].norm[1] - steps[i].norm[0]) / steps[i].norm[0] < kGradTol);
    }
  }
}

TEST_CASE("CUDA model with a different attention kind per layer (fpa, sage, kinterval) trains like the CPU "
          "backend, and its diagnostics name each layer's kind",
          "[model][layers]") {
  Config cfg = small_config();
  cfg.model.layers = 3;
  cfg.model.seq_len = 128;  // two 64-row quantisation blocks for sage
  // Layer 0 runs the global FPA; layers 1 and 2 each keep statistics and saved
  // buffers of their own kind's size, and share the largest workspace.
  AttentionConfig sage, kinterval;
  sage.kind = AttentionKind::sage;
  kinterval.kind = AttentionKind::kinterval;
  cfg.attention_layers = {{"1", 1, 1, sage}, {"2", 2, 2, kinterval}};
  Twins twins = make_twins(cfg);
  const auto steps = train_both(twins, cfg, 5, /*accum=*/2);
  for (size_t i = 0; i < steps.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(std::abs(steps[i].loss[0] - steps[i].loss[1]) < kLossTol);
    CHECK(std::abs(steps[i].norm[1] - steps[i].norm[0]) / steps[i].norm[0] < kGradTol);
  }
  std::vector<int32_t> in, tg;
  make_batch(2, cfg.model.seq_len, cfg.model.vocab, in, tg);
  const auto d_cpu = twins.cpu->diagnostics(in.data(), tg.data(), 2, cfg.model.seq_len);
  const auto d_gpu = twins.gpu->diagnostics(in.data(), tg.data(), 2, cfg.model.seq_len);
  REQUIRE(d_gpu.size() == 3);
  const AttentionKind want[3] = {AttentionKind::fpa, AttentionKind::sage, AttentionKind::kinterval};
  for (int l = 0; l < 3; ++l) {
    INFO("layer " << l);
    CHECK(d_gpu[l].kind == want[l]);
    CHECK(d_cpu[l].kind == want[l]);
    CHECK(d_gpu[l].compared == (l > 0));
    CHECK(std::abs(d_gpu[l].q_rms - d_cpu[l].q_rms) / d_cpu[l].q_rms < kGradTol);
  }
}
