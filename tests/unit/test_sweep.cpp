// Sweeps: expansion (grid product, zip, seeds, baselines), stable ids, labels
// (which never move a run's folder), errors naming the JSON path, summary
// arithmetic, and `qattn sweep` end to end (resumable, a diverged run
// recorded and the sweep going on).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <fmt/format.h>
#include <fstream>
#include <set>
#include <tuple>

#include "qattn/checkpoint.hpp"
#include "qattn/sweep.hpp"
#include "run_helpers.hpp"

using namespace qattn;
using namespace qattn::test;
using nlohmann::json;

namespace {

json grid_sweep() {
  return {{"name", "g"},
          {"base", "base.json"},
          {"grid", {{"attention.kind", {"fpa", "kinterval"}}, {"train.tokens_per_step", {128, 256}}}},
          {"zip", {{{"attention.kinterval.K", {8, 16}}, {"train.lr", {0.01, 0.02}}}}},
          {"seeds", {1, 2}},
          {"baseline", {{"set", {{"attention.kind", "fpa"}}}, {"match", {"train.tokens_per_step"}}}}};
}

const SweepRun& find_run(const Sweep& s, const std::string& id) {
  for (const auto& r : s.runs)
    if (r.id == id) return r;
  FAIL("no run " << id);
  return s.runs.front();
}

// A run directory as `qattn train` leaves it: status.json and val losses in metrics.csv.
void fake_run(const fs::path& dir, const std::string& status, const std::vector<double>& vals) {
  fs::create_directories(dir);
  std::ofstream m(dir / "metrics.csv");
  m << "step,tokens,lr,train_loss,val_loss,grad_norm,step_ms,tokens_per_s,mfu,skipped,event\n";
  m << "0,0,,,9.0,,,,,0,\n";
  int step = 0;
  for (double v : vals) {
    ++step;
    m << step << ',' << step * 100 << ",0.1,1.0,,0.5,1,1,,0,\n";  // a row without evaluation
    m << step << ',' << step * 100 << ",0.1,1.0," << v << ",0.5,1,1,,0,\n";
  }
  write_json(dir / "status.json", {{"status", status}, {"step", step}, {"tokens", step * 100},
                                   {"train_seconds", 2.0}, {"wall_seconds", 3.0}, {"reason", ""}});
}

}  // namespace

TEST_CASE("a sweep expands to the product of grid and zip, times seeds, plus baselines", "[sweep]") {
  const Sweep s = expand_sweep(grid_sweep(), "/sweeps/g.json");
  CHECK(s.base == "/sweeps/base.json");
  CHECK(s.dir() == "runs/g");
  // 2 kinds x 2 tokens_per_step x 2 zipped (K, lr) x 2 seeds; the baselines
  // (kind fpa, no K/lr override) per tokens_per_step and seed are 4 more.
  CHECK(s.runs.size() == 16 + 4);
  CHECK(s.keys == std::vector<std::string>{"attention.kind", "train.tokens_per_step", "attention.kinterval.K",
                                           "train.lr", "train.seed"});
  const SweepRun& r = find_run(s, "kind=kinterval_K=8_lr=0.01_tokens_per_step=256_seed=2");
  CHECK(r.setting == "kind=kinterval_K=8_lr=0.01_tokens_per_step=256");
  CHECK(r.baseline == "kind=fpa_tokens_per_step=256");
  CHECK_FALSE(r.is_baseline);
  const SweepRun& b = find_run(s, "kind=fpa_tokens_per_step=256_seed=2");
  CHECK(b.is_baseline);
  CHECK(b.baseline.empty());
  CHECK(b.overrides == json({{"attention.kind", "fpa"}, {"train.tokens_per_step", 256}, {"train.seed", 2}}));

  const auto sets = train_assignments(s, r);
  CHECK(std::find(sets.begin(), sets.end(), "attention.kind=\"kinterval\"") != sets.end());
  CHECK(std::find(sets.begin(), sets.end(), "train.seed=2") != sets.end());
  CHECK(sets.back() == "log.name=\"kind=kinterval_K=8_lr=0.01_tokens_per_step=256_seed=2\"");
}

TEST_CASE("without baseline.match a run's baseline shares all its other settings", "[sweep]") {
  json j = grid_sweep();
  j["baseline"].erase("match");
  const Sweep s = expand_sweep(j, "");
  CHECK(s.runs.size() == 16);  // the fpa runs of the grid are the baselines
  CHECK(find_run(s, "kind=kinterval_K=8_lr=0.01_tokens_per_step=256_seed=2").baseline ==
        "kind=fpa_K=8_lr=0.01_tokens_per_step=256");
  CHECK(find_run(s, "kind=fpa_K=8_lr=0.01_tokens_per_step=256_seed=2").is_baseline);
  j["baseline"]["match"] = json::array();  // one baseline for all: the base config with fpa
  CHECK(expand_sweep(j, "").runs.size() == 16 + 2);
}

TEST_CASE("run ids are stable and readable", "[sweep]") {
  CHECK(run_id(json::object()) == "base");
  CHECK(run_id({{"train.seed", 3}, {"attention.kind", "sage"}}) == "kind=sage_seed=3");
  // Two keys with one last component keep their full paths.
  CHECK(run_id({{"a.x", 1}, {"b.x", true}}) == "a.x=1_b.x=true");
  CHECK(run_id({{"data.train", "dir/x*.bin"}}) == "train=dir-x-.bin");
  const json long_one = {{"attention.kinterval.calibration", std::string(120, 'f')}};
  const std::string id = run_id(long_one);
  CHECK(id.size() == 100);
  CHECK(id == run_id(long_one));
  // Many keys: whole "key=value" parts are kept, never a value cut in the middle.
  json many;
  for (int i = 0; i < 12; ++i) many["train.key" + std::to_string(i)] = 32768;
  const std::string cut = run_id(many);
  CHECK(cut.size() <= 100);
  const std::string kept = cut.substr(0, cut.rfind('-'));
  CHECK(kept.substr(kept.size() - 6) == "=32768");
  CHECK(cut != run_id(json{{"train.key0", 32768}}));
}

TEST_CASE("a zip group's labels name its cells and leave the run ids as they were", "[sweep]") {
  const Sweep plain = expand_sweep(grid_sweep(), "");
  json j = grid_sweep();
  j["zip"][0]["label"] = {"K8", "K16"};
  const Sweep labelled = expand_sweep(j, "");
  REQUIRE(labelled.runs.size() == plain.runs.size());
  for (size_t i = 0; i < plain.runs.size(); ++i) {
    CHECK(labelled.runs[i].id == plain.runs[i].id);
    CHECK(labelled.runs[i].setting == plain.runs[i].setting);
    CHECK(labelled.runs[i].overrides == plain.runs[i].overrides);
  }
  CHECK(labelled.keys == plain.keys);
  // A grid axis adds its key=value; the zip group its label, in the order of the axes.
  CHECK(find_run(labelled, "kind=kinterval_K=8_lr=0.01_tokens_per_step=256_seed=2").label ==
        "kind=kinterval, tokens_per_step=256, K8");
  CHECK(find_run(labelled, "kind=fpa_K=16_lr=0.02_tokens_per_step=128_seed=1").label ==
        "kind=fpa, tokens_per_step=128, K16");
  // A baseline that the grid does not hold: its varied keys.
  CHECK(find_run(labelled, "kind=fpa_tokens_per_step=256_seed=1").label == "kind=fpa, tokens_per_step=256");
}

TEST_CASE("without labels a cell shows the keys that differ between cells, less those its kind ignores", "[sweep]") {
  const Sweep s = expand_sweep(grid_sweep(), "");
  CHECK(find_run(s, "kind=kinterval_K=8_lr=0.01_tokens_per_step=256_seed=2").label ==
        "kind=kinterval, tokens_per_step=256, K=8, lr=0.01");
  // FPA ignores attention.kinterval.K; train.lr still tells its two cells apart.
  CHECK(find_run(s, "kind=fpa_K=8_lr=0.01_tokens_per_step=256_seed=2").label ==
        "kind=fpa, tokens_per_step=256, lr=0.01");
  CHECK(find_run(s, "kind=fpa_tokens_per_step=256_seed=2").label == "kind=fpa, tokens_per_step=256");
  // Cells that differ only in keys their kind ignores show those keys.
  json j = grid_sweep();
  j["zip"][0].erase("train.lr");
  j["grid"]["train.tokens_per_step"] = {128};  // one value: it does not tell cells apart
  j["grid"]["attention.kind"] = {"fpa", "sage", "kinterval"};
  const Sweep k = expand_sweep(j, "");
  CHECK(find_run(k, "kind=fpa_K=8_tokens_per_step=128_seed=1").label == "kind=fpa, K=8");
  CHECK(find_run(k, "kind=fpa_K=16_tokens_per_step=128_seed=1").label == "kind=fpa, K=16");
  CHECK(find_run(k, "kind=kinterval_K=16_tokens_per_step=128_seed=1").label == "kind=kinterval, K=16");
  // Two keys with one last component keep their full paths; the K-interval
  // cells differ only in a sage option and show it.
  const Sweep two = expand_sweep({{"name", "t"}, {"base", "b.json"},
                                  {"grid", {{"attention.sage.softmax.kind", {"exact", "kinterval"}},
                                            {"attention.kind", {"sage", "kinterval"}}}}},
                                 "");
  REQUIRE(two.runs.size() == 4);
  CHECK(two.runs[1].label == "attention.kind=sage, attention.sage.softmax.kind=kinterval");
  CHECK(two.runs[2].label == "attention.kind=kinterval, attention.sage.softmax.kind=exact");
  // One value: the key tells no cells apart.
  const Sweep one = expand_sweep({{"name", "t"}, {"base", "b.json"},
                                  {"grid", {{"attention.sage.softmax.kind", {"exact", "kinterval"}},
                                            {"attention.kind", {"sage"}}}}},
                                 "");
  CHECK(one.runs[1].label == "kind=kinterval");
  // No varied key at all: the setting.
  CHECK(expand_sweep({{"name", "t"}, {"base", "b.json"}}, "").runs[0].label == "base");
}

TEST_CASE("sweep errors name the JSON path and what is allowed", "[sweep]") {
  json j = grid_sweep();
  j["zip"][0]["train.lr"] = {0.1};
  CHECK_THROWS_WITH(expand_sweep(j, ""), Catch::Contains("zip[0].train.lr: 1 values, but attention.kinterval.K has 2"));
  j = grid_sweep();
  j["grid"]["train.lr"] = json::array();
  CHECK_THROWS_WITH(expand_sweep(j, ""), Catch::Contains("grid.train.lr: [] is not allowed"));
  j = grid_sweep();
  j["grids"] = 1;
  CHECK_THROWS_WITH(expand_sweep(j, ""), Catch::Contains("grids: unknown key"));
  j = grid_sweep();
  j["baseline"]["match"] = {"model.dim"};
  CHECK_THROWS_WITH(expand_sweep(j, ""), Catch::Contains("baseline.match: \"model.dim\" is not one of the varied keys"));
  j = grid_sweep();
  j["grid"]["train.seed"] = {1, 2};
  CHECK_THROWS_WITH(expand_sweep(j, ""), Catch::Contains("\"seeds\" list"));
  // A value given twice would be one run, the second dropped without a word.
  j = grid_sweep();
  j["grid"]["train.lr"] = {0.01, 0.02, 0.01};
  CHECK_THROWS_WITH(expand_sweep(j, ""),
                    Catch::Contains("grid.train.lr: 0.01 is given twice (entries 0 and 2); allowed: distinct values"));
  j = grid_sweep();
  j["seeds"] = {1, 2, 2};
  CHECK_THROWS_WITH(expand_sweep(j, ""), Catch::Contains("seeds: 2 is given twice (entries 1 and 2)"));
  j = grid_sweep();
  j["zip"][0] = {{"attention.kinterval.K", {4, 4}}, {"attention.kinterval.rounding", {"lerp", "lerp"}}};
  CHECK_THROWS_WITH(expand_sweep(j, ""), Catch::Contains("zip[0]: [4,\"lerp\"] is given twice (entries 0 and 1)"));
  j["zip"][0]["attention.kinterval.rounding"] = {"lerp", "nearest"};  // a value may repeat in one key of a zip
  CHECK_NOTHROW(expand_sweep(j, ""));
}

TEST_CASE("zip labels: one distinct non-empty one-line string per position, errors naming the JSON path", "[sweep]") {
  const std::string allowed = "allowed: a list of 2 distinct non-empty one-line strings, one per position of the "
                              "group (attention.kinterval.K has 2 values)";
  for (const auto& [label, message] : std::vector<std::pair<json, std::string>>{
           {json{"a"}, "zip[0].label: 1 labels, but attention.kinterval.K has 2 values; " + allowed},
           {json{"a", "b", "c"}, "zip[0].label: 3 labels, but attention.kinterval.K has 2 values; " + allowed},
           {json("a"), "zip[0].label: \"a\" is not allowed; " + allowed},
           {json{"a", ""}, "zip[0].label[1]: \"\" is not allowed; " + allowed},
           {json{"a\nb", "c"}, "zip[0].label[0]: \"a\\nb\" is not allowed; " + allowed},
           {json{"a", 2}, "zip[0].label[1]: 2 is not allowed; " + allowed},
           {json{"a", "a"}, "zip[0].label: \"a\" is given twice (entries 0 and 1); " + allowed}}) {
    json j = grid_sweep();
    j["zip"][0]["label"] = label;
    INFO(label.dump());
    CHECK_THROWS_WITH(expand_sweep(j, ""), message);
  }
  json j = grid_sweep();
  j["zip"][0] = {{"label", {"a", "b"}}};
  CHECK_THROWS_WITH(expand_sweep(j, ""), Catch::StartsWith("zip[0]: a label list alone varies nothing"));
  for (const std::string where : {"grid", "set", "baseline"}) {
    j = grid_sweep();
    if (where == "grid") j["grid"]["label"] = {"a", "b"};
    if (where == "set") j["set"]["label"] = "a";
    if (where == "baseline") j["baseline"]["set"]["label"] = "a";
    const std::string path = where == "baseline" ? "baseline.set.label" : where + ".label";
    CHECK_THROWS_WITH(expand_sweep(j, ""), path + ": labels name the positions of a zip group; allowed: a \"label\" "
                                                  "list inside a zip group, JSON paths of the config here");
  }
  // A label equal to what another cell shows (a baseline outside the grid,
  // none of whose keys varies, shows its setting) would show two cells alike.
  j = {{"name", "t"}, {"base", "b.json"},
       {"zip", {{{"attention.kind", {"sage", "kinterval"}}, {"label", {"lr=0.5", "K-interval"}}}}},
       {"baseline", {{"set", {{"train.lr", 0.5}}}, {"match", json::array()}}}};
  CHECK_THROWS_WITH(expand_sweep(j, ""), "the label \"lr=0.5\" names two cells (settings kind=sage and lr=0.5); "
                                         "allowed: zip labels that tell the cells apart");
  j["zip"][0]["label"][0] = "sage";
  CHECK(expand_sweep(j, "").runs.back().label == "lr=0.5");
}

// docs/runs.md's sweep example and what its "Sweeps" section says the labels are.
TEST_CASE("docs/runs.md: the example sweep's labels and label errors are the code's", "[sweep][docs]") {
  std::ifstream f(fs::path(QATTN_SOURCE_DIR) / "docs" / "runs.md");
  std::string doc, line, example;
  bool in_example = false, done = false;
  for (bool in_sweeps = false; std::getline(f, line);) {
    in_sweeps = line.rfind("## ", 0) == 0 ? line == "## Sweeps" : in_sweeps;
    if (in_sweeps && !done && line == "```json") {
      in_example = true;
    } else if (in_example && line == "```") {
      in_example = false;
      done = true;
    } else if (in_example) {
      example += line + "\n";
    }
    doc += (doc.empty() ? "" : " ") + line;  // a code span may run over a line break
  }
  REQUIRE(done);
  const json sweep = json::parse(example);
  const Sweep s = expand_sweep(sweep, "");
  const auto shown = [&](const std::string& text) {
    INFO(text);
    CHECK_THAT(doc, Catch::Contains("`" + text + "`"));
  };
  const std::string cell = "kind=sage_rounding=nearest_ste=weight_tokens_per_step=4096_seed=1";
  CHECK(find_run(s, cell).label == "kind=sage, tokens_per_step=4096, nearest, weight-STE");
  shown(find_run(s, cell).label);
  CHECK(find_run(s, "kind=fpa_tokens_per_step=4096_seed=1").label == "kind=fpa, tokens_per_step=4096");
  shown(find_run(s, "kind=fpa_tokens_per_step=4096_seed=1").label);
  json plain = sweep;
  plain["zip"][0].erase("label");
  CHECK(find_run(expand_sweep(plain, ""), cell).label ==
        "kind=sage, tokens_per_step=4096, rounding=nearest, ste=weight");
  shown(find_run(expand_sweep(plain, ""), cell).label);
  json short_list = sweep;
  short_list["zip"][0]["label"] = {"lerp"};
  try {
    expand_sweep(short_list, "");
    FAIL("a label list of the wrong length was taken");
  } catch (const SweepError& e) {
    const std::string message = e.what();
    shown(message.substr(0, message.find(" one per ")) + " ...");
  }
}

// The grids kept in docs/results were run before their sweep files had labels:
// a later visit finds its finished runs under the same folder names and skips
// them (the rule of `qattn sweep`: a run whose folder holds a finished or
// diverged status is skipped; tools/results_store.py restores them by name).
TEST_CASE("the labelled grids find every run kept in docs/results under its folder name", "[sweep]") {
  const fs::path root(QATTN_SOURCE_DIR);
  for (const auto& [sweep_file, store, kept, runs, first_label] :
       std::vector<std::tuple<std::string, std::string, size_t, size_t, std::string>>{
           {"kinterval_small.json", "kinterval_small", 36, 36, "1: FPA"},
           {"kinterval_small.json", "kinterval_small_first", 20, 36, "1: FPA"},
           {"sagebwd_small.json", "sagebwd_small", 2, 57, "1: FPA, no QK-norm, 262k"}}) {
    INFO(store);
    const Sweep s = load_sweep((root / "configs" / "sweeps" / sweep_file).string());
    CHECK(s.runs.size() == runs);
    CHECK(s.runs[0].label == first_label);
    std::set<std::string> labels;
    for (const auto& r : s.runs) labels.insert(r.label);
    for (const auto& l : labels) CHECK_THAT(l, Catch::Matches("[0-9]+: .+"));  // every cell by its number
    size_t found = 0;
    for (const auto& dir : fs::directory_iterator(root / "docs" / "results" / store / "runs")) {
      const std::string id = dir.path().filename().string();
      INFO(id);
      const auto run = std::find_if(s.runs.begin(), s.runs.end(), [&](const SweepRun& r) { return r.id == id; });
      CHECK(run != s.runs.end());
      const std::string status = read_outcome(dir.path().string(), s.eval_last).status;
      CHECK((status == "finished" || status == "diverged"));
      found += run != s.runs.end();
    }
    CHECK(found == kept);
  }
  const Sweep k = load_sweep((root / "configs" / "sweeps" / "kinterval_small.json").string());
  CHECK(find_run(k, "kind=kinterval_K=4_calibration=minmax_detach_extrema=false_rounding=nearest_ste=weight-64c01242")
            .label == "2: minmax, nearest, weight-STE, K=4");
}

TEST_CASE("eval_last and seeds beyond their range are refused as given, never wrapped", "[sweep]") {
  for (const auto& [value, shown] : std::vector<std::pair<json, std::string>>{
           {json(4294967297ll), "4294967297"},           // 2^32 + 1: an int of 1
           {json(-4294967295ll), "-4294967295"},         // an int of 1 too
           {json(18446744073709551615ull), "18446744073709551615"},
           {json(0), "0"}}) {
    json j = grid_sweep();
    j["eval_last"] = value;
    CHECK_THROWS_WITH(expand_sweep(j, ""), "eval_last: " + shown + " is not allowed; allowed: an integer from 1 to "
                                           "2147483647");
  }
  json j = grid_sweep();
  j["seeds"] = {1, 9223372036854775808ull};
  CHECK_THROWS_WITH(expand_sweep(j, ""), "seeds: 9223372036854775808 is not allowed; allowed: an integer from 0 to "
                                         "9223372036854775807");
  j["seeds"] = {1, 2.0};
  CHECK_THROWS_WITH(expand_sweep(j, ""), Catch::Contains("seeds: 2.0 is not allowed"));
  j = grid_sweep();
  j["eval_last"] = 2147483647;
  CHECK(expand_sweep(j, "").eval_last == 2147483647);
}

TEST_CASE("a sweep that sets log.out or log.name, which it sets itself, is refused", "[sweep]") {
  // train_assignments puts the sweep's own log.out and log.name last: a value
  // of the file was dropped without a word, and a grid over one ran one config twice.
  for (const auto& [where, place] : std::vector<std::pair<std::string, std::string>>{
           {"set", "set.log.out"}, {"grid", "grid.log.name"}, {"zip", "zip[0].log.out"},
           {"baseline", "baseline.set.log.name"}}) {
    json j = grid_sweep();
    const std::string key = place.substr(place.rfind("log."));
    if (where == "set") j["set"][key] = "/scratch";
    if (where == "grid") j["grid"][key] = {"a", "b"};
    if (where == "zip") j["zip"][0][key] = {"a", "b"};
    if (where == "baseline") j["baseline"]["set"][key] = "b";
    CHECK_THROWS_WITH(expand_sweep(j, ""), Catch::Contains(place + ": the sweep sets it") &&
                                               Catch::Contains("allowed: the sweep's \"out\" and \"name\""));
  }
}

TEST_CASE("the summary: mean of the last E evals, mean and std over seeds, gaps to the baseline", "[sweep]") {
  const auto d = scratch_dir("sweep_summary");
  json j = {{"name", "s"}, {"base", "b.json"}, {"out", d.string()}, {"eval_last", 2},
            {"grid", {{"attention.kind", {"fpa", "sage"}}}}, {"seeds", {1, 2, 3}},
            {"baseline", {{"set", {{"attention.kind", "fpa"}}}}}};
  const Sweep s = expand_sweep(j, "");
  REQUIRE(s.runs.size() == 6);
  // Final val loss = mean of the last 2 evaluations: fpa 2.0, 2.2, 2.4; sage 2.5, 2.9 and one diverged.
  fake_run(d / "s" / "kind=fpa_seed=1", "finished", {5.0, 2.1, 1.9});
  fake_run(d / "s" / "kind=fpa_seed=2", "finished", {5.0, 2.2, 2.2});
  fake_run(d / "s" / "kind=fpa_seed=3", "finished", {2.5, 2.3});
  fake_run(d / "s" / "kind=sage_seed=1", "finished", {2.4, 2.6});
  fake_run(d / "s" / "kind=sage_seed=2", "finished", {3.0, 2.8});
  fake_run(d / "s" / "kind=sage_seed=3", "diverged", {4.0});
  std::vector<RunOutcome> outcomes;
  for (const auto& r : s.runs) outcomes.push_back(read_outcome((d / "s" / r.id).string(), s.eval_last));
  CHECK(outcomes[0].final_val_loss == Approx(2.0));
  CHECK(outcomes[0].tokens_per_s() == Approx(150.0));

  const auto stats = setting_stats(s, outcomes);
  REQUIRE(stats.size() == 2);
  CHECK(stats[0].setting == "kind=fpa");
  CHECK(stats[0].mean == Approx(2.2));
  CHECK(stats[0].std == Approx(0.2));
  CHECK(std::isnan(stats[0].gap));
  CHECK(stats[1].finished == 2);
  CHECK(stats[1].diverged == 1);
  CHECK(stats[1].mean == Approx(2.7));
  CHECK(stats[1].std == Approx(std::sqrt(0.08)));
  CHECK(stats[1].gap == Approx(0.5));
  CHECK(run_gap(s, outcomes, 3) == Approx(0.5));   // sage seed 1 - fpa seed 1
  CHECK(run_gap(s, outcomes, 4) == Approx(0.7));
  CHECK(std::isnan(run_gap(s, outcomes, 5)));      // diverged

  CHECK(stats[1].paired.n == 2);  // seeds 1 and 2; seed 3 diverged
  CHECK(stats[1].paired.mean == Approx(0.6));
  CHECK(stats[1].paired.std == Approx(std::sqrt(0.02)));
  // t(0.975, 1) = 12.7062: the interval [0.6 - 12.7062 * 0.1, 0.6 + 12.7062 * 0.1] spans 0.
  CHECK(stats[1].paired.ci_low == Approx(0.6 - 1.27062));
  CHECK_FALSE(stats[1].paired.significant());
  CHECK(stats[0].paired.n == 0);  // the baseline has no gap of its own

  const std::string md = write_summary(s, outcomes);
  CHECK_THAT(md, Catch::Contains("| kind=sage | kind=fpa | 2/3 | 2.7000 ± 0.2828 | +0.6000 ± 0.1414 | "
                                 "[-0.6706, +1.8706] | 2 | no | **1 diverged** |"));
  CHECK_THAT(md, Catch::Contains("| kind=sage | 3 | **diverged** | 1 | 100 |"));
  const std::string csv = read_text(d / "s" / "summary.csv");
  CHECK_THAT(csv, Catch::StartsWith("id,label,setting,attention.kind,train.seed,status,"));
  CHECK_THAT(csv, Catch::Contains("kind=sage_seed=3,kind=sage,kind=sage,sage,3,diverged,"));
  CHECK_THAT(csv, Catch::Contains(",2,0.600000,0.141421,-0.670620,1.870620,no\n"));
}

TEST_CASE("Student-t quantile: equal to the 12-digit reference at every df 1..200", "[sweep]") {
  // tests/reference/student_t_975.csv (mpmath, its header says how) is also what
  // tests/tools/test_repro_tools.py holds tools/gap_table.py to: both within 1e-9
  // of it, so the two agree to far better than the 1e-4 their tables print.
  std::ifstream f(std::string(QATTN_SOURCE_DIR) + "/tests/reference/student_t_975.csv");
  REQUIRE(f);
  std::string line;
  int rows = 0;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    const int df = std::stoi(line.substr(0, line.find(',')));
    const double t = std::stod(line.substr(line.find(',') + 1));
    INFO("df " << df);
    CHECK(std::abs(student_t_975(df) - t) < 1e-9);
    ++rows;
  }
  CHECK(rows == 200);
}

TEST_CASE("paired gaps: mean, std and Student-t 95% interval over seeds", "[sweep]") {
  // Known answers: t(0.975) from printed tables, to their 4 decimals; df 10^6 stands for
  // infinity, where t is the normal's 1.95996.
  const std::pair<int, double> printed[] = {{1, 12.7062}, {2, 4.3027},  {3, 3.1824},   {10, 2.2281},
                                            {30, 2.0423}, {60, 2.0003}, {120, 1.9799}, {1000000, 1.9600}};
  for (const auto& [df, t] : printed) {
    INFO("df " << df);
    CHECK(std::abs(student_t_975(df) - t) < 0.6e-4);
  }
  CHECK_THROWS(student_t_975(0));

  const PairedGap g = paired_gap({0.1, 0.2, 0.3});
  CHECK(g.n == 3);
  CHECK(g.mean == Approx(0.2));
  CHECK(g.std == Approx(0.1));
  const double half = 4.3027 * 0.1 / std::sqrt(3.0);
  CHECK(g.ci_low == Approx(0.2 - half).epsilon(1e-4));
  CHECK(g.ci_high == Approx(0.2 + half).epsilon(1e-4));
  CHECK_FALSE(g.significant());  // [-0.048, +0.448] spans 0
  CHECK(paired_gap({0.05, 0.048, 0.052}).significant());
  CHECK(paired_gap({-0.05, -0.048, -0.052}).significant());
  const PairedGap one = paired_gap({0.3});
  CHECK(one.mean == Approx(0.3));
  CHECK(std::isnan(one.std));
  CHECK_FALSE(one.significant());  // one seed proves nothing
  CHECK(paired_gap({}).n == 0);
}

TEST_CASE("an interrupted run shows its last evaluation and its state, never a final val loss", "[sweep]") {
  const auto d = scratch_dir("sweep_interrupted");
  json j = {{"name", "s"}, {"base", "b.json"}, {"out", d.string()}, {"grid", {{"attention.kind", {"fpa", "sage"}}}}};
  const Sweep s = expand_sweep(j, "");
  fake_run(d / "s" / "kind=fpa", "finished", {2.5, 2.1});
  fake_run(d / "s" / "kind=sage", "interrupted", {});  // stopped before its first evaluation after step 0
  std::vector<RunOutcome> outcomes;
  for (const auto& r : s.runs) outcomes.push_back(read_outcome((d / "s" / r.id).string(), s.eval_last));
  CHECK(outcomes[0].final_val_loss == Approx(2.1));
  CHECK(outcomes[1].status == "interrupted");
  CHECK(std::isnan(outcomes[1].final_val_loss));  // not the step-0 loss as if it had finished
  CHECK(outcomes[1].last_val_loss == Approx(9.0));
  CHECK(outcomes[1].last_val_step == 0);
  const std::string md = write_summary(s, outcomes);
  CHECK_THAT(md, Catch::Contains("| kind=sage | **interrupted**; last evaluation 9.0000 at step 0 | 0 | 0 |  |"));
  CHECK_THAT(md, Catch::Contains("| kind=sage |  | 0/1 | — |"));

  fake_run(d / "s" / "kind=sage", "interrupted", {3.0, 2.7});
  const RunOutcome later = read_outcome((d / "s" / "kind=sage").string(), s.eval_last);
  CHECK(std::isnan(later.final_val_loss));
  CHECK(later.last_val_loss == Approx(2.7));
  CHECK(later.last_val_step == 2);
}

TEST_CASE("qattn sweep runs a grid, records a divergence and skips finished runs", "[sweep][cli]") {
  const auto d = scratch_dir("sweep_cli");
  make_corpus(d);
  write_json(d / "base.json", tiny_config(d, "base", 6));
  const auto sweep = write_json(d / "sweep.json", {{"name", "demo"}, {"base", "base.json"}, {"out", (d / "runs").string()},
                                                  {"grid", {{"train.lr", {0.01, 0.003}}}}});
  const fs::path dir = d / "runs" / "demo";
  // The NaN hook makes every run diverge at step 5: both are recorded, the sweep goes on.
  CHECK(exit_code(run_qattn({"sweep", sweep.string(), "--jobs", "2"}, {{"QATTN_TEST_NAN_AT_STEP", "5"}}, d / "log.txt")) == 0);
  CHECK_THAT(read_text(dir / "summary.csv"), Catch::Contains("lr=0.01,lr=0.01,0.01,diverged,non-finite train loss"));
  CHECK(fs::path(latest_checkpoint((dir / "lr=0.01").string())).filename() == "step_00000004");

  // A diverged run is done: running again starts nothing.
  CHECK(exit_code(run_qattn({"sweep", sweep.string()}, {}, d / "log.txt")) == 0);
  CHECK_THAT(read_text(d / "log.txt"), Catch::Contains("2 runs, 0 to run"));

  // A run killed mid-way (its status still says "running") resumes from its checkpoint and finishes.
  write_json(dir / "lr=0.003" / "status.json", {{"status", "running"}});
  CHECK(exit_code(run_qattn({"sweep", sweep.string()}, {}, d / "log.txt")) == 0);
  const json st = json::parse(read_text(dir / "lr=0.003" / "status.json"));
  CHECK(st["status"] == "finished");
  CHECK(st["step"] == 6);
  CHECK_THAT(read_text(dir / "summary.md"), Catch::Contains("| lr=0.003 | finished | 6 | 768 |"));
}

TEST_CASE("sweep --start-until: no run starts after the time, and the next invocation starts them", "[sweep][cli]") {
  const auto d = scratch_dir("sweep_start_until");
  make_corpus(d);
  write_json(d / "base.json", tiny_config(d, "base", 4));
  const auto sweep = write_json(d / "sweep.json", {{"name", "u"}, {"base", "base.json"}, {"out", (d / "runs").string()},
                                                  {"grid", {{"train.lr", {0.01, 0.003}}}}});
  // A time in the past: nothing starts, exit 4 (stopped), and the log says how many wait.
  CHECK(exit_code(run_qattn({"sweep", sweep.string(), "--start-until", "1"}, {}, d / "log.txt")) == 4);
  CHECK_THAT(read_text(d / "log.txt"), Catch::Contains("2 runs not started"));
  CHECK_FALSE(fs::exists(d / "runs" / "u" / "lr=0.01"));
  // A time far ahead: both run.
  CHECK(exit_code(run_qattn({"sweep", sweep.string(), "--start-until", "99999999999"}, {}, d / "log.txt")) == 0);
  CHECK_THAT(read_text(d / "runs" / "u" / "summary.csv"), Catch::Contains("lr=0.003,lr=0.003,0.003,finished"));
}

TEST_CASE("SIGTERM stops a sweep with checkpoints; the next invocation finishes it", "[sweep][cli]") {
  const auto d = scratch_dir("sweep_term");
  make_corpus(d);
  json base = tiny_config(d, "base", 3000);
  base["train"]["checkpoint_every"] = 0;
  write_json(d / "base.json", base);
  const auto sweep = write_json(d / "sweep.json", {{"name", "t"}, {"base", "base.json"}, {"out", (d / "runs").string()},
                                                  {"grid", {{"train.lr", {0.01}}}}});
  const fs::path run = d / "runs" / "t" / "lr=0.01";
  const pid_t pid = spawn_qattn({"sweep", sweep.string()}, {}, d / "log.txt");
  for (int i = 0; i < 3000 && loss_columns(run / "metrics.csv").size() < 5; ++i) ::usleep(20000);
  ::kill(pid, SIGTERM);  // the sweep alone: it forwards the request to its runs
  int status = 0;
  ::waitpid(pid, &status, 0);
  CHECK(exit_code(status) == 4);
  const json st = json::parse(read_text(run / "status.json"));
  CHECK(st["status"] == "interrupted");
  CHECK(fs::path(latest_checkpoint(run.string())).filename().string() ==
        fmt::format("step_{:08d}", st["step"].get<int64_t>()));
  CHECK_THAT(read_text(d / "runs" / "t" / "summary.md"), Catch::Contains("**interrupted**"));

  CHECK(exit_code(run_qattn({"sweep", sweep.string()}, {}, d / "log.txt")) == 0);
  CHECK(json::parse(read_text(run / "status.json"))["step"] == 3000);
  CHECK(loss_columns(run / "metrics.csv").size() == 3001);
}
