// Every GPT-2 op and the whole model against finite differences, in double.
// Loss = <op(x), R> with a fixed random R, so the analytic gradient is the
// op's backward with dout = R.
#include <catch2/catch.hpp>

#include "fd.hpp"
#include "qattn/cpu/gpt2.hpp"
#include "qattn/cpu/ops.hpp"

using namespace qattn;
using namespace qattn::test;
using std::vector;

constexpr double kTol = 1e-6;

TEST_CASE("matmul gradients match finite differences", "[grad]") {
  std::mt19937_64 rng(1);
  const int N = 5, IC = 7, OC = 6;
  auto x = random_vector(N * IC, rng), w = random_vector(OC * IC, rng), b = random_vector(OC, rng);
  const auto R = random_vector(N * OC, rng);
  vector<double> out(N * OC);
  auto loss = [&] { cpu::matmul_forward(out.data(), x.data(), w.data(), b.data(), N, IC, OC); return dot(out, R); };
  vector<double> dx(N * IC, 0), dw(OC * IC, 0), db(OC, 0);
  cpu::matmul_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), N, IC, OC);
  CHECK(relative_error(dx, numeric_gradient(x, loss)) < kTol);
  CHECK(relative_error(dw, numeric_gradient(w, loss)) < kTol);
  CHECK(relative_error(db, numeric_gradient(b, loss)) < kTol);
}

TEST_CASE("layernorm gradients match finite differences", "[grad]") {
  std::mt19937_64 rng(2);
  const int N = 4, C = 9;
  auto x = random_vector(N * C, rng, 2.0), w = random_vector(C, rng), b = random_vector(C, rng);
  const auto R = random_vector(N * C, rng);
  vector<double> out(N * C), mean(N), rstd(N);
  auto loss = [&] { cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C); return dot(out, R); };
  loss();
  vector<double> dx(N * C, 0), dw(C, 0), db(C, 0);
  cpu::layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  CHECK(relative_error(dx, numeric_gradient(x, loss)) < kTol);
  CHECK(relative_error(dw, numeric_gradient(w, loss)) < kTol);
  CHECK(relative_error(db, numeric_gradient(b, loss)) < kTol);
}

TEST_CASE("gelu gradient matches finite differences", "[grad]") {
  std::mt19937_64 rng(3);
  auto x = random_vector(50, rng, 2.0);
  const auto R = random_vector(50, rng);
  vector<double> out(50);
  auto loss = [&] { cpu::gelu_forward(out.data(), x.data(), 50); return dot(out, R); };
  vector<double> dx(50, 0);
  cpu::gelu_backward(dx.data(), x.data(), R.data(), 50);
  CHECK(relative_error(dx, numeric_gradient(x, loss)) < kTol);
}

TEST_CASE("QK-norm gradients match finite differences", "[grad]") {
  std::mt19937_64 rng(4);
  const int rows = 6, d = 8;
  auto x = random_vector(rows * d, rng, 3.0), g = random_vector(d, rng);
  const auto R = random_vector(rows * d, rng);
  vector<double> out(rows * d), rrms(rows);
  auto loss = [&] { cpu::qk_norm_forward(out.data(), rrms.data(), x.data(), g.data(), rows, d); return dot(out, R); };
  loss();
  vector<double> dx(rows * d, 0), dg(d, 0);
  cpu::qk_norm_backward(dx.data(), dg.data(), R.data(), x.data(), g.data(), rrms.data(), rows, d);
  CHECK(relative_error(dx, numeric_gradient(x, loss)) < kTol);
  CHECK(relative_error(dg, numeric_gradient(g, loss)) < kTol);
}

TEST_CASE("QK-norm logit-scale gradients match finite differences", "[grad]") {
  std::mt19937_64 rng(8);
  const int B = 2, H = 2, T = 3, d = 8, n = B * H * T * d;
  auto q = random_vector(n, rng, 3.0), k = random_vector(n, rng, 0.5), g = random_vector(H, rng, 4.0);
  const auto Rq = random_vector(n, rng), Rk = random_vector(n, rng);
  vector<double> q_out(n), k_out(n), q_rrms(B * H * T), k_rrms(B * H * T);
  auto loss = [&] {
    cpu::qk_logit_scale_forward(q_out.data(), k_out.data(), q_rrms.data(), k_rrms.data(), q.data(), k.data(),
                                g.data(), B, H, T, d);
    return dot(q_out, Rq) + dot(k_out, Rk);
  };
  loss();
  vector<double> dq(n, 0), dk(n, 0), dg(H, 0);
  cpu::qk_logit_scale_backward(dq.data(), dk.data(), dg.data(), Rq.data(), Rk.data(), q.data(), k.data(),
                               g.data(), q_rrms.data(), k_rrms.data(), B, H, T, d);
  CHECK(relative_error(dq, numeric_gradient(q, loss)) < kTol);
  CHECK(relative_error(dk, numeric_gradient(k, loss)) < kTol);
  CHECK(relative_error(dg, numeric_gradient(g, loss)) < kTol);
}

TEST_CASE("encoder gradients match finite differences (repeated token ids)", "[grad]") {
  std::mt19937_64 rng(5);
  const int B = 2, T = 3, C = 4, V = 5;
  const vector<int32_t> inp = {1, 3, 1, 4, 1, 0};
  auto wte = random_vector(V * C, rng), wpe = random_vector(T * C, rng);
  const auto R = random_vector(B * T * C, rng);
  vector<double> out(B * T * C);
  auto loss = [&] { cpu::encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C); return dot(out, R); };
  vector<double> dwte(V * C, 0), dwpe(T * C, 0);
  cpu::encoder_backward(dwte.data(), dwpe.data(), R.data(), inp.data(), B, T, C);
  CHECK(relative_error(dwte, numeric_gradient(wte, loss)) < kTol);
  CHECK(relative_error(dwpe, numeric_gradient(wpe, loss)) < kTol);
}

TEST_CASE("cross-entropy gradient matches finite differences", "[grad]") {
  std::mt19937_64 rng(6);
  const int N = 4, V = 7;
  auto z = random_vector(N * V, rng, 2.0);
  const vector<int32_t> tg = {0, 6, 3, 3};
  vector<double> losses(N);
  auto loss = [&] { return cpu::crossentropy_forward(losses.data(), z.data(), tg.data(), N, V); };
  vector<double> dz(N * V);
  cpu::crossentropy_backward(dz.data(), z.data(), tg.data(), 1.0 / N, N, V);
  CHECK(relative_error(dz, numeric_gradient(z, loss)) < kTol);
}

TEST_CASE("whole GPT-2 gradient matches finite differences", "[grad]") {
  for (const QkNormForm form : {QkNormForm::off, QkNormForm::gain, QkNormForm::logit_scale}) {
    DYNAMIC_SECTION("qk_norm " << to_string(form)) {
      ModelConfig m;
      m.vocab = 11, m.layers = 2, m.heads = 2, m.dim = 8, m.seq_len = 5;
      m.qk_norm.form = form;
      m.qk_norm.logit_scale_init = 0.3;  // times 10 below: scores up to about 3, softmax not saturated
      cpu::Gpt2<double> model(m, AttentionConfig{});
      std::vector<float> init;
      init_params(m, 42, init);
      std::mt19937_64 rng(7);
      std::normal_distribution<double> jitter(0.0, 0.3);  // away from init symmetry (unit gains)
      for (size_t i = 0; i < init.size(); ++i) model.params[i] = init[i] * 10 + jitter(rng);
      const int B = 2, T = 5;
      const vector<int32_t> in = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, tg = {2, 3, 4, 5, 6, 7, 8, 9, 10, 0};
      model.forward(in.data(), tg.data(), B, T);
      model.backward(1.0);
      const vector<double> analytic = model.grads;
      auto loss = [&] { return model.forward(in.data(), tg.data(), B, T); };
      const auto numeric = numeric_gradient(model.params, loss);
      const ParamLayout& lay = model.layout();
      for (int p = 0; p < P_COUNT; ++p) {
        if (lay.size[p] == 0) continue;
        vector<double> a(analytic.begin() + lay.offset[p], analytic.begin() + lay.offset[p] + lay.size[p]);
        vector<double> n(numeric.begin() + lay.offset[p], numeric.begin() + lay.offset[p] + lay.size[p]);
        INFO("tensor " << ParamLayout::name(p));
        CHECK(relative_error(a, n) < kTol);
      }
    }
  }
}
