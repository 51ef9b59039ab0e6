// Every CUDA kernel (and cuBLASLt epilogue) of the model against the CPU
// reference ops, on fresh random inputs each run. Pure outputs are poisoned
// (NaN) before the launch; accumulated outputs start from random values so that
// "+=" is checked too. The CPU reference runs on the bf16-rounded inputs the
// GPU sees, so the tolerances below measure the GPU's own rounding:
//   bf16 outputs: relative L2 <= 1e-2; fp32 outputs of bf16 inputs: <= 1e-4.
#include <tuple>

#include "adamw.cuh"
#include "classifier.cuh"
#include "column_sum.cuh"
#include "encoder.cuh"
#include "global_norm.cuh"
#include "gpu_test_util.hpp"
#include "layernorm.cuh"
#include "qattn/cpu/ops.hpp"
#include "qattn/optimizer.hpp"
#include "qk_norm.cuh"
#include "../../src/cuda/cublaslt.hpp"  // host-side header of the CUDA backend

using namespace qattn;
using namespace qattn::test;

namespace {
constexpr double kBf16Tol = 1e-2;  // bf16 output of fp32 arithmetic
constexpr double kF32Tol = 1e-4;   // fp32 output (accumulated in a different order)
}  // namespace

TEST_CASE("encoder forward and backward match the CPU", "[kernels]") {
  const int B = 3, T = 37, C = 192, V = 301;
  const auto tokens = random_tokens(B * T, V);
  const auto wte = round_bf16(randn(V * C)), wpe = round_bf16(randn(T * C));
  DeviceBuffer<int32_t> d_tok(B * T);
  DeviceBuffer<bf16> d_wte(V * C), d_wpe(T * C), d_out(B * T * C);
  d_tok.upload(tokens);
  d_wte.upload(to_bf16(wte));
  d_wpe.upload(to_bf16(wpe));
  d_out.poison();
  cuda::encoder_forward(d_out.get(), d_tok.get(), d_wte.get(), d_wpe.get(), B, T, C, nullptr);
  std::vector<float> ref(B * T * C);
  cpu::encoder_forward(ref.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  CHECK(rel_l2(to_float(d_out.download()), ref) < kBf16Tol);

  // Backward through host-built buckets, as the backend builds them.
  const auto dout = round_bf16(randn(B * T * C));
  auto dwte = randn(V * C), dwpe = randn(T * C);
  std::vector<int32_t> token, start, position;
  for (int tok = 0; tok < V; ++tok) {
    const size_t before = position.size();
    for (int i = 0; i < B * T; ++i)
      if (tokens[i] == tok) position.push_back(i);
    if (position.size() > before) {
      token.push_back(tok);
      start.push_back(static_cast<int32_t>(before));
    }
  }
  start.push_back(B * T);
  DeviceBuffer<int32_t> d_token(token.size()), d_start(start.size()), d_pos(position.size());
  d_token.upload(token);
  d_start.upload(start);
  d_pos.upload(position);
  DeviceBuffer<bf16> d_dout(B * T * C);
  DeviceBuffer<float> d_dwte(V * C), d_dwpe(T * C);
  d_dout.upload(to_bf16(dout));
  d_dwte.upload(dwte);
  d_dwpe.upload(dwpe);
  const cuda::TokenBuckets buckets{static_cast<int>(token.size()), d_token.get(), d_start.get(),
                                   d_pos.get()};
  cuda::encoder_backward(d_dwte.get(), d_dwpe.get(), d_dout.get(), buckets, B, T, C, nullptr);
  cpu::encoder_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  CHECK(rel_l2(d_dwte.download(), dwte) < 1e-6);
  CHECK(rel_l2(d_dwpe.download(), dwpe) < 1e-6);
}

TEST_CASE("layernorm forward and backward match the CPU", "[kernels]") {
  for (const int C : {128, 768, 1000}) {  // 1000: lanes with a partial last vector
    const int N = 777;
    INFO("C = " << C);
    const auto x = round_bf16(randn(N * C, 2.0f, 0.5f));
    const auto w = round_bf16(randn(C, 0.3f, 1.0f)), b = round_bf16(randn(C, 0.3f));
    DeviceBuffer<bf16> d_x(N * C), d_w(C), d_b(C), d_out(N * C);
    DeviceBuffer<float> d_mean(N), d_rstd(N);
    d_x.upload(to_bf16(x));
    d_w.upload(to_bf16(w));
    d_b.upload(to_bf16(b));
    d_out.poison();
    d_mean.poison();
    d_rstd.poison();
    cuda::layernorm_forward(d_out.get(), d_mean.get(), d_rstd.get(), d_x.get(), d_w.get(),
                            d_b.get(), N, C, nullptr);
    std::vector<float> out(N * C), mean(N), rstd(N);
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    CHECK(rel_l2(to_float(d_out.download()), out) < kBf16Tol);
    CHECK(rel_l2(d_mean.download(), mean) < kF32Tol);
    CHECK(rel_l2(d_rstd.download(), rstd) < kF32Tol);

    const auto dout = round_bf16(randn(N * C));
    const auto dinp0 = round_bf16(randn(N * C));
    auto dinp = dinp0, dw = randn(C), db = randn(C);
    DeviceBuffer<bf16> d_dout(N * C), d_dinp(N * C);
    DeviceBuffer<float> d_dw(C), d_db(C),
        d_scratch(cuda::layernorm_backward_scratch_floats(N, C));
    d_dout.upload(to_bf16(dout));
    d_dinp.upload(to_bf16(dinp0));
    d_dw.upload(dw);
    d_db.upload(db);
    cuda::layernorm_backward(d_dinp.get(), d_dw.get(), d_db.get(), d_dout.get(), d_x.get(),
                             d_w.get(), d_mean.get(), d_rstd.get(), N, C, d_scratch.get(), nullptr);
    cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                            mean.data(), rstd.data(), N, C);
    // The added part alone, so the check is not diluted by the starting values.
    const auto got = to_float(d_dinp.download());
    std::vector<float> got_delta(N * C), ref_delta(N * C);
    for (int i = 0; i < N * C; ++i) {
      got_delta[i] = got[i] - dinp0[i];
      ref_delta[i] = dinp[i] - dinp0[i];
    }
    CHECK(rel_l2(got_delta, ref_delta) < 2 * kBf16Tol);  // two bf16 roundings: += and the store
    CHECK(rel_l2(d_dw.download(), dw) < kF32Tol);
    CHECK(rel_l2(d_db.download(), db) < kF32Tol);
  }
}

TEST_CASE("cuBLASLt matmuls and their epilogues match the CPU", "[kernels]") {
  const int N = 384, IC = 192, OC = 320;
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  {
    cuda::Matmuls mm(stream);
    const auto inp = round_bf16(randn(N * IC)), w = round_bf16(randn(OC * IC, 0.1f));
    const auto bias = round_bf16(randn(OC)), residual = round_bf16(randn(N * OC));
    DeviceBuffer<bf16> d_inp(N * IC), d_w(OC * IC), d_bias(OC), d_res(N * OC), d_out(N * OC),
        d_pre(N * OC);
    d_inp.upload(to_bf16(inp));
    d_w.upload(to_bf16(w));
    d_bias.upload(to_bf16(bias));
    d_res.upload(to_bf16(residual));
    std::vector<float> pre(N * OC), ref(N * OC);
    cpu::matmul_forward(pre.data(), inp.data(), w.data(), bias.data(), N, IC, OC);

    SECTION("bias + residual through C") {
      d_out.poison();
      mm.forward(d_out.get(), d_inp.get(), d_w.get(), d_bias.get(), d_res.get(), N, IC, OC);
      cpu::residual_forward(ref.data(), pre.data(), residual.data(), ref.size());
      CHECK(rel_l2(to_float(d_out.download()), ref) < kBf16Tol);
    }
    SECTION("no bias (the tied head)") {
      d_out.poison();
      mm.forward(d_out.get(), d_inp.get(), d_w.get(), nullptr, nullptr, N, IC, OC);
      cpu::matmul_forward(ref.data(), inp.data(), w.data(), static_cast<const float*>(nullptr), N,
                          IC, OC);
      CHECK(rel_l2(to_float(d_out.download()), ref) < kBf16Tol);
    }
    SECTION("bias + GELU, pre-activation saved") {
      d_out.poison();
      d_pre.poison();
      mm.forward_gelu(d_out.get(), d_pre.get(), d_inp.get(), d_w.get(), d_bias.get(), N, IC, OC);
      cpu::gelu_forward(ref.data(), pre.data(), pre.size());
      CHECK(rel_l2(to_float(d_pre.download()), pre) < kBf16Tol);
      CHECK(rel_l2(to_float(d_out.download()), ref) < kBf16Tol);
    }
    SECTION("backward: input gradient (plain and through GELU'), weight gradient, bias") {
      const auto dout = round_bf16(randn(N * OC));
      const auto pre_in = round_bf16(randn(N * IC));  // GELU input of the IC side
      DeviceBuffer<bf16> d_dout(N * OC), d_dinp(N * IC), d_pre_in(N * IC);
      d_dout.upload(to_bf16(dout));
      d_pre_in.upload(to_bf16(pre_in));
      std::vector<float> dinp(N * IC, 0.0f), unused_dw(OC * IC, 0.0f);
      cpu::matmul_backward(dinp.data(), unused_dw.data(), static_cast<float*>(nullptr),
                           dout.data(), inp.data(), w.data(), N, IC, OC);

      d_dinp.poison();
      mm.backward_input(d_dinp.get(), d_dout.get(), d_w.get(), nullptr, N, IC, OC);
      CHECK(rel_l2(to_float(d_dinp.download()), dinp) < kBf16Tol);

      d_dinp.poison();
      mm.backward_input(d_dinp.get(), d_dout.get(), d_w.get(), d_pre_in.get(), N, IC, OC);
      std::vector<float> dgelu(N * IC, 0.0f);
      cpu::gelu_backward(dgelu.data(), pre_in.data(), dinp.data(), dgelu.size());
      CHECK(rel_l2(to_float(d_dinp.download()), dgelu) < kBf16Tol);

      // The bias gradient from the matmul's epilogue, and from column_sum's
      // kernels (what backward_weight falls back to without the epilogue).
      for (const bool epilogue : {true, false}) {
        INFO("bias gradient from the epilogue: " << epilogue);
        auto dw = randn(OC * IC), dbias = randn(OC);
        DeviceBuffer<float> d_dw(OC * IC), d_dbias(OC),
            d_scratch(cuda::bias_backward_scratch_floats(N, OC));
        d_dw.upload(dw);
        d_dbias.upload(dbias);
        if (epilogue) {
          mm.backward_weight(d_dw.get(), d_dbias.get(), d_dout.get(), d_inp.get(), N, IC, OC,
                             d_scratch.get());
        } else {
          mm.backward_weight(d_dw.get(), nullptr, d_dout.get(), d_inp.get(), N, IC, OC, nullptr);
          cuda::bias_backward(d_dbias.get(), d_dout.get(), N, OC, d_scratch.get(), stream);
        }
        std::vector<float> unused_dinp(N * IC, 0.0f);
        cpu::matmul_backward(unused_dinp.data(), dw.data(), dbias.data(), dout.data(), inp.data(),
                             w.data(), N, IC, OC);
        CHECK(rel_l2(d_dw.download(), dw) < kF32Tol);
        CHECK(rel_l2(d_dbias.download(), dbias) < kF32Tol);
      }
    }
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST_CASE("fused classifier matches softmax cross-entropy on the CPU", "[kernels]") {
  // A small vocab (one sweep of the block), GPT-2's, a larger one, and one
  // whose rows (300 KB) exceed shared memory: the gradient pass then reads
  // global memory twice instead of a shared-memory copy.
  const auto [N, V, Vp] = GENERATE(std::tuple{67, 1001, 1024}, std::tuple{37, 50257, 50304},
                                   std::tuple{3, 60001, 60008}, std::tuple{2, 150001, 150008});
  const bool row_in_shared = Vp * 2 <= cuda::classifier_shared_row_limit();
  INFO("N = " << N << ", V = " << V << ", Vp = " << Vp
                << ", row in shared memory: " << row_in_shared);
  CHECK(row_in_shared == (Vp < 100000));  // the cases cover both paths
  const float dloss = 1.0f / N;
  const auto logits_real = round_bf16(randn(N * V, 3.0f));
  const auto targets = random_tokens(N, V);
  std::vector<float> padded(N * Vp, 1e4f);  // huge padded logits must be ignored
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < V; ++v) padded[n * Vp + v] = logits_real[n * V + v];
  padded = round_bf16(padded);
  DeviceBuffer<bf16> d_logits(N * Vp);
  DeviceBuffer<int32_t> d_targets(N);
  DeviceBuffer<float> d_losses(N);
  d_targets.upload(targets);
  std::vector<float> losses(N), dlogits(N * V);
  cpu::crossentropy_forward(losses.data(), logits_real.data(), targets.data(), N, V);
  cpu::crossentropy_backward(dlogits.data(), logits_real.data(), targets.data(), dloss, N, V);

  for (const bool write_grad : {false, true}) {
    INFO("write_grad = " << write_grad);
    d_logits.upload(to_bf16(padded));
    d_losses.poison();
    cuda::classifier_forward_backward(d_logits.get(), d_losses.get(), d_targets.get(), N, V, Vp,
                                      dloss, write_grad, nullptr);
    CHECK(rel_l2(d_losses.download(), losses) < kF32Tol);
    const auto out = to_float(d_logits.download());
    if (!write_grad) {
      CHECK(rel_l2(out, padded) == 0.0);  // forward only: logits untouched
      continue;
    }
    std::vector<float> got(N * V);
    bool padded_zero = true;
    for (int n = 0; n < N; ++n)
      for (int v = 0; v < Vp; ++v) {
        if (v < V) got[n * V + v] = out[n * Vp + v];
        else padded_zero = padded_zero && out[n * Vp + v] == 0.0f;
      }
    CHECK(padded_zero);
    CHECK(rel_l2(got, dlogits) < kBf16Tol);
  }
}

TEST_CASE("AdamW matches the CPU update and writes the bf16 copy", "[kernels]") {
  const size_t n = 100003;
  const AdamWHyper h{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};
  const float grad_mult = 0.7f;
  const int64_t t = 5;
  auto master = randn(n), m = randn(n, 0.01f), grads = randn(n, 0.1f);
  auto v = randn(n, 0.01f);
  for (auto& x : v) x = x * x;
  DeviceBuffer<float> d_master(n), d_m(n), d_v(n), d_g(n);
  DeviceBuffer<bf16> d_params(n);
  d_master.upload(master);
  d_m.upload(m);
  d_v.upload(v);
  d_g.upload(grads);
  d_params.poison();
  const cuda::AdamWArgs a{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, grad_mult,
                          1.0f - std::pow(h.beta1, static_cast<float>(t)),
                          1.0f - std::pow(h.beta2, static_cast<float>(t))};
  cuda::adamw_update(d_params.get(), d_master.get(), d_m.get(), d_v.get(), d_g.get(), n, a,
                     nullptr);
  adamw_update(master.data(), grads.data(), m.data(), v.data(), n, h, true, grad_mult, t);
  const auto got_master = d_master.download();
  CHECK(rel_l2(got_master, master) < 1e-6);
  CHECK(rel_l2(d_m.download(), m) < 1e-6);
  CHECK(rel_l2(d_v.download(), v) < 1e-6);
  CHECK(rel_l2(to_float(d_params.download()), round_bf16(got_master)) == 0.0);
}

TEST_CASE("global grad norm: exact to fp32 rounding and bit-reproducible", "[kernels]") {
  const size_t n = 12345679;
  const auto x = randn(n, 0.01f);
  double ref = 0;
  for (float v : x) ref += static_cast<double>(v) * v;
  DeviceBuffer<float> d_x(n), d_out(1), d_scratch(cuda::global_norm_scratch_floats());
  d_x.upload(x);
  d_out.poison();
  cuda::global_norm_squared(d_out.get(), d_x.get(), n, d_scratch.get(), nullptr);
  const float first = d_out.download()[0];
  CHECK(std::abs(first - ref) / ref < 1e-5);
  cuda::global_norm_squared(d_out.get(), d_x.get(), n, d_scratch.get(), nullptr);
  CHECK(d_out.download()[0] == first);
}

namespace {
// qkv (N, 3C) <-> the rows (N*H, d) of its part (0: q, 1: k, 2: v), in (n, h) order.
std::vector<float> gather_part(const std::vector<float>& qkv, int N, int H, int d, int part) {
  const int C = H * d;
  std::vector<float> rows(static_cast<size_t>(N) * C);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) rows[n * C + c] = qkv[n * 3 * C + part * C + c];
  return rows;
}
void scatter_part(std::vector<float>& qkv, const std::vector<float>& rows, int N, int H, int d,
                  int part) {
  const int C = H * d;
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) qkv[n * 3 * C + part * C + c] = rows[n * C + c];
}
}  // namespace

// Both forms through the same checks; what differs is the CPU reference (form
// gain: qk_norm_* per part with its gains; logit_scale: qk_logit_scale_* with a
// scale per head) and the parameters it is given. Rows in (n, h) order are the
// CPU's (B, H, T, d) with B = N and T = 1.
TEST_CASE("QK-norm forward and backward on qkv match the CPU, both forms", "[kernels][qknorm]") {
  for (const QkNormForm form : {QkNormForm::gain, QkNormForm::logit_scale}) {
    for (const int d : {64, 128}) {
      const int N = 333, H = 3, C = H * d, rows = N * H;
      INFO("form " << to_string(form) << ", d = " << d);
      const bool gain = form == QkNormForm::gain;
      const auto qkv = round_bf16(randn(N * 3 * C, 2.0f));
      // gain: gains near 1; logit_scale: scales near log2(T^2 - T) for T = 1024, one negative.
      const auto gq = round_bf16(randn(d, 0.2f, 1.0f)), gk = round_bf16(randn(d, 0.2f, 1.0f));
      auto scale = round_bf16(randn(H, 3.0f, 20.0f));
      scale[1] = -scale[1];
      DeviceBuffer<bf16> d_qkv(N * 3 * C), d_raw(N * 2 * C), d_gq(d), d_gk(d), d_scale(H);
      DeviceBuffer<float> d_rrms(N * 2 * H);
      d_qkv.upload(to_bf16(qkv));
      d_gq.upload(to_bf16(gq));
      d_gk.upload(to_bf16(gk));
      d_scale.upload(to_bf16(scale));
      d_raw.poison();
      d_rrms.poison();
      cuda::QkNormParams params{form};
      if (gain)
        params.gamma_q = d_gq.get(), params.gamma_k = d_gk.get();
      else
        params.scale = d_scale.get();
      cuda::qk_norm_forward(d_qkv.get(), d_raw.get(), d_rrms.get(), params, N, H, d, nullptr);
      const auto xq = gather_part(qkv, N, H, d, 0), xk = gather_part(qkv, N, H, d, 1);
      std::vector<float> yq(rows * d), yk(rows * d), rq(rows), rk(rows);
      if (gain) {
        cpu::qk_norm_forward(yq.data(), rq.data(), xq.data(), gq.data(), rows, d);
        cpu::qk_norm_forward(yk.data(), rk.data(), xk.data(), gk.data(), rows, d);
      } else {
        cpu::qk_logit_scale_forward(yq.data(), yk.data(), rq.data(), rk.data(), xq.data(), xk.data(),
                                    scale.data(), N, H, 1, d);
      }
      std::vector<float> ref_qkv = qkv, ref_rrms(2 * rows), ref_raw(2 * rows * d);
      scatter_part(ref_qkv, yq, N, H, d, 0);
      scatter_part(ref_qkv, yk, N, H, d, 1);
      for (int n = 0; n < N; ++n)
        for (int h = 0; h < H; ++h) {  // rrms (N, 2H): q heads then k heads of each token
          ref_rrms[n * 2 * H + h] = rq[n * H + h];
          ref_rrms[n * 2 * H + H + h] = rk[n * H + h];
        }
      for (int n = 0; n < N; ++n)
        for (int c = 0; c < 2 * C; ++c) ref_raw[n * 2 * C + c] = qkv[n * 3 * C + c];
      const auto got_qkv = to_float(d_qkv.download());
      CHECK(rel_l2(gather_part(got_qkv, N, H, d, 0), yq) < kBf16Tol);
      CHECK(rel_l2(gather_part(got_qkv, N, H, d, 1), yk) < kBf16Tol);
      CHECK(rel_l2(gather_part(got_qkv, N, H, d, 2), gather_part(qkv, N, H, d, 2)) == 0.0);
      CHECK(rel_l2(d_rrms.download(), ref_rrms) < kF32Tol);
      CHECK(rel_l2(to_float(d_raw.download()), ref_raw) == 0.0);

      // Backward: the q, k parts of dqkv are replaced in place; v is untouched;
      // the parameters' gradients start from random values (+=).
      const auto dqkv = round_bf16(randn(N * 3 * C));
      auto dgq = randn(d), dgk = randn(d), dscale = randn(H);
      DeviceBuffer<bf16> d_dqkv(N * 3 * C);
      DeviceBuffer<float> d_dgq(d), d_dgk(d), d_dscale(H),
          d_scratch(cuda::qk_norm_backward_scratch_floats(form, N, H, d));
      d_dqkv.upload(to_bf16(dqkv));
      d_dgq.upload(dgq);
      d_dgk.upload(dgk);
      d_dscale.upload(dscale);
      d_scratch.poison();
      const cuda::QkNormGrads grads{d_dgq.get(), d_dgk.get(), d_dscale.get()};
      cuda::qk_norm_backward(d_dqkv.get(), grads, d_raw.get(), d_rrms.get(), params, N, H, d,
                             d_scratch.get(), nullptr);
      const auto dyq = gather_part(dqkv, N, H, d, 0), dyk = gather_part(dqkv, N, H, d, 1);
      std::vector<float> dxq(rows * d, 0.0f), dxk(rows * d, 0.0f);
      const auto dgq0 = dgq, dgk0 = dgk, dscale0 = dscale;
      if (gain) {
        cpu::qk_norm_backward(dxq.data(), dgq.data(), dyq.data(), xq.data(), gq.data(), rq.data(),
                              rows, d);
        cpu::qk_norm_backward(dxk.data(), dgk.data(), dyk.data(), xk.data(), gk.data(), rk.data(),
                              rows, d);
      } else {
        cpu::qk_logit_scale_backward(dxq.data(), dxk.data(), dscale.data(), dyq.data(), dyk.data(),
                                     xq.data(), xk.data(), scale.data(), rq.data(), rk.data(), N,
                                     H, 1, d);
      }
      std::vector<float> ref_dqkv = dqkv;
      scatter_part(ref_dqkv, dxq, N, H, d, 0);
      scatter_part(ref_dqkv, dxk, N, H, d, 1);
      const auto got_dqkv = to_float(d_dqkv.download());
      CHECK(rel_l2(gather_part(got_dqkv, N, H, d, 0), dxq) < kBf16Tol);
      CHECK(rel_l2(gather_part(got_dqkv, N, H, d, 1), dxk) < kBf16Tol);
      CHECK(rel_l2(gather_part(got_dqkv, N, H, d, 2), gather_part(dqkv, N, H, d, 2)) == 0.0);
      // The increments, so that the random start does not hide their error.
      const auto increment = [](std::vector<float> after, const std::vector<float>& before) {
        for (size_t i = 0; i < after.size(); ++i) after[i] -= before[i];
        return after;
      };
      if (gain) {
        CHECK(rel_l2(increment(d_dgq.download(), dgq0), increment(dgq, dgq0)) < kF32Tol);
        CHECK(rel_l2(increment(d_dgk.download(), dgk0), increment(dgk, dgk0)) < kF32Tol);
        CHECK(d_dscale.download() == dscale0);
      } else {
        CHECK(rel_l2(increment(d_dscale.download(), dscale0), increment(dscale, dscale0)) < kF32Tol);
        CHECK(d_dgq.download() == dgq0);
        CHECK(d_dgk.download() == dgk0);
      }
    }
  }
}
