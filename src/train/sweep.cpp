// Sweep files -> runs with stable ids, and run outcomes -> summary tables.
#include "qattn/atomic_file.hpp"
#include "qattn/attention.hpp"
#include "qattn/config.hpp"
#include "qattn/json_file.hpp"
#include "qattn/sweep.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

namespace qattn {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kSeedKey = "train.seed";
constexpr const char* kLabelKey = "label";  // a zip group's names of its positions, not a JSON path
constexpr size_t kMaxIdChars = 100;

// ---------------------------------------------------------------------------
// Expansion

// One axis of the product: a grid key alone, or a zip group of keys advanced together.
struct Axis {
  std::vector<std::string> keys;
  std::vector<std::vector<json>> values;  // values[i][k]: the i-th point, key k
  std::vector<std::string> labels;        // labels[i]: the i-th point's label; empty: none given
};

const json& list_at(const json& j, const std::string& path) {
  if (!j.is_array() || j.empty())
    throw SweepError(path + ": " + j.dump() + " is not allowed; allowed: a non-empty list of values");
  return j;
}

void check_key(const std::string& key, const std::string& where) {
  if (key.empty() || key.front() == '.' || key.back() == '.' || key.find("..") != std::string::npos)
    throw SweepError(where + ": '" + key + "' is not a JSON path; allowed: dotted keys like attention.kind");
  if (key == kSeedKey) throw SweepError(where + ": give seeds with the sweep's \"seeds\" list, not " + key);
  if (key == kLabelKey)
    throw SweepError(where + ".label: labels name the positions of a zip group; allowed: a \"label\" list inside a "
                     "zip group, JSON paths of the config here");
  // train_assignments sets both after the sweep's own keys, so a value given
  // here would be dropped without a word (and a grid over one would run one
  // config several times).
  if (key == "log.out" || key == "log.name")
    throw SweepError(where + "." + key + ": the sweep sets it (runs go to <out>/<name>/<run id>); allowed: the "
                     "sweep's \"out\" and \"name\" for where the runs go, other keys here");
}

// An integer of the sweep file within [lo, hi], compared as the file gives it
// (a JSON integer is int64, or uint64 from 2^63 on), never wrapped to an int.
int64_t integer_in(const json& v, const std::string& where, int64_t lo, int64_t hi) {
  bool fits = false;
  if (v.is_number_unsigned())
    fits = v.get<uint64_t>() <= static_cast<uint64_t>(hi) && static_cast<int64_t>(v.get<uint64_t>()) >= lo;
  else if (v.is_number_integer())
    fits = v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
  if (!fits)
    throw SweepError(where + ": " + v.dump() + " is not allowed; allowed: an integer from " + std::to_string(lo) +
                     " to " + std::to_string(hi));
  return v.get<int64_t>();
}

// Two equal points of one axis would be one run: the second would vanish
// without a word, and the cell would have fewer runs than the file lists.
void check_distinct(const Axis& a, const std::string& where) {
  for (size_t i = 0; i < a.values.size(); ++i)
    for (size_t k = 0; k < i; ++k)
      if (a.values[i] == a.values[k]) {
        const std::string value = a.keys.size() == 1 ? a.values[i][0].dump() : json(a.values[i]).dump();
        throw SweepError(where + ": " + value + " is given twice (entries " + std::to_string(k) + " and " +
                         std::to_string(i) + "); allowed: distinct values, each one run");
      }
}

// A zip group's "label" list: one distinct, non-empty, one-line string per position.
std::vector<std::string> read_labels(const json& list, const Axis& a, const std::string& where) {
  const size_t n = a.values.size();
  const std::string allowed = "allowed: a list of " + std::to_string(n) + " distinct non-empty one-line strings, one "
                              "per position of the group (" + a.keys[0] + " has " + std::to_string(n) + " values)";
  if (!list.is_array()) throw SweepError(where + ": " + list.dump() + " is not allowed; " + allowed);
  if (list.size() != n)
    throw SweepError(where + ": " + std::to_string(list.size()) + " labels, but " + a.keys[0] + " has " +
                     std::to_string(n) + " values; " + allowed);
  // A label is a cell of summary.md's tables: one line, no control characters.
  const auto one_line = [](const std::string& t) {
    return !t.empty() && std::none_of(t.begin(), t.end(), [](unsigned char c) { return c < 0x20 || c == 0x7f; });
  };
  std::vector<std::string> labels;
  for (size_t i = 0; i < n; ++i) {
    if (!list[i].is_string() || !one_line(list[i].get<std::string>()))
      throw SweepError(where + "[" + std::to_string(i) + "]: " + list[i].dump() + " is not allowed; " + allowed);
    for (size_t k = 0; k < i; ++k)
      if (labels[k] == list[i].get<std::string>())
        throw SweepError(where + ": " + list[i].dump() + " is given twice (entries " + std::to_string(k) + " and " +
                         std::to_string(i) + "); " + allowed);
    labels.push_back(list[i]);
  }
  return labels;
}

std::vector<Axis> read_axes(const json& j) {
  std::vector<Axis> axes;
  if (j.contains("grid")) {
    if (!j["grid"].is_object()) throw SweepError("grid: expected an object {\"json.path\": [values]}");
    for (const auto& [key, values] : j["grid"].items()) {
      check_key(key, "grid");
      Axis a{{key}, {}, {}};
      for (const auto& v : list_at(values, "grid." + key)) a.values.push_back({v});
      check_distinct(a, "grid." + key);
      axes.push_back(std::move(a));
    }
  }
  if (j.contains("zip")) {
    if (!j["zip"].is_array()) throw SweepError("zip: expected a list of objects {\"json.path\": [values]}");
    for (size_t g = 0; g < j["zip"].size(); ++g) {
      const json& group = j["zip"][g];
      const std::string where = "zip[" + std::to_string(g) + "]";
      if (!group.is_object() || group.empty()) throw SweepError(where + ": expected an object {\"json.path\": [values]}");
      Axis a;
      size_t n = 0;
      for (const auto& [key, values] : group.items()) {
        if (key == kLabelKey) continue;
        check_key(key, where);
        const json& list = list_at(values, where + "." + key);
        if (a.keys.empty()) n = list.size();
        if (list.size() != n)
          throw SweepError(where + "." + key + ": " + std::to_string(list.size()) + " values, but " + a.keys[0] +
                           " has " + std::to_string(n) + "; allowed: lists of one length in a zip group");
        a.keys.push_back(key);
      }
      if (a.keys.empty())
        throw SweepError(where + ": a label list alone varies nothing; allowed: {\"json.path\": [values], ..., "
                         "\"label\": [one name per position]}");
      a.values.assign(n, {});
      for (size_t i = 0; i < n; ++i)
        for (const auto& key : a.keys) a.values[i].push_back(group[key][i]);
      check_distinct(a, where);
      if (group.contains(kLabelKey)) a.labels = read_labels(group[kLabelKey], a, where + ".label");
      axes.push_back(std::move(a));
    }
  }
  std::set<std::string> seen;
  for (const auto& a : axes)
    for (const auto& k : a.keys)
      if (!seen.insert(k).second) throw SweepError(k + ": varied twice (in grid and zip, or in two zip groups)");
  return axes;
}

// A point of the product of the axes: its overrides {path: value} and its
// position on each axis.
struct GridPoint {
  json overrides = json::object();
  std::vector<size_t> at;  // at[a]: the point's position on axis a
};

std::vector<GridPoint> product(const std::vector<Axis>& axes) {
  std::vector<GridPoint> points(1);
  for (const auto& a : axes) {
    std::vector<GridPoint> next;
    for (const auto& p : points)
      for (size_t i = 0; i < a.values.size(); ++i) {
        GridPoint q = p;
        for (size_t k = 0; k < a.keys.size(); ++k) q.overrides[a.keys[k]] = a.values[i][k];
        q.at.push_back(i);
        next.push_back(std::move(q));
      }
    points = std::move(next);
  }
  return points;
}

std::string slug_value(const json& v) {
  std::string s = v.is_string() ? v.get<std::string>() : v.dump();
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '+') c = '-';
  return s;
}

std::string hash_hex(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return fmt::format("{:08x}", static_cast<uint32_t>(h ^ (h >> 32)));
}

json without_seed(json o) {
  o.erase(kSeedKey);
  return o;
}

// ---------------------------------------------------------------------------
// Outcomes and summary

std::string fmt_num(double x, const char* f = "{:.4f}") {
  return std::isfinite(x) ? fmt::format(fmt::runtime(f), x) : std::string();
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string md_cell(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

// A path as summary.md shows it: relative to the working directory when it
// lies under it, so that a summary made in another checkout reads the same.
std::string shown_path(const std::string& path) {
  const fs::path whole = fs::absolute(path).lexically_normal();
  const fs::path under = whole.lexically_relative(fs::current_path());
  return !under.empty() && *under.begin() != ".." ? under.string() : whole.string();
}

std::string value_text(const json& overrides, const std::string& key) {
  if (!overrides.contains(key)) return "";
  const json& v = overrides[key];
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// ---------------------------------------------------------------------------
// Labels

// Whether a cell ignores key: an option of an attention kind (attention.sage.*,
// attention.kinterval.*) other than the cell's attention.kind.
bool ignored_by_kind(const json& overrides, const std::string& key) {
  const auto kind = overrides.find("attention.kind");
  if (kind == overrides.end() || !kind->is_string()) return false;
  for (const auto& n : kAttentionKindNames)
    if (key.rfind(std::string("attention.") + n.name + ".", 0) == 0) return *kind != n.name;
  return false;
}

// Sets SweepRun::label of every run (sweep.hpp). at: each grid setting's
// position on every axis; a baseline that the grid does not hold has none,
// and its label names its varied keys.
void label_settings(Sweep& s, const std::vector<Axis>& axes, const std::map<std::string, std::vector<size_t>>& at) {
  std::vector<const SweepRun*> settings;  // the first run of each setting
  std::set<std::string> seen;
  for (const auto& r : s.runs)
    if (seen.insert(r.setting).second) settings.push_back(&r);
  // The keys whose values differ between settings (a key that a setting lacks
  // counts as a value of its own), each named by its last path component, the
  // full path where two share it.
  std::vector<std::string> varying;
  for (const auto& k : s.keys) {
    std::set<std::string> values;
    for (const SweepRun* r : settings) values.insert(r->overrides.contains(k) ? r->overrides[k].dump() : "");
    if (k != kSeedKey && values.size() > 1) varying.push_back(k);
  }
  const auto last = [](const std::string& k) { return k.substr(k.rfind('.') + 1); };
  std::map<std::string, int> sharing;
  for (const auto& k : varying) ++sharing[last(k)];
  std::map<std::string, std::string> name;
  for (const auto& k : varying) name[k] = sharing[last(k)] > 1 ? k : last(k);

  const auto compose = [&](const SweepRun& r, bool keep_ignored) {
    std::vector<std::string> parts;
    const auto add_keys = [&](const std::vector<std::string>& keys) {
      for (const auto& k : keys)
        if (name.count(k) && r.overrides.contains(k) && (keep_ignored || !ignored_by_kind(r.overrides, k)))
          parts.push_back(name[k] + "=" + value_text(r.overrides, k));
    };
    if (const auto point = at.find(r.setting); point == at.end()) {
      add_keys(s.keys);
    } else {
      for (size_t a = 0; a < axes.size(); ++a) {
        if (axes[a].labels.empty())
          add_keys(axes[a].keys);
        else
          parts.push_back(axes[a].labels[point->second[a]]);
      }
    }
    std::string label;
    for (const auto& p : parts) label += (label.empty() ? "" : ", ") + p;
    return label;
  };
  std::map<std::string, std::string> label;  // setting -> label
  for (const SweepRun* r : settings) label[r->setting] = compose(*r, false);
  // Settings that differ only in keys their kinds ignore show those keys too;
  // settings that still share a label, or have none, show their setting.
  for (const bool keep_ignored : {true, false}) {
    std::map<std::string, int> uses;
    for (const auto& [setting, text] : label) ++uses[text];
    for (const SweepRun* r : settings)
      if (uses[label[r->setting]] > 1 || label[r->setting].empty())
        label[r->setting] = keep_ignored ? compose(*r, true) : r->setting;
  }
  std::map<std::string, std::string> owner;  // label -> setting
  for (const SweepRun* r : settings)
    if (const auto [it, fresh] = owner.emplace(label[r->setting], r->setting); !fresh)
      throw SweepError("the label \"" + it->first + "\" names two cells (settings " + it->second + " and " +
                       r->setting + "); allowed: zip labels that tell the cells apart");
  for (auto& r : s.runs) r.label = label[r.setting];
}

}  // namespace

std::string Sweep::dir() const { return (fs::path(out) / name).string(); }

std::string run_id(const json& overrides) {
  std::map<std::string, int> last_count;
  auto last = [](const std::string& k) { return k.substr(k.rfind('.') + 1); };
  for (const auto& [k, v] : overrides.items()) ++last_count[last(k)];
  std::vector<std::string> parts;  // "key=value", the seed last
  auto add = [&](const std::string& k, const json& v) {
    parts.push_back((last_count[last(k)] > 1 ? k : last(k)) + "=" + slug_value(v));
  };
  for (const auto& [k, v] : overrides.items())  // json objects iterate in key order
    if (k != kSeedKey) add(k, v);
  if (overrides.contains(kSeedKey)) add(kSeedKey, overrides[kSeedKey]);
  if (parts.empty()) return "base";
  std::string id;
  for (const auto& p : parts) id += (id.empty() ? "" : "_") + p;
  if (id.size() <= kMaxIdChars) return id;
  // Too long: keep whole "key=value" parts (never a value cut in the middle,
  // which would read as another value), then a hash of all overrides.
  id.clear();
  for (const auto& p : parts) {
    const size_t grown = id.size() + (id.empty() ? 0 : 1) + p.size();
    if (grown > kMaxIdChars - 9) break;  // room for "-" + 8 hex digits
    id += (id.empty() ? "" : "_") + p;
  }
  if (id.empty()) id = parts.front().substr(0, kMaxIdChars - 9);  // one part alone is too long
  return id + "-" + hash_hex(overrides.dump());
}

Sweep expand_sweep(const json& j, const std::string& source) {
  if (!j.is_object()) throw SweepError("expected a JSON object");
  static const std::set<std::string> known = {"name", "base", "out", "set", "grid", "zip", "seeds", "baseline", "eval_last"};
  for (const auto& [k, v] : j.items())
    if (!known.count(k))
      throw SweepError(k + ": unknown key; allowed keys: base, baseline, eval_last, grid, name, out, seeds, set, zip");
  Sweep s;
  for (const char* key : {"name", "base"})
    if (!j.contains(key) || !j[key].is_string() || j[key].get<std::string>().empty())
      throw SweepError(std::string(key) + ": required, a non-empty string");
  s.name = j["name"];
  if (const std::string problem = folder_name_problem(s.name); !problem.empty())
    throw SweepError("name: " + problem);
  const fs::path base = j["base"].get<std::string>();
  s.base = (base.is_absolute() || source.empty() ? base : fs::path(source).parent_path() / base).lexically_normal().string();
  if (j.contains("out")) {
    if (!j["out"].is_string()) throw SweepError("out: expected a string (the parent folder of runs/<name>)");
    s.out = j["out"];
  }
  if (j.contains("set")) {
    if (!j["set"].is_object()) throw SweepError("set: expected an object {\"json.path\": value}");
    for (const auto& [k, v] : j["set"].items()) check_key(k, "set");
    s.set = j["set"];
  }
  if (j.contains("eval_last"))
    s.eval_last = static_cast<int>(integer_in(j["eval_last"], "eval_last", 1, std::numeric_limits<int>::max()));
  std::vector<json> seeds;
  if (j.contains("seeds")) {
    for (const auto& seed : list_at(j["seeds"], "seeds")) {
      integer_in(seed, "seeds", 0, std::numeric_limits<int64_t>::max());  // train.seed's range
      seeds.push_back(seed);
    }
    check_distinct(Axis{{kSeedKey}, [&] {
                     std::vector<std::vector<json>> v;
                     for (const auto& seed : seeds) v.push_back({seed});
                     return v;
                   }(), {}},
                   "seeds");
  }

  const auto axes = read_axes(j);
  for (const auto& a : axes) s.keys.insert(s.keys.end(), a.keys.begin(), a.keys.end());
  auto with_seeds = [&](const json& point) {
    std::vector<json> out;
    if (seeds.empty()) return std::vector<json>{point};
    for (const auto& seed : seeds) {
      json o = point;
      o[kSeedKey] = seed;
      out.push_back(std::move(o));
    }
    return out;
  };
  std::map<std::string, size_t> index;  // id -> position in s.runs
  auto add_run = [&](const json& overrides) -> SweepRun& {
    const std::string id = run_id(overrides);
    const auto it = index.find(id);
    if (it != index.end()) {
      if (s.runs[it->second].overrides != overrides)
        throw SweepError("runs " + s.runs[it->second].overrides.dump() + " and " + overrides.dump() +
                         " map to the same id '" + id + "'; change a value so their ids differ");
      return s.runs[it->second];
    }
    index[id] = s.runs.size();
    s.runs.push_back({id, run_id(without_seed(overrides)), overrides, false, "", ""});  // label_settings labels it
    return s.runs.back();
  };
  std::map<std::string, std::vector<size_t>> at;  // setting -> its grid point's positions
  for (const auto& p : product(axes)) {
    for (const auto& o : with_seeds(p.overrides)) add_run(o);
    at[run_id(p.overrides)] = p.at;
  }

  if (j.contains("baseline")) {
    const json& b = j["baseline"];
    if (!b.is_object() || !b.contains("set") || !b["set"].is_object() || b["set"].empty())
      throw SweepError("baseline: expected {\"set\": {\"json.path\": value}, \"match\": [json paths]}");
    for (const auto& [k, v] : b.items())
      if (k != "set" && k != "match") throw SweepError("baseline." + k + ": unknown key; allowed keys: match, set");
    std::vector<std::string> match;
    if (b.contains("match")) {
      if (!b["match"].is_array()) throw SweepError("baseline.match: expected a list of varied JSON paths");
      for (const auto& m : b["match"]) {
        if (!m.is_string() || std::find(s.keys.begin(), s.keys.end(), m.get<std::string>()) == s.keys.end())
          throw SweepError("baseline.match: " + m.dump() + " is not one of the varied keys (grid or zip)");
        match.push_back(m);
      }
    } else {  // default: the same other settings, i.e. every varied key the baseline does not set
      for (const auto& k : s.keys)
        if (!b["set"].contains(k)) match.push_back(k);
    }
    for (const auto& [k, v] : b["set"].items()) check_key(k, "baseline.set");
    const size_t grid_runs = s.runs.size();
    for (size_t i = 0; i < grid_runs; ++i) {
      json bo = b["set"];
      for (const auto& m : match) bo[m] = s.runs[i].overrides[m];
      if (s.runs[i].overrides.contains(kSeedKey)) bo[kSeedKey] = s.runs[i].overrides[kSeedKey];
      const std::string setting = run_id(without_seed(bo));
      SweepRun& baseline = add_run(bo);  // may reallocate s.runs: index again below
      baseline.is_baseline = true;
      if (s.runs[i].setting != setting) s.runs[i].baseline = setting;
    }
    for (auto& r : s.runs)
      if (r.is_baseline) r.baseline.clear();
  }
  if (seeds.size()) s.keys.push_back(kSeedKey);
  label_settings(s, axes, at);
  return s;
}

Sweep load_sweep(const std::string& path) {
  json j;
  try {
    j = read_json_file(path, "sweep file");
  } catch (const JsonError& e) {
    throw SweepError(e.what());
  }
  try {
    return expand_sweep(j, path);
  } catch (const SweepError& e) {
    throw SweepError(path + ": " + e.what());
  }
}

std::vector<std::string> train_assignments(const Sweep& s, const SweepRun& r) {
  std::vector<std::string> out;
  for (const auto& [k, v] : s.set.items()) out.push_back(k + "=" + v.dump());
  for (const auto& [k, v] : r.overrides.items()) out.push_back(k + "=" + v.dump());
  out.push_back("log.out=" + json(s.dir()).dump());
  out.push_back("log.name=" + json(r.id).dump());
  return out;
}

double mean_of_last(const std::vector<double>& xs, int count) {
  if (xs.empty()) return std::numeric_limits<double>::quiet_NaN();
  const size_t n = std::min(xs.size(), static_cast<size_t>(count));
  double sum = 0;
  for (size_t i = xs.size() - n; i < xs.size(); ++i) sum += xs[i];
  return sum / n;
}

RunOutcome read_outcome(const std::string& run_dir, int eval_last) {
  RunOutcome o;
  const fs::path dir(run_dir);
  if (!fs::exists(dir)) return o;
  o.status = "incomplete";
  if (std::ifstream f(dir / "status.json"); f) {
    try {
      const json st = json::parse(f);
      const std::string status = st.value("status", "");
      if (status != "running") o.status = status;  // "running" after the process is gone: it was killed
      o.reason = st.value("reason", "");
      o.steps = st.value("step", int64_t{0});
      o.tokens = st.value("tokens", int64_t{0});
      o.skipped = st.value("skipped", int64_t{0});
      o.train_seconds = st.value("train_seconds", 0.0);
      o.wall_seconds = st.value("wall_seconds", 0.0);
    } catch (const json::exception& e) {
      o.reason = "status.json: " + json_error_text(e);
    }
  }
  // Final val loss: the evaluations after step 0 (step 0 alone when there is no other).
  std::ifstream m(dir / "metrics.csv");
  std::string line;
  std::getline(m, line);
  int val_col = -1;
  {
    std::stringstream ss(line);
    std::string name;
    for (int c = 0; std::getline(ss, name, ','); ++c)
      if (name == "val_loss") val_col = c;
  }
  std::vector<double> vals;
  double val0 = std::numeric_limits<double>::quiet_NaN();
  while (val_col >= 0 && std::getline(m, line)) {
    std::stringstream ss(line);
    std::string field, step;
    std::getline(ss, step, ',');
    for (int c = 1; c <= val_col && std::getline(ss, field, ','); ++c) {}
    if (field.empty() || val_col == 0) continue;
    const double v = std::strtod(field.c_str(), nullptr);
    o.last_val_loss = v;
    o.last_val_step = std::strtoll(step.c_str(), nullptr, 10);
    if (o.last_val_step == 0)
      val0 = v;
    else
      vals.push_back(v);
  }
  // Only a run that ended has a final val loss: an interrupted one shows its
  // last evaluation instead (in the status), never as if it had finished.
  if (o.status == "finished" || o.status == "diverged")
    o.final_val_loss = vals.empty() ? val0 : mean_of_last(vals, eval_last);
  return o;
}

namespace {

// The regularised incomplete beta function I_x(a, b), from its continued
// fraction (evaluated by the modified Lentz method), which converges fast for
// x < (a + 1) / (a + b + 2); above that, the symmetry I_x(a, b) = 1 - I_{1-x}(b, a).
double incomplete_beta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  if (x > (a + 1) / (a + b + 2)) return 1 - incomplete_beta(b, a, 1 - x);
  const double tiny = 1e-300;
  // 1 + d1/(1 + d2/(1 + ...)): d(2m) = m(b-m)x / ((a+2m-1)(a+2m)),
  // d(2m+1) = -(a+m)(a+b+m)x / ((a+2m)(a+2m+1)).
  double f = 1, c = 1, d = 0;
  for (int i = 1; i <= 10000; ++i) {
    const int m = i / 2;
    const double coef = i % 2 == 0 ? m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
                                    : -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1));
    d = 1 + coef * d;
    c = 1 + coef / c;
    d = 1 / (std::abs(d) < tiny ? tiny : d);
    if (std::abs(c) < tiny) c = tiny;
    f *= c * d;
    if (std::abs(c * d - 1) < 1e-15) break;
  }
  const double log_front = std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x);
  return std::exp(log_front) / (a * f);
}

}  // namespace

double student_t_975(int df) {
  if (df < 1) throw std::invalid_argument("student_t_975: df " + std::to_string(df) + " is not allowed; allowed: >= 1");
  // Computed, not tabulated, so that every df is exact (a table interpolated
  // beyond its last row is off in the third decimal) and tools/gap_table.py,
  // which computes it the same way, prints the same intervals as `qattn sweep`.
  // P(|T| > t) = I_{df/(df+t^2)}(df/2, 1/2) falls as t grows: bisect it onto 0.05.
  const auto two_sided_tail = [df](double t) { return incomplete_beta(0.5 * df, 0.5, df / (df + t * t)); };
  double lo = 0, hi = 1;
  while (two_sided_tail(hi) > 0.05) hi *= 2;
  for (int i = 0; i < 100 && hi - lo > 1e-13; ++i) {
    const double mid = 0.5 * (lo + hi);
    (two_sided_tail(mid) > 0.05 ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

PairedGap paired_gap(const std::vector<double>& differences) {
  PairedGap g;
  g.n = static_cast<int>(differences.size());
  if (g.n == 0) return g;
  double sum = 0;
  for (double d : differences) sum += d;
  g.mean = sum / g.n;
  if (g.n < 2) return g;
  double ss = 0;
  for (double d : differences) ss += (d - g.mean) * (d - g.mean);
  g.std = std::sqrt(ss / (g.n - 1));
  const double half = student_t_975(g.n - 1) * g.std / std::sqrt(static_cast<double>(g.n));
  g.ci_low = g.mean - half;
  g.ci_high = g.mean + half;
  return g;
}

std::vector<SettingStats> setting_stats(const Sweep& s, const std::vector<RunOutcome>& outcomes) {
  std::vector<SettingStats> stats;
  std::map<std::string, size_t> where;
  std::map<std::string, std::vector<double>> losses;
  for (size_t i = 0; i < s.runs.size(); ++i) {
    const SweepRun& r = s.runs[i];
    if (!where.count(r.setting)) {
      where[r.setting] = stats.size();
      stats.push_back({r.setting, r.baseline, r.label});
    }
    SettingStats& st = stats[where[r.setting]];
    ++st.runs;
    if (outcomes[i].status == "diverged") ++st.diverged;
    if (outcomes[i].status == "finished" && std::isfinite(outcomes[i].final_val_loss)) {
      ++st.finished;
      losses[r.setting].push_back(outcomes[i].final_val_loss);
    }
  }
  for (auto& st : stats) {
    const auto& xs = losses[st.setting];
    if (xs.empty()) continue;
    double sum = 0;
    for (double x : xs) sum += x;
    st.mean = sum / xs.size();
    if (xs.size() > 1) {
      double ss = 0;
      for (double x : xs) ss += (x - st.mean) * (x - st.mean);
      st.std = std::sqrt(ss / (xs.size() - 1));
    }
  }
  std::map<std::string, std::vector<double>> differences;
  for (size_t i = 0; i < s.runs.size(); ++i)
    if (const double d = run_gap(s, outcomes, i); std::isfinite(d)) differences[s.runs[i].setting].push_back(d);
  for (auto& st : stats) {
    if (!st.baseline.empty() && where.count(st.baseline)) st.gap = st.mean - stats[where[st.baseline]].mean;
    st.paired = paired_gap(differences[st.setting]);
  }
  return stats;
}

double run_gap(const Sweep& s, const std::vector<RunOutcome>& outcomes, size_t i) {
  const SweepRun& r = s.runs[i];
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (r.baseline.empty() || outcomes[i].status != "finished") return nan;
  const json seed = r.overrides.contains(kSeedKey) ? r.overrides[kSeedKey] : json();
  for (size_t k = 0; k < s.runs.size(); ++k) {
    const SweepRun& b = s.runs[k];
    const json bseed = b.overrides.contains(kSeedKey) ? b.overrides[kSeedKey] : json();
    if (b.setting == r.baseline && bseed == seed)
      return outcomes[k].status == "finished" ? outcomes[i].final_val_loss - outcomes[k].final_val_loss : nan;
  }
  return nan;
}

std::string write_summary(const Sweep& s, const std::vector<RunOutcome>& outcomes) {
  const auto stats = setting_stats(s, outcomes);
  std::map<std::string, const SettingStats*> by_setting;
  for (const auto& st : stats) by_setting[st.setting] = &st;
  const bool seeded = std::find(s.keys.begin(), s.keys.end(), kSeedKey) != s.keys.end();
  fs::create_directories(s.dir());

  // The label before the setting: tools read the varied keys as the columns between setting and status.
  std::ostringstream csv;
  csv << "id,label,setting";
  for (const auto& k : s.keys) csv << ',' << csv_field(k);
  csv << ",status,reason,steps,tokens,final_val_loss,wall_s,tokens_per_s,skipped,baseline,gap_nats,"
         "setting_finished,setting_mean,setting_std,setting_gap_nats,paired_n,paired_gap_mean,paired_gap_std,"
         "paired_gap_ci95_low,paired_gap_ci95_high,paired_gap_significant\n";
  for (size_t i = 0; i < s.runs.size(); ++i) {
    const SweepRun& r = s.runs[i];
    const RunOutcome& o = outcomes[i];
    const SettingStats& st = *by_setting[r.setting];
    csv << csv_field(r.id) << ',' << csv_field(r.label) << ',' << csv_field(r.setting);
    for (const auto& k : s.keys) csv << ',' << csv_field(value_text(r.overrides, k));
    csv << ',' << o.status << ',' << csv_field(o.reason) << ',' << o.steps << ',' << o.tokens << ','
        << fmt_num(o.final_val_loss, "{:.6f}") << ',' << fmt_num(o.wall_seconds, "{:.1f}") << ','
        << fmt_num(o.tokens_per_s(), "{:.0f}") << ',' << o.skipped << ','
        << csv_field(r.is_baseline ? "(baseline)" : r.baseline) << ','
        << fmt_num(run_gap(s, outcomes, i), "{:.6f}") << ',' << st.finished << ','
        << fmt_num(st.mean, "{:.6f}") << ',' << fmt_num(st.std, "{:.6f}") << ','
        << fmt_num(st.gap, "{:.6f}") << ',' << st.paired.n << ',' << fmt_num(st.paired.mean, "{:.6f}") << ','
        << fmt_num(st.paired.std, "{:.6f}") << ',' << fmt_num(st.paired.ci_low, "{:.6f}") << ','
        << fmt_num(st.paired.ci_high, "{:.6f}") << ',' << (st.paired.n >= 2 ? (st.paired.significant() ? "yes" : "no") : "")
        << '\n';
  }

  std::ostringstream md;
  md << "# Sweep " << s.name << "\n\nBase config `" << shown_path(s.base) << "`; final val loss = mean of the last "
     << s.eval_last << " evaluation" << (s.eval_last > 1 ? "s" : "")
     << "; gaps in nats (run minus baseline). Cells by their labels; summary.csv has each run's folder (id), "
        "setting and values.\n\n";
  md << "## Settings\n\n| cell | compared with | finished | val loss (mean ± std) | paired gap (mean ± std) | 95% CI "
        "| n | significant | diverged |\n|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& st : stats) {
    const SweepRun* first = nullptr;
    for (const auto& r : s.runs)
      if (r.setting == st.setting && !first) first = &r;
    const auto baseline = by_setting.find(st.baseline);
    md << "| " << md_cell(st.label) << " | " << (baseline != by_setting.end() ? md_cell(baseline->second->label) : "")
       << " | " << st.finished << '/' << st.runs << " | "
       << (std::isfinite(st.mean) ? fmt_num(st.mean) + (std::isfinite(st.std) ? " ± " + fmt_num(st.std) : "") : "—")
       << " | ";
    const PairedGap& g = st.paired;
    if (first->is_baseline)
      md << "baseline | | | ";
    else
      md << (g.n ? fmt::format("{:+.4f}", g.mean) + (g.n > 1 ? fmt::format(" ± {:.4f}", g.std) : "") : "—") << " | "
         << (g.n > 1 ? fmt::format("[{:+.4f}, {:+.4f}]", g.ci_low, g.ci_high) : "") << " | " << g.n << " | "
         << (g.n > 1 ? (g.significant() ? "**yes**" : "no") : "") << " | ";
    md << (st.diverged ? "**" + std::to_string(st.diverged) + " diverged**" : std::string()) << " |\n";
  }
  md << "\n## Runs\n\n| cell |" << (seeded ? " seed |" : "")
     << " status | steps | tokens | final val loss | gap | wall s | tokens/s | skipped |\n|---|"
     << (seeded ? "---|" : "") << "---|---|---|---|---|---|---|---|\n";
  for (size_t i = 0; i < s.runs.size(); ++i) {
    const RunOutcome& o = outcomes[i];
    const double gap = run_gap(s, outcomes, i);
    std::string status = o.status == "finished" ? o.status : "**" + o.status + "**";
    if (!o.reason.empty()) status += ": " + o.reason;
    if (o.status != "finished" && o.status != "diverged" && o.last_val_step >= 0)
      status += fmt::format("; last evaluation {:.4f} at step {}", o.last_val_loss, o.last_val_step);
    md << "| " << md_cell(s.runs[i].label) << " | "
       << (seeded ? md_cell(value_text(s.runs[i].overrides, kSeedKey)) + " | " : "") << md_cell(status) << " | "
       << o.steps << " | " << o.tokens << " | " << fmt_num(o.final_val_loss) << " | "
       << (std::isfinite(gap) ? fmt::format("{:+.4f}", gap) : "") << " | " << fmt_num(o.wall_seconds, "{:.1f}")
       << " | " << fmt_num(o.tokens_per_s(), "{:.0f}") << " | " << o.skipped << " |\n";
  }

  for (const auto& [name, text] : {std::pair{"summary.csv", csv.str()}, std::pair{"summary.md", md.str()}}) {
    try {
      write_file_atomically((fs::path(s.dir()) / name).string(), [&](std::ostream& f) { f << text; });
    } catch (const std::runtime_error& e) {
      throw SweepError(e.what());
    }
  }
  return md.str();
}

}  // namespace qattn
