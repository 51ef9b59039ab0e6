// compare_to_fpa (docs/attention-maths.md §7): FPA against itself is exact; a quantised kind is
// close but not equal; max |score| is the largest visible |c q.k|.
#include <catch2/catch.hpp>

#include "test_attention_common.hpp"

using namespace qattn;
using namespace qattn::test;

TEST_CASE("compare_to_fpa", "[attention][diagnostics]") {
  const Head h(64, 16, 1.0, 71);
  const auto q = cast<float>(h.q), k = cast<float>(h.k), v = cast<float>(h.v), dout = cast<float>(h.dout);
  const auto compare = [&](const AttentionConfig& cfg) {
    return cpu::compare_to_fpa(cfg, h.T, h.d, q.data(), k.data(), v.data(), dout.data());
  };
  const cpu::AttentionComparison same = compare(AttentionConfig{});
  for (double c : {same.cos_o, same.cos_p, same.cos_ds, same.cos_dq, same.cos_dk, same.cos_dv})
    CHECK(c == Approx(1.0).margin(1e-15));
  for (double r : {same.rel_o, same.rel_p, same.rel_ds, same.rel_dq, same.rel_dk, same.rel_dv})
    CHECK(r == 0.0);

  double max_score = 0;
  for (int i = 0; i < h.T; i++)
    for (int j = 0; j <= i; j++) {
      double s = 0;
      for (int x = 0; x < h.d; x++) s += double(q[i * h.d + x]) * double(k[j * h.d + x]);
      max_score = std::max(max_score, std::abs(s) / 4.0);  // c = 1/sqrt(16)
    }
  CHECK(same.max_abs_score == Approx(max_score).epsilon(1e-12));

  AttentionConfig sage;
  sage.kind = AttentionKind::sage;
  const cpu::AttentionComparison c = compare(sage);
  for (double x : {c.cos_o, c.cos_p, c.cos_ds, c.cos_dq, c.cos_dk, c.cos_dv}) {
    CHECK(x > 0.999);
    CHECK(x < 1.0);
  }
  for (double x : {c.rel_o, c.rel_p, c.rel_ds, c.rel_dq, c.rel_dk, c.rel_dv}) {
    CHECK(x > 0.0);
    CHECK(x < 0.05);
  }
}
