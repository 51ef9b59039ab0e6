// Config validation: every bad value is an error that names its JSON path;
// docs/config.md states every key as the config key table has it; every
// config and sweep under configs/ validates.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "qattn/config.hpp"
#include "qattn/config_keys.hpp"
#include "qattn/json_file.hpp"
#include "qattn/sweep.hpp"
#include "doc_code.hpp"

using nlohmann::json;
using qattn::ConfigError;

namespace {

json good() {
  return json::parse(R"({
    "model": {"vocab": 257, "layers": 2, "heads": 2, "dim": 32, "seq_len": 16},
    "data": {"train": "a/*.bin", "val": "b/*.bin"},
    "train": {"tokens_per_step": 128, "micro_batch": 4, "steps": 10},
    "log": {"name": "t"}
  })");
}

// Applies the overrides to a good config and returns the error text ("" if valid).
std::string error_of(const std::vector<std::string>& sets) {
  json j = good();
  try {
    for (const auto& s : sets) qattn::apply_override(j, s);
    qattn::config_from_json(j);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a good config validates and derives grad_accum", "[config]") {
  const auto c = qattn::config_from_json(good());
  CHECK(c.train.grad_accum == 2);  // 128 / (4 * 16)
  CHECK(c.effective["train"]["lr"].get<double>() == Approx(6e-4));
  CHECK(c.effective["attention"]["kind"] == "fpa");
  CHECK(c.effective["attention"]["sage"]["precision"]["dp"] == "bf16");
}

TEST_CASE("bad configs name the JSON path, the value and what is allowed", "[config]") {
  struct Case {
    std::vector<std::string> sets;
    std::string must_contain;
  };
  const std::vector<Case> cases = {
      {{"model.layerz=3"}, "model.layerz: unknown key"},
      {{"model.layers=0"}, "model.layers: 0 is out of range"},
      {{"model.dim=33"}, "model.dim: 33 is not divisible by model.heads"},
      {{"model.heads=\"two\""}, "model.heads: \"two\" has the wrong type"},
      {{"train.lr=-1"}, "train.lr: -1 is out of range"},
      {{"train.schedule=exp"}, "train.schedule: \"exp\" is not allowed; allowed: \"cosine\""},
      {{"train.tokens_per_step=100"}, "train.tokens_per_step: 100 is not divisible by micro_batch * seq_len"},
      {{"train.device=tpu"}, "train.device: \"tpu\" is not allowed"},
      {{"train.tokens=1000"}, "give exactly one of train.steps and train.tokens"},
      {{"attention.kind=int4"}, "attention.kind: \"int4\" is not allowed"},
      {{"attention.kinterval.K=0"}, "attention.kinterval.K: 0 is out of range"},
      {{"attention.kinterval.window=0"}, "attention.kinterval.window: 0 is out of range; allowed: > 0"},
      {{"attention.sage.block_q=48"}, "attention.sage.block_q: 48 is not allowed"},
      {{"attention.sage.precision.dp=fp4"}, "attention.sage.precision.dp: \"fp4\" is not allowed; allowed: \"int8\" | \"bf16\" | \"fp8\""},
      {{"attention.sage.softmax.kind=kinterval", "attention.sage.precision.dk=fp8"},
       "attention.sage.precision.dk: \"fp8\" is not allowed with softmax.kind \"kinterval\""},
      {{"attention.sage.softmax.kind=sage"}, "attention.sage.softmax.kind: \"sage\" is not allowed; allowed: \"exact\" | \"kinterval\""},
      {{"eval.batches=0"}, "eval.batches: 0 is out of range"},
      {{"dist.zero_stage=3"}, "dist.zero_stage: 3 is out of range"},
      {{"bogus.x=1"}, "bogus: unknown key"},
      {{"train.warmup=11"}, "train.warmup: 11 exceeds train.steps"},
      // 3e9 micro-batches of 64 tokens: more than grad_accum (an int) holds.
      {{"train.tokens_per_step=192000000000"},
       "train.tokens_per_step: 192000000000 is 3000000000 micro-batches of 64 tokens; allowed: at most 2147483647"},
      {{"train.tokens_per_step=68719476736", "train.steps=200000000"},
       "train.steps: 200000000 steps of tokens_per_step = 68719476736 tokens exceed 2^63 tokens; allowed: at most "
       "134217727 steps"},
      {{"model.qk_norm=3"}, "model.qk_norm: 3 has the wrong type; allowed: false | true | \"gain\" | \"logit_scale\" | {\"form\""},
      {{"model.qk_norm=null"}, "model.qk_norm: null has the wrong type; allowed: false | true"},
      {{"model.qk_norm=cosine"}, "model.qk_norm: \"cosine\" is not allowed; allowed: false | true | \"gain\" | \"logit_scale\""},
      {{"model.qk_norm={\"form\":\"l2\"}"}, "model.qk_norm.form: \"l2\" is not allowed; allowed: \"gain\" | \"logit_scale\""},
      {{"model.qk_norm={\"form\":true}"}, "model.qk_norm.form: true has the wrong type; expected a string"},
      {{"model.qk_norm={\"lr_mult\":-1}"}, "model.qk_norm.lr_mult: -1 is out of range; allowed: >= 0.0 and <= 10000.0"},
      {{"model.qk_norm={\"lr_mult\":\"x\"}"}, "model.qk_norm.lr_mult: \"x\" has the wrong type; expected a number"},
      {{"model.qk_norm={\"form\":\"logit_scale\",\"logit_scale_init\":0}"},
       "model.qk_norm.logit_scale_init: 0 is out of range; allowed: > 0.0 and <= 10000.0"},
      {{"model.qk_norm={\"form\":\"logit_scale\",\"logit_scale_init\":[1]}"},
       "model.qk_norm.logit_scale_init: [1] has the wrong type; expected a number"},
      {{"model.qk_norm={\"scale\":1}"}, "model.qk_norm.scale: unknown key; allowed keys here: form, logit_scale_init, lr_mult"},
  };
  for (const auto& c : cases) {
    INFO("overrides: " << c.sets[0]);
    const std::string err = error_of(c.sets);
    CHECK_THAT(err, Catch::Contains(c.must_contain));
  }
}

TEST_CASE("AdamW's betas stay below 1 as floats: at 1 the bias correction divides by 0", "[config]") {
  // The optimizer runs in float: 0.99999999 is 1.0f there, and a run with it
  // ended in NaN at its second step, reported as diverged.
  for (const char* set : {"train.beta1=1", "train.beta2=1", "train.beta1=0.99999999", "train.beta2=0.99999999"}) {
    INFO(set);
    const std::string key = std::string(set).substr(0, std::string(set).find('='));
    CHECK_THAT(error_of({set}), Catch::Contains(key + ": " + std::string(set).substr(key.size() + 1) +
                                                " is out of range; allowed: >= 0.0 and <= 0.9999999403953552"));
  }
  CHECK(error_of({"train.beta1=0.9999999403953552", "train.beta2=0.999"}).empty());
  CHECK(static_cast<float>(0.9999999403953552) < 1.0f);
}

TEST_CASE("log.name names one folder inside log.out", "[config]") {
  // ".." put config.json, metrics.csv and checkpoints/ in the parent of
  // log.out, over any file of those names there.
  for (const char* name : {"..", ".", "a/b", "/abs"}) {
    INFO(name);
    CHECK_THAT(error_of({std::string("log.name=") + name}),
               Catch::Contains("log.name: \"" + std::string(name) + "\" is not allowed; allowed: a folder name (not "
                               "empty, without '/', not \".\" or \"..\") (the run directory is log.out/log.name)"));
  }
  json j = good();
  j["log"]["name"] = "";
  CHECK_THROWS_WITH(qattn::config_from_json(j, "configs/x.json"),
                    Catch::Contains("log.name: \"\" is not allowed; allowed: a folder name"));
  j["log"].erase("name");
  CHECK(qattn::config_from_json(j, "configs/x.json").log.name == "x");
  CHECK_THAT(error_of({"log.name=run-1.b"}), Catch::Equals(""));
}

TEST_CASE("every sage precision key takes fp8, alone or mixed", "[config]") {
  json j = good();
  for (const char* key : {"qk", "pv", "dv", "dp", "dq", "dk"})
    qattn::apply_override(j, std::string("attention.sage.precision.") + key + "=fp8");
  qattn::apply_override(j, "attention.sage.precision.qk=int8");
  const auto c = qattn::config_from_json(j);
  const qattn::SagePrecision& p = c.attention.sage.precision;
  CHECK(p.qk == qattn::Precision::int8);
  for (qattn::Precision x : {p.pv, p.dv, p.dp, p.dq, p.dk}) CHECK(x == qattn::Precision::fp8);
  CHECK(c.effective["attention"]["sage"]["precision"]["dk"] == "fp8");
  // With a K-interval softmax the forward and dV products may still be fp8.
  qattn::apply_override(j, "attention.sage.softmax.kind=kinterval");
  qattn::apply_override(j, "attention.sage.precision.dq=int8");
  qattn::apply_override(j, "attention.sage.precision.dk=bf16");
  CHECK(qattn::config_from_json(j).attention.sage.precision.pv == qattn::Precision::fp8);
}

TEST_CASE("missing required keys are reported together", "[config]") {
  json j = good();
  j["train"].erase("micro_batch");
  j["data"].erase("val");
  try {
    qattn::config_from_json(j);
    FAIL("expected ConfigError");
  } catch (const ConfigError& e) {
    CHECK(e.errors.size() == 2);
    CHECK_THAT(std::string(e.what()), Catch::Contains("train.micro_batch: required"));
    CHECK_THAT(std::string(e.what()), Catch::Contains("data.val: required"));
  }
}

TEST_CASE("train.tokens derives train.steps", "[config]") {
  json j = good();
  j["train"].erase("steps");
  j["train"]["tokens"] = 1280;
  CHECK(qattn::config_from_json(j).train.steps == 10);
}

TEST_CASE("set-overrides parse JSON values and bare words", "[config]") {
  json j = good();
  qattn::apply_override(j, "attention.kind=kinterval");
  qattn::apply_override(j, "attention.kinterval.K=16");
  qattn::apply_override(j, "model.qk_norm=true");
  const auto c = qattn::config_from_json(j);
  CHECK(c.attention.kind == qattn::AttentionKind::kinterval);
  CHECK(c.attention.kinterval.K == 16);
  CHECK(c.model.qk_norm.form == qattn::QkNormForm::gain);
  CHECK_THROWS_AS(qattn::apply_override(j, "noequals"), ConfigError);
}

TEST_CASE("model.qk_norm: booleans, form names and the options object", "[config][qknorm]") {
  using qattn::QkNormForm;
  const auto read = [](const std::string& set) {
    json j = good();
    qattn::apply_override(j, set);
    return qattn::config_from_json(j);
  };
  SECTION("booleans stay as written; true is the gain form") {
    const auto off = qattn::config_from_json(good());
    CHECK(off.model.qk_norm.form == QkNormForm::off);
    CHECK(off.effective["model"]["qk_norm"] == false);
    const auto on = read("model.qk_norm=true");
    CHECK(on.model.qk_norm.form == QkNormForm::gain);
    CHECK(on.model.qk_norm.lr_mult == 1.0);
    CHECK(on.effective["model"]["qk_norm"] == true);
  }
  SECTION("a form name is the object with that form and every default") {
    const auto c = read("model.qk_norm=logit_scale");
    CHECK(c.model.qk_norm.form == QkNormForm::logit_scale);
    CHECK(c.model.qk_norm.lr_mult == 1.0);
    CHECK(c.model.qk_norm.logit_scale_init == std::log2(16.0 * 16.0 - 16.0));  // seq_len 16
    CHECK(c.effective["model"]["qk_norm"] ==
          json({{"form", "logit_scale"}, {"lr_mult", 1.0}, {"logit_scale_init", std::log2(240.0)}}));
    CHECK(c.warnings.empty());
    const auto g = read("model.qk_norm=gain");
    CHECK(g.model.qk_norm.form == QkNormForm::gain);
    CHECK(g.effective["model"]["qk_norm"] == json({{"form", "gain"}, {"lr_mult", 1.0}}));
  }
  SECTION("the object: form defaults to gain, options as given") {
    const auto c = read(R"(model.qk_norm={"lr_mult": 30})");
    CHECK(c.model.qk_norm.form == QkNormForm::gain);
    CHECK(c.model.qk_norm.lr_mult == 30.0);
    const auto s = read(R"(model.qk_norm={"form": "logit_scale", "lr_mult": 0, "logit_scale_init": 10})");
    CHECK(s.model.qk_norm.form == QkNormForm::logit_scale);
    CHECK(s.model.qk_norm.lr_mult == 0.0);
    CHECK(s.model.qk_norm.logit_scale_init == 10.0);
    json b = good();  // a boolean in the file takes no dotted override, and the error says what to do
    b["model"]["qk_norm"] = true;
    CHECK_THROWS_WITH(qattn::apply_override(b, "model.qk_norm.lr_mult=10"),
                      Catch::Contains("--set model.qk_norm.lr_mult=10: 'model.qk_norm.lr_mult' goes through "
                                      "model.qk_norm = true, which is not an object; set model.qk_norm as a whole"));
    json j = good();  // an object in the file takes dotted overrides
    j["model"]["qk_norm"] = {{"form", "gain"}};
    qattn::apply_override(j, "model.qk_norm.form=logit_scale");
    qattn::apply_override(j, "model.qk_norm.lr_mult=10");
    const auto o = qattn::config_from_json(j);
    CHECK(o.model.qk_norm.form == QkNormForm::logit_scale);
    CHECK(o.model.qk_norm.lr_mult == 10.0);
  }
  SECTION("logit_scale_init with the gain form is warned about and left out") {
    const auto c = read(R"(model.qk_norm={"form": "gain", "logit_scale_init": 5})");
    REQUIRE(c.warnings.size() == 1);
    CHECK(c.warnings[0] == "model.qk_norm.logit_scale_init: unused, the form is \"gain\"");
    CHECK_FALSE(c.effective["model"]["qk_norm"].contains("logit_scale_init"));
  }
  SECTION("the default init follows model.seq_len") {
    json j = good();
    j["model"]["seq_len"] = 1024;
    j["train"]["tokens_per_step"] = 4096;
    j["model"]["qk_norm"] = "logit_scale";
    CHECK(qattn::config_from_json(j).model.qk_norm.logit_scale_init == std::log2(1024.0 * 1024.0 - 1024.0));
    CHECK(qattn::default_logit_scale_init(1) == 1.0);
    CHECK(qattn::default_logit_scale_init(2) == 1.0);
  }
}

TEST_CASE("ste with lerp is legal but warned about", "[config]") {
  json j = good();
  qattn::apply_override(j, "attention.kind=kinterval");
  qattn::apply_override(j, "attention.kinterval.rounding=lerp");
  qattn::apply_override(j, "attention.kinterval.ste=weight");
  const auto c = qattn::config_from_json(j);
  REQUIRE(c.warnings.size() == 1);
  CHECK_THAT(c.warnings[0], Catch::Contains("attention.kinterval.ste"));
}

TEST_CASE("sage's softmax block: kinterval sets the options, exact is the plain softmax", "[config]") {
  json j = good();
  qattn::apply_override(j, "attention.kind=sage");
  qattn::apply_override(j, "attention.sage.softmax.K=16");
  qattn::apply_override(j, "attention.sage.softmax.calibration=fwm");
  const auto quantised = qattn::config_from_json(j);  // kind defaults to kinterval
  REQUIRE(quantised.attention.sage.softmax.has_value());
  CHECK(quantised.attention.sage.softmax->K == 16);
  CHECK(quantised.attention.sage.softmax->calibration == qattn::Calibration::fwm);
  CHECK(quantised.warnings.empty());

  qattn::apply_override(j, "attention.sage.softmax.kind=exact");
  const auto exact = qattn::config_from_json(j);
  CHECK_FALSE(exact.attention.sage.softmax.has_value());
  REQUIRE(exact.warnings.size() == 1);
  CHECK_THAT(exact.warnings[0], Catch::Contains("attention.sage.softmax"));
}

TEST_CASE("a missing config file and bad JSON name the file", "[config]") {
  CHECK_THROWS_WITH(qattn::load_config("/nonexistent/x.json"), Catch::Contains("/nonexistent/x.json"));
}

TEST_CASE("the attention section alone (qattn bench attention --set) validates like a full config", "[config]") {
  json j;
  j["attention"]["kind"] = "sage";
  for (const char* a : {"attention.sage.softmax.kind=kinterval", "attention.sage.softmax.K=16",
                        "attention.sage.softmax.calibration=fwm", "attention.sage.softmax.rounding=nearest"})
    qattn::apply_override(j, a);
  const qattn::AttentionConfig a = qattn::attention_config_from_json(j);
  CHECK(a.kind == qattn::AttentionKind::sage);
  REQUIRE(a.sage.softmax.has_value());
  CHECK(a.sage.softmax->K == 16);
  CHECK(a.sage.softmax->calibration == qattn::Calibration::fwm);
  CHECK(a.sage.softmax->rounding == qattn::Rounding::nearest);
  qattn::apply_override(j, "attention.sage.softmax.K=0");
  CHECK_THROWS_WITH(qattn::attention_config_from_json(j), Catch::Contains("attention.sage.softmax.K"));
  CHECK(qattn::attention_config_from_json(json::object()).kind == qattn::AttentionKind::fpa);
}

TEST_CASE("JSON as people write it: duplicate keys and numbers beyond double name their path", "[config]") {
  using qattn::parse_json;
  CHECK_THROWS_WITH(parse_json(R"({"model": {"layers": 2, "dim": 8, "layers": 3}})"),
                    Catch::StartsWith("model.layers: given twice in one object"));
  CHECK_THROWS_WITH(parse_json(R"({"zip": [{"a": [1]}, {"b": 1, "b": 2}]})"), Catch::StartsWith("zip[1].b: given twice"));
  CHECK_THROWS_WITH(parse_json(R"({"train": {"lr": 1e400}})"),
                    Catch::StartsWith("train.lr: 1e400 is out of range for a number"));
  CHECK_THROWS_WITH(parse_json(R"({"x": [0, 1, -1e999]})"), Catch::StartsWith("x[2]: -1e999 is out of range"));
  CHECK_THROWS_WITH(parse_json(R"({"a": 1,})"), Catch::StartsWith("not valid JSON: parse error at line 1") &&
                                                    !Catch::Contains("json.exception"));
  CHECK(parse_json("// a comment\n{\"a\": {\"a\": 1}}")["a"]["a"] == 1);  // one key per object
  // A number beyond int64 is out of range, never wrapped to a negative one.
  json j = good();
  j["train"]["steps"] = std::numeric_limits<uint64_t>::max();
  CHECK_THROWS_WITH(qattn::config_from_json(j), Catch::Contains("train.steps: 18446744073709551615 is out of range"));
  // A bare word must be UTF-8 like the file's strings.
  CHECK_THROWS_WITH(qattn::apply_override(j, "log.name=\xff"), Catch::Contains("not valid UTF-8"));
}

namespace {

// One row of a key table in docs/config.md (| key | default | allowed | meaning |),
// its key completed with the object its heading names.
struct DocRow {
  int line;
  std::string path, default_cell, allowed_cell;
};

struct ConfigDoc {
  std::vector<DocRow> rows;
  std::map<std::string, int> headings;                 // object path -> line
  std::vector<std::pair<int, std::string>> mentioned;  // `json.path` in the prose, by line
};

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::string unquote_code(std::string s) {
  if (s.size() >= 2 && s.front() == '`' && s.back() == '`') s = s.substr(1, s.size() - 2);
  return s;
}

// The cells of a table line; "\|" is a | inside a cell.
std::vector<std::string> cells_of(const std::string& line) {
  std::vector<std::string> cells;
  std::string cell;
  for (size_t i = 1; i < line.size(); ++i) {
    if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == '|') {
      cell += '|';
      ++i;
    } else if (line[i] == '|') {
      cells.push_back(trim(cell));
      cell.clear();
    } else {
      cell += line[i];
    }
  }
  return cells;
}

ConfigDoc read_config_doc() {
  const std::filesystem::path file = std::filesystem::path(QATTN_SOURCE_DIR) / "docs" / "config.md";
  std::ifstream f(file);
  REQUIRE(f);
  static const std::regex object_heading(R"(#+ `?([a-z_]+(\.[a-z_]+)*)`?)");
  static const std::regex config_path(R"((--set )?((model|attention|data|train|eval|log|dist)(\.[A-Za-z0-9_-]+)+).*)");
  ConfigDoc doc;
  std::string object, text;  // the object the current heading names ("" when none)
  bool in_code = false, in_table = false;
  for (int n = 1; std::getline(f, text); ++n) {
    if (text.rfind("```", 0) == 0) in_code = !in_code;
    if (in_code) continue;
    std::smatch m;
    if (text.rfind("#", 0) == 0) {
      object = std::regex_match(text, m, object_heading) ? m[1].str() : "";
      if (!object.empty()) doc.headings[object] = n;
    }
    if (text.rfind("| key | default | allowed |", 0) == 0) {
      INFO("docs/config.md:" << n << ": a key table under a heading that names no config object");
      CHECK(!object.empty());
      in_table = true;
      continue;
    }
    in_table = in_table && text.rfind("|", 0) == 0;
    if (in_table && text.rfind("| ---", 0) != 0) {
      const auto cells = cells_of(text);
      INFO("docs/config.md:" << n << ": " << text);
      REQUIRE(cells.size() >= 4);
      doc.rows.push_back({n, object + "." + unquote_code(cells[0]), cells[1], cells[2]});
    }
  }
  for (const auto& [n, span] : qattn::test::doc_code(file).spans)
    if (std::smatch m; std::regex_match(span, m, config_path)) doc.mentioned.push_back({n, m[2]});
  return doc;
}

// The least a config must give; every other key takes its default.
json minimal_config() {
  return {{"data", {{"train", "t"}, {"val", "v"}}},
          {"train", {{"tokens_per_step", 1024}, {"micro_batch", 1}, {"steps", 1}}},
          {"log", {{"name", "n"}}}};
}

// A default cell's value: the JSON value before any "(comment)", a bare word as a string.
json default_of(const std::string& cell) {
  const std::string v = trim(cell.substr(0, cell.find(" (")));
  try {
    return json::parse(v);
  } catch (const json::parse_error&) {
    return v;
  }
}

// How the allowed column begins for a range: "1 .. 1024", "≥ 0", "> 0, ≤ 10".
std::string range_text(const qattn::ConfigKey& k) {
  const auto text = [&](const json& v) {
    return k.type == qattn::KeyType::number ? fmt::format("{}", v.get<double>()) : v.dump();
  };
  if (k.lo_open) return "> " + text(k.lo) + (k.hi.is_null() ? "" : ", ≤ " + text(k.hi));
  return k.hi.is_null() ? "≥ " + text(k.lo) : text(k.lo) + " .. " + text(k.hi);
}

// The values "a" | "b" of an allowed cell.
std::set<json> alternatives_of(const std::string& cell) {
  std::set<json> out;
  std::istringstream parts(cell);
  for (std::string part; std::getline(parts, part, '|');) out.insert(default_of(part));
  return out;
}

}  // namespace

TEST_CASE("docs/config.md documents every key the config takes: its default and what is allowed", "[config][docs]") {
  using qattn::KeyType;
  const ConfigDoc doc = read_config_doc();
  const json minimal = minimal_config();
  std::map<std::string, const DocRow*> row_of;
  for (const DocRow& r : doc.rows) {
    INFO("docs/config.md:" << r.line << ": " << r.path);
    const qattn::ConfigKey* k = qattn::find_config_key(r.path);
    CHECK((k && k->path == r.path));  // a key of the table, not a key that takes its keys
    CHECK(row_of.emplace(r.path, &r).second);  // one row per key
  }
  for (const auto& [line, path] : doc.mentioned) {
    INFO("docs/config.md:" << line << ": `" << path << "`");
    CHECK(qattn::find_config_key(path));
  }
  for (const qattn::ConfigKey& k : qattn::config_keys()) {
    INFO("config key " << k.path);
    const bool is_object = k.type == KeyType::object || k.type == KeyType::entries;
    const auto row = row_of.find(k.path);
    if (row == row_of.end()) {
      CHECK((is_object && doc.headings.count(k.path)));  // undocumented
      continue;
    }
    const DocRow& r = *row->second;
    INFO("docs/config.md:" << r.line << ": default \"" << r.default_cell << "\", allowed \"" << r.allowed_cell << "\"");
    // The default: as the table states it, or the reader's, which the effective config shows.
    if (!k.default_doc.empty()) {
      CHECK(r.default_cell == k.default_doc);
    } else {
      json j = minimal;
      for (size_t dot = k.path.find('.'); dot != std::string::npos; dot = k.path.find('.', dot + 1))
        if (const std::string parent = k.path.substr(0, dot); parent.find('.') != std::string::npos &&
                                                               !j.contains(json::json_pointer("/" + parent)))
          qattn::apply_override(j, parent + "={}");  // an options object the default config leaves out
      std::string pointer = "/" + k.path;
      std::replace(pointer.begin(), pointer.end(), '.', '/');
      const json effective = qattn::config_from_json(j).effective;
      if (!effective.contains(json::json_pointer(pointer))) {
        CHECK(is_object);  // a key the reader does not fill in needs a default_doc
      } else if (!effective.at(json::json_pointer(pointer)).is_object()) {
        CHECK(default_of(r.default_cell) == effective.at(json::json_pointer(pointer)));
      }
    }
    // What is allowed.
    switch (k.type) {
      case KeyType::choice:
        CHECK(alternatives_of(r.allowed_cell) == std::set<json>(k.choices.begin(), k.choices.end()));
        break;
      case KeyType::integer:
        if (!k.choices.empty())
          CHECK(alternatives_of(r.allowed_cell) == std::set<json>(k.choices.begin(), k.choices.end()));
        else
          CHECK_THAT(r.allowed_cell, Catch::StartsWith(range_text(k)));
        break;
      case KeyType::number:
        CHECK_THAT(r.allowed_cell, Catch::StartsWith(range_text(k)));
        break;
      case KeyType::boolean:
        CHECK(alternatives_of(r.allowed_cell) == std::set<json>{true, false});
        break;
      case KeyType::text:
      case KeyType::object:
      case KeyType::entries:
        break;
    }
  }
}

TEST_CASE("the config key table holds the keys the reader reads, and only those", "[config][docs]") {
  // Reading a key the table lacks is a logic_error on any config (reader.cpp);
  // here each key of the table, given a value of no type the config takes, is
  // answered by its reader (a type error or a warning), never as unknown.
  const json minimal = minimal_config();
  for (const qattn::ConfigKey& k : qattn::config_keys()) {
    if (k.path.find('.') == std::string::npos) continue;  // a section
    INFO("config key " << k.path);
    json j = minimal;
    qattn::apply_override(j, k.path + "=[]");
    std::string errors;
    try {
      qattn::config_from_json(j);
    } catch (const ConfigError& e) {
      errors = e.what();
    }
    CHECK_THAT(errors, !Catch::Contains("unknown key"));
  }
  CHECK(qattn::find_config_key("attention.layers.0-3.sage.softmax.K")->path == "attention.kinterval.K");
  CHECK(qattn::find_config_key("attention.sage.softmax.kind")->path == "attention.sage.softmax.kind");
  CHECK(qattn::find_config_key("attention.sage.softmax.bogus") == nullptr);
  CHECK(qattn::find_config_key("train.") == nullptr);
}

TEST_CASE("every config and every run of every sweep under configs/ validates", "[config]") {
  const std::filesystem::path root = std::filesystem::path(QATTN_SOURCE_DIR) / "configs";
  int configs = 0, runs = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    if (e.path().extension() != ".json") continue;
    INFO(e.path().string());
    const bool is_sweep = e.path().parent_path().filename() == "sweeps";
    try {
      if (!is_sweep) {
        ++configs;
        for (const auto& w : qattn::load_config(e.path().string()).warnings) WARN(e.path().string() << ": " << w);
        continue;
      }
      const qattn::Sweep s = qattn::load_sweep(e.path().string());
      for (const qattn::SweepRun& r : s.runs) {
        ++runs;
        INFO("run " << r.id);
        qattn::load_config(s.base, qattn::train_assignments(s, r));
      }
    } catch (const std::exception& err) {
      FAIL(err.what());
    }
  }
  CHECK(configs >= 7);
  CHECK(runs >= 100);
}
