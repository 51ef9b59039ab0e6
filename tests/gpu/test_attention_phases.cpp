// The launches `qattn bench attention --phases` times (phases.cuh): through the
// attention API, as the bench calls it, every kind names each of its launches
// in launch order, with its work where the launcher knows it, and a call timed
// so computes the same outputs, bit for bit, as one not timed. No times are
// checked.
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "attention/attention.cuh"
#include "attention/phases.cuh"
#include "attention_harness.hpp"

namespace {

using namespace qattn;
using namespace qattn::test;
using Names = std::vector<std::string>;

struct PhaseCase {
  AttentionConfig cfg;
  AttentionShape s;
  Names forward, backward;  // the launches of each call, in order
};

// Sage's pre-pass: the key sums and μ_K with smooth_k, then the one quantise
// launch, then smooth_q's bias.
Names sage_forward_names(const SageOptions& o) {
  Names names;
  if (o.smooth_k) names = {"key_block_sums", "key_mean"};
  names.push_back("quantise_qkv");
  if (o.smooth_q) names.push_back("query_bias");
  names.push_back("forward");
  return names;
}
const Names kSageBackward = {"quantise_dout", "dq", "dkdv"};

std::vector<PhaseCase> phase_cases() {
  const bool hopper = wgmma_available();
  const AttentionShape d64{2, 3, 200, 64}, d128{1, 2, 130, 128};
  std::vector<PhaseCase> cases;
  for (const AttentionShape& s : {d64, d128})
    cases.push_back({AttentionConfig{}, s, {"forward"}, {"delta", "dkdv+dq"}});
  SageOptions smooth_q;
  smooth_q.smooth_q = true;
  SageOptions neither;
  neither.smooth_k = false;
  for (const SageOptions& o : {SageOptions{}, smooth_q, neither})
    for (const AttentionShape& s : {d64, d128})
      cases.push_back({sage_config(o), s, sage_forward_names(o), kSageBackward});
  KIntervalOptions prob;
  prob.rounding = Rounding::nearest;
  prob.ste = Ste::prob;
  cases.push_back({composed_config(prob), d64, sage_forward_names({}), kSageBackward});
  if (hopper) {  // fp8 runs on the wgmma kernels alone
    SageOptions fp8;
    for (Precision* p : {&fp8.precision.qk, &fp8.precision.pv, &fp8.precision.dp, &fp8.precision.dv,
                         &fp8.precision.dq, &fp8.precision.dk})
      *p = Precision::fp8;
    for (const AttentionShape& s : {d64, d128})
      cases.push_back({sage_config(fp8), s, sage_forward_names(fp8), kSageBackward});
  }
  // K-interval (kinterval.cu, backward): lerp's own dQ pass makes δ at d = 64;
  // the probability STE and detached extrema run dK/dV and dQ in one launch on
  // wgmma, the probability STE's dQ being FPA's elsewhere.
  const KIntervalOptions lerp;
  KIntervalOptions detached;
  detached.detach_extrema = true;
  cases.push_back({kinterval_config(lerp), d64, {"forward"}, {"dq", "dkdv"}});
  cases.push_back({kinterval_config(lerp), d128, {"forward"}, {"delta", "dq", "dkdv"}});
  cases.push_back({kinterval_config(prob),
                   d64,
                   {"forward"},
                   hopper ? Names{"delta", "dkdv+dq"} : Names{"delta", "dq", "dkdv"}});
  cases.push_back({kinterval_config(detached),
                   d64,
                   {"forward"},
                   hopper ? Names{"delta", "dkdv+dq"} : Names{"dq", "dkdv"}});
  return cases;
}

Names names_of(const std::vector<cuda::TimedPhase>& phases) {
  Names names;
  for (const cuda::TimedPhase& p : phases) names.push_back(p.name);
  return names;
}

bool same_bits(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16)) == 0;
}

}  // namespace

TEST_CASE("bench --phases: each kind's launches named in order, the outputs unchanged",
          "[phases]") {
  const std::vector<PhaseCase> cases = phase_cases();
  for (size_t i = 0; i < cases.size(); ++i) {
    const PhaseCase& c = cases[i];
    INFO(describe(c.cfg, c.s));
    std::mt19937_64 gen = item_rng(i);
    const std::vector<bf16> qkv = normal_qkv(c.s, 1.0f, 1.0f, 0.5f, gen),
                            dout = normal_heads(c.s, gen);
    AttentionBuffers timed(c.cfg, c.s, qkv, dout), plain(c.cfg, c.s, qkv, dout);
    cuda::PhaseRecorder fwd, bwd;
    auto run = [&](AttentionBuffers& b, cuda::PhaseRecorder* f, cuda::PhaseRecorder* g) {
      cuda::attention_forward(c.cfg, c.s, b.qkv.get(), b.o.get(), b.stats.get(), b.saved.get(),
                              nullptr, f);
      cuda::attention_backward(c.cfg, c.s, b.qkv.get(), b.o.get(), b.dout.get(), b.stats.get(),
                               b.saved.get(), b.dqkv.get(), b.work.get(), nullptr, g);
    };
    run(timed, &fwd, &bwd);
    run(plain, nullptr, nullptr);
    const std::vector<cuda::TimedPhase> f = fwd.take(), g = bwd.take();
    CHECK(names_of(f) == c.forward);
    CHECK(names_of(g) == c.backward);
    // The pre-passes' bytes; FPA's and sage's products (K-interval's own
    // kernels leave theirs uncounted).
    for (const auto* phases : {&f, &g})
      for (const cuda::TimedPhase& p : *phases) {
        INFO(p.name);
        CHECK(p.ms >= 0.0f);
        const bool product =
            p.name == "forward" || p.name == "dq" || p.name == "dkdv" || p.name == "dkdv+dq";
        if (!product) CHECK(p.work.bytes > 0);
        if (product && c.cfg.kind != AttentionKind::kinterval) CHECK(p.work.flops > 0);
      }
    CHECK(fwd.take().empty());  // take() hands each phase over once
    CHECK(same_bits(timed.o.download(), plain.o.download()));
    CHECK(same_bits(timed.dqkv.download(), plain.dqkv.download()));
  }
}

TEST_CASE("PhaseRecorder: one phase is one launch", "[phases]") {
  cuda::PhaseRecorder r;
  CHECK_THROWS_WITH(r.end(nullptr), "PhaseRecorder: end() with no phase begun");
  r.begin("a", {}, nullptr);
  CHECK_THROWS_WITH(r.begin("b", {}, nullptr), "PhaseRecorder: phase 'b' begun inside phase 'a'");
  CHECK_THROWS_WITH(r.take(), "PhaseRecorder: take() inside phase 'a'");
  r.end(nullptr);
  CHECK(names_of(r.take()) == Names{"a"});
}
