// FPA (docs/attention-maths.md §2): gradients by finite differences in double, float against
// double, and causality (future tokens never change past outputs).
#include <catch2/catch.hpp>

#include "test_attention_common.hpp"

using namespace qattn;
using namespace qattn::test;

TEST_CASE("fpa gradient equals finite differences (double)", "[attention][fpa]") {
  for (int d : {1, 5, 8}) {
    const Head h(9, d, 1.5, 100 + d);
    const AttentionConfig cfg;  // fpa
    const Grads<double> g = run_kind<double>(cfg, h);
    const auto fd = finite_difference_grads(h, [&](const double* q, const double* k,
                                                   const double* v, double* o) {
      cpu::attention_forward(cfg, h.T, h.d, q, k, v, o);
    });
    INFO("d = " << d);
    CHECK(max_rel(concat(g.dq, g.dk, g.dv), fd) < 1e-8);
  }
}

TEST_CASE("fpa in float agrees with double", "[attention][fpa]") {
  const Head h(64, 16, 1.0, 7);
  const AttentionConfig cfg;
  const Grads<float> f = run_kind<float>(cfg, h);
  const Grads<double> r = run_kind<double>(cfg, h);
  CHECK(rel_l2(f.o, r.o) < 1e-5);
  CHECK(rel_l2(f.dq, r.dq) < 1e-5);
  CHECK(rel_l2(f.dk, r.dk) < 1e-5);
  CHECK(rel_l2(f.dv, r.dv) < 1e-5);
}

TEST_CASE("fpa is causal: changing later tokens leaves earlier outputs exactly", "[attention][fpa]") {
  const int T = 32, d = 8;
  const Head h(T, d, 1.0, 11);
  Head later = h;
  for (size_t n = (size_t)(T / 2) * d; n < h.size(); n++) {
    later.q[n] += 1.0;
    later.k[n] -= 2.0;
    later.v[n] *= 3.0;
  }
  const AttentionConfig cfg;
  const Grads<double> a = run_kind<double>(cfg, h), b = run_kind<double>(cfg, later);
  for (size_t n = 0; n < (size_t)(T / 2) * d; n++) REQUIRE(a.o[n] == b.o[n]);
}
