// A different attention kind per layer (attention.layers): the config
// (inheritance of the global options, the effective config, every error
// naming its JSON path), the CPU model (each layer runs its own kind, the
// layers agree with the same layers computed alone, gradients by finite
// differences in fp64), and a run whose diag.csv names each layer's kind.
#include <catch2/catch.hpp>

#include "fd.hpp"
#include "qattn/checkpoint.hpp"
#include "qattn/config.hpp"
#include "qattn/cpu/attention.hpp"
#include "qattn/cpu/gpt2.hpp"
#include "qattn/sweep.hpp"
#include "run_helpers.hpp"

using namespace qattn;
using namespace qattn::test;
using nlohmann::json;

namespace {

json base(int layers) {
  return {{"model", {{"vocab", 257}, {"layers", layers}, {"heads", 2}, {"dim", 32}, {"seq_len", 16}}},
          {"data", {{"train", "a/*.bin"}, {"val", "b/*.bin"}}},
          {"train", {{"tokens_per_step", 128}, {"micro_batch", 4}, {"steps", 10}}},
          {"log", {{"name", "t"}}}};
}

// The config error text of base(6) with attention.layers = layers ("" when valid).
std::string layers_error(const json& layers) {
  json j = base(6);
  j["attention"]["layers"] = layers;
  try {
    config_from_json(j);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

AttentionConfig kinterval_lerp() {
  AttentionConfig a;
  a.kind = AttentionKind::kinterval;
  a.kinterval.K = 4;
  a.kinterval.calibration = Calibration::minmax;
  a.kinterval.rounding = Rounding::lerp;
  return a;
}

}  // namespace

TEST_CASE("attention.layers overrides the kind and options of its layers, starting from the global ones",
          "[config][layers]") {
  json j = base(6);
  j["attention"] = json::parse(R"({
    "kind": "sage", "sage": {"smooth_q": true, "softmax": {"kind": "kinterval", "K": 16}},
    "layers": {
      "0": {"kind": "fpa"},
      "1-2": {"kind": "kinterval", "kinterval": {"K": 8}},
      "3": {"sage": {"smooth_k": false}},
      "4": {"sage": {"softmax": {"kind": "exact"}}}
    }
  })");
  const Config c = config_from_json(j);
  REQUIRE(c.attention_layers.size() == 4);
  CHECK(c.attention_of(0).kind == AttentionKind::fpa);
  for (int l : {1, 2}) {
    CHECK(c.attention_of(l).kind == AttentionKind::kinterval);
    CHECK(c.attention_of(l).kinterval.K == 8);
  }
  CHECK(c.attention_of(3).kind == AttentionKind::sage);  // inherited
  CHECK_FALSE(c.attention_of(3).sage.smooth_k);
  CHECK(c.attention_of(3).sage.smooth_q);                 // inherited
  REQUIRE(c.attention_of(3).sage.softmax.has_value());
  CHECK(c.attention_of(3).sage.softmax->K == 16);         // inherited
  CHECK_FALSE(c.attention_of(4).sage.softmax.has_value()); // "exact" drops the inherited block
  CHECK(c.attention_of(5).kind == AttentionKind::sage);   // no entry: the global one
  CHECK(c.attention_of(5).sage.smooth_k);
  const auto per_layer = c.attention_per_layer();
  REQUIRE(per_layer.size() == 6);
  CHECK(per_layer[2].kind == AttentionKind::kinterval);
  CHECK(describe_attention(c) == "sage (layers 0: fpa, 1-2: kinterval, 3: sage, 4: sage)");
  CHECK(c.warnings.empty());

  // The effective config spells every entry out and reads back to the same layers.
  CHECK(c.effective["attention"]["layers"]["1-2"]["kind"] == "kinterval");
  CHECK(c.effective["attention"]["layers"]["3"]["sage"]["smooth_q"] == true);
  const Config again = config_of_checkpoint(c.effective);
  for (int l = 0; l < 6; ++l) {
    INFO("layer " << l);
    CHECK(again.attention_of(l).kind == c.attention_of(l).kind);
    CHECK(again.attention_of(l).kinterval.K == c.attention_of(l).kinterval.K);
    CHECK(again.attention_of(l).sage.smooth_k == c.attention_of(l).sage.smooth_k);
    CHECK(again.attention_of(l).sage.softmax.has_value() == c.attention_of(l).sage.softmax.has_value());
  }
  // Without the key, the effective config has none (older checkpoints compare equal).
  CHECK_FALSE(config_from_json(base(6)).effective["attention"].contains("layers"));
  CHECK(describe_attention(config_from_json(base(6))) == "fpa");
  // --set reaches an entry by its key.
  json k = base(6);
  apply_override(k, "attention.layers.2-5.kind=sage");
  CHECK(config_from_json(k).attention_of(4).kind == AttentionKind::sage);
}

TEST_CASE("attention.layers errors name the JSON path, the value and what is allowed", "[config][layers]") {
  const std::string allowed = "allowed: \"N\" or \"A-B\" with 0 <= A <= B < model.layers = 6";
  struct Case {
    json layers;
    std::string must_contain;
  };
  const std::vector<Case> cases = {
      {{{"x", {{"kind", "fpa"}}}}, "attention.layers.x: \"x\" is not a layer or a range of layers; " + allowed},
      {{{"1-", {{"kind", "fpa"}}}}, "attention.layers.1-: \"1-\" is not a layer"},
      {{{"-1", {{"kind", "fpa"}}}}, "attention.layers.-1: \"-1\" is not a layer"},
      {{{"1-2-3", {{"kind", "fpa"}}}}, "attention.layers.1-2-3: \"1-2-3\" is not a layer"},
      {{{" 1", {{"kind", "fpa"}}}}, "attention.layers. 1: \" 1\" is not a layer"},
      {{{"5-2", {{"kind", "fpa"}}}}, "attention.layers.5-2: the range is empty (5 > 2); " + allowed},
      {{{"3-9", {{"kind", "fpa"}}}}, "attention.layers.3-9: layer 9 is out of range; " + allowed},
      {{{"6", {{"kind", "fpa"}}}}, "attention.layers.6: layer 6 is out of range"},
      {{{"0-3", {{"kind", "fpa"}}}, {"3", {{"kind", "sage"}}}},
       "attention.layers.3: overlaps attention.layers.0-3 (layer 3 is in both); allowed: each layer in at most one entry"},
      // An entry inside another, with one between them that overlaps neither's neighbour.
      {{{"0-5", {{"kind", "fpa"}}}, {"1", {{"kind", "sage"}}}, {"4", {{"kind", "sage"}}}},
       "attention.layers.4: overlaps attention.layers.0-5 (layer 4 is in both)"},
      {{{"1", {{"kind", "int4"}}}}, "attention.layers.1.kind: \"int4\" is not allowed"},
      {{{"1", {{"kind", "sage"}, {"sage", {{"block_q", 48}}}}}}, "attention.layers.1.sage.block_q: 48 is not allowed"},
      {{{"1", {{"kinds", "sage"}}}}, "attention.layers.1.kinds: unknown key; allowed keys here: kind, kinterval, sage"},
      {{{"1", {{"layers", json::object()}}}}, "attention.layers.1.layers: unknown key"},
      {{{"1", "sage"}}, "attention.layers.1: \"sage\" has the wrong type; expected an object"},
      {json::array({1, 2}), "attention.layers: [1,2] has the wrong type; expected an object"},
  };
  for (const auto& c : cases) {
    INFO("attention.layers = " << c.layers.dump());
    CHECK_THAT(layers_error(c.layers), Catch::Contains(c.must_contain));
  }
  CHECK(layers_error(json::object()).empty());
  CHECK(layers_error({{"0-1", {{"kind", "sage"}}}, {"2", {{"kind", "sage"}}}, {"3-5", {{"kind", "kinterval"}}}}).empty());
  // The unknown-key message of the attention section lists "layers".
  json j = base(6);
  j["attention"]["layerz"] = json::object();
  CHECK_THROWS_WITH(config_from_json(j), Catch::Contains("allowed keys here: kind, kinterval, layers, sage"));
  // One kind only where no model is configured (qattn bench attention).
  CHECK_THROWS_WITH(attention_config_from_json({{"attention", {{"layers", {{"0", {{"kind", "sage"}}}}}}}}),
                    Catch::Contains("attention.layers: unknown key"));
}

TEST_CASE("attention.layers: options are ignored only when no layer runs their kind", "[config][layers]") {
  json j = base(6);
  j["attention"] = {{"kind", "fpa"}, {"sage", {{"smooth_q", true}}}};
  CHECK_THAT(config_from_json(j).warnings.at(0), Catch::Contains("attention.sage: ignored, attention.kind is \"fpa\""));
  j["attention"]["layers"] = {{"2", {{"kind", "sage"}}}};
  const Config c = config_from_json(j);
  CHECK(c.warnings.empty());
  CHECK(c.attention_of(2).sage.smooth_q);  // the global sage options are what layer 2 runs
  j["attention"]["layers"] = {{"2", {{"kind", "kinterval"}, {"sage", {{"smooth_k", false}}}}}};
  const auto w = config_from_json(j).warnings;
  REQUIRE(w.size() == 2);
  CHECK_THAT(w[0], Catch::Contains("attention.layers.2.sage: ignored, the kind of these layers is \"kinterval\""));
  CHECK_THAT(w[1], Catch::Contains("attention.sage: ignored, attention.kind is \"fpa\" and no attention.layers entry runs it"));
}

TEST_CASE("per-layer kinds: each layer runs its own kind and equals the same layer computed alone",
          "[layers][model]") {
  ModelConfig m;
  m.vocab = 11, m.layers = 2, m.heads = 2, m.dim = 8, m.seq_len = 6;
  std::vector<float> init;
  init_params(m, 3, init);
  std::mt19937_64 rng(4);
  std::normal_distribution<double> jitter(0.0, 0.3);  // away from init symmetry (unit gains)
  std::vector<double> params(init.size());
  for (size_t i = 0; i < init.size(); ++i) params[i] = init[i] * 10 + jitter(rng);
  const AttentionConfig fpa, kint = kinterval_lerp();
  const int B = 2, T = 6, H = 2, hd = 4;
  const std::vector<int32_t> in = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2}, tg = {2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 2, 3};
  auto model_of = [&](std::vector<AttentionConfig> kinds) {
    auto model = std::make_unique<cpu::Gpt2<double>>(m, std::move(kinds));
    model->params = params;
    model->forward(in.data(), tg.data(), B, T);
    return model;
  };
  const auto mixed = model_of({fpa, kint}), all_fpa = model_of({fpa, fpa}), all_kint = model_of({kint, kint});

  // Layer 0 and the input of layer 1 are those of the all-FPA model, bit for bit.
  const auto& io = mixed->attention_io();
  CHECK(io[0].o == all_fpa->attention_io()[0].o);
  CHECK(io[1].q == all_fpa->attention_io()[1].q);
  CHECK(io[1].v == all_fpa->attention_io()[1].v);
  // Each layer's output is its kind applied to its inputs, head by head; for
  // layer 1 the other kind gives something else.
  const std::vector<AttentionConfig> kinds = {fpa, kint};
  double other_kind = 0;
  for (int l = 0; l < 2; ++l)
    for (int bh = 0; bh < B * H; ++bh) {
      const size_t o = static_cast<size_t>(bh) * T * hd;
      std::vector<double> out(T * hd), alt(T * hd);
      cpu::attention_forward(kinds[l], T, hd, io[l].q.data() + o, io[l].k.data() + o, io[l].v.data() + o, out.data());
      CHECK(std::equal(out.begin(), out.end(), io[l].o.begin() + o));
      cpu::attention_forward(kinds[1 - l], T, hd, io[l].q.data() + o, io[l].k.data() + o, io[l].v.data() + o, alt.data());
      for (int i = 0; i < T * hd; ++i) other_kind = std::max(other_kind, std::abs(alt[i] - out[i]));
    }
  CHECK(other_kind > 1e-3);
  const double loss_mixed = mixed->forward(in.data(), tg.data(), B, T);
  CHECK(loss_mixed != all_fpa->forward(in.data(), tg.data(), B, T));
  CHECK(loss_mixed != all_kint->forward(in.data(), tg.data(), B, T));

  // The backward takes each layer through its own kind: fp64 finite differences.
  mixed->forward(in.data(), tg.data(), B, T);
  mixed->grads.assign(mixed->grads.size(), 0.0);
  mixed->backward(1.0);
  const std::vector<double> analytic = mixed->grads;
  const auto numeric = numeric_gradient(mixed->params, [&] { return mixed->forward(in.data(), tg.data(), B, T); });
  const ParamLayout& lay = mixed->layout();
  for (int p = 0; p < P_COUNT; ++p) {
    if (lay.size[p] == 0) continue;
    const std::vector<double> a(analytic.begin() + lay.offset[p], analytic.begin() + lay.offset[p] + lay.size[p]);
    const std::vector<double> n(numeric.begin() + lay.offset[p], numeric.begin() + lay.offset[p] + lay.size[p]);
    INFO("tensor " << ParamLayout::name(p));
    CHECK(relative_error(a, n) < 1e-5);
  }
}

TEST_CASE("a run with per-layer kinds names each layer's kind in diag.csv and the log", "[layers][cli]") {
  const auto d = scratch_dir("layers_run");
  make_corpus(d);
  json j = tiny_config(d, "mixed", 2);
  j["model"]["layers"] = 3;
  j["attention"] = {{"kind", "sage"}, {"layers", {{"0", {{"kind", "fpa"}}}, {"2", {{"kind", "kinterval"}}}}}};
  j["log"]["diag_every"] = 2;
  const auto cfg = write_json(d / "mixed.json", j);
  REQUIRE(exit_code(run_qattn({"train", cfg.string()}, {}, d / "log.txt")) == 0);
  std::ifstream csv(d / "runs" / "mixed" / "diag.csv");
  std::string header, line;
  std::getline(csv, header);
  CHECK(header.rfind("step,layer,kind,q_rms,", 0) == 0);
  std::vector<std::string> rows;
  while (std::getline(csv, line)) rows.push_back(line);
  REQUIRE(rows.size() == 6);  // steps 0 and 2, three layers each
  CHECK(rows[3].rfind("2,0,fpa,", 0) == 0);
  CHECK(rows[4].rfind("2,1,sage,", 0) == 0);
  CHECK(rows[5].rfind("2,2,kinterval,", 0) == 0);
  CHECK(rows[3].back() == ',');  // FPA is not compared with itself: empty cosine columns
  CHECK(rows[4].back() != ',');
  CHECK(read_text(d / "log.txt").find("attention sage (layers 0: fpa, 2: kinterval)") != std::string::npos);
  // The effective config keeps the entries, so the run resumes and exports with them.
  const json eff = json::parse(std::ifstream(d / "runs" / "mixed" / "config.json"));
  CHECK(eff["attention"]["layers"]["2"]["kind"] == "kinterval");
}

TEST_CASE("the sweep example: first and last layer FPA, the rest sage, against all-sage and FPA",
          "[layers][sweep]") {
  const Sweep s = load_sweep(std::string(QATTN_SOURCE_DIR) + "/configs/sweeps/sage_fpa_ends_small.json");
  REQUIRE(s.runs.size() == 6);
  std::map<std::string, int> settings;  // kinds of layers 0..5 -> runs
  for (const SweepRun& r : s.runs) {
    const Config c = load_config(s.base, train_assignments(s, r));
    std::string kinds;
    for (const AttentionConfig& a : c.attention_per_layer()) kinds += to_string(a.kind) + " ";
    ++settings[kinds];
    CHECK(r.is_baseline == (kinds == "fpa fpa fpa fpa fpa fpa "));
  }
  CHECK(settings == std::map<std::string, int>{{"fpa fpa fpa fpa fpa fpa ", 2},
                                               {"sage sage sage sage sage sage ", 2},
                                               {"fpa sage sage sage sage fpa ", 2}});
}
