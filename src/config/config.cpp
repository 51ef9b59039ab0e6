// Config: JSON -> validated structs + the effective JSON (defaults filled in).
#include "qattn/config.hpp"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <regex>
#include <string_view>

#include "qattn/json_file.hpp"
#include "reader.hpp"

namespace qattn {

using nlohmann::json;
constexpr int64_t kMaxI = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxI64 = std::numeric_limits<int64_t>::max();

ConfigError::ConfigError(std::vector<std::string> errs)
    : std::runtime_error([&] {
        std::string s = "invalid config:";
        for (const auto& e : errs) s += "\n  " + e;
        return s;
      }()),
      errors(std::move(errs)) {}

namespace {

// model.qk_norm (docs/attention-maths.md §3): false | true (= "gain") | "gain" |
// "logit_scale" | {"form", "lr_mult", "logit_scale_init"}. A boolean stays as
// written in the effective config; a string or object becomes the full object.
void read_qk_norm(ObjectReader& r, QkNormConfig& q, int seq_len, std::vector<std::string>& warnings) {
  const std::string allowed = "allowed: false | true | \"gain\" | \"logit_scale\" | "
                              "{\"form\": \"gain\" | \"logit_scale\", \"lr_mult\": number, "
                              "\"logit_scale_init\": number}";
  const json* in = r.raw("qk_norm");
  if (!in || in->is_boolean()) {
    bool on = q.on();
    r.boolean("qk_norm", on);
    q.form = on ? QkNormForm::gain : QkNormForm::off;
    return;
  }
  json expanded;
  if (in->is_string()) {
    const std::string form = in->get<std::string>();
    if (form != "gain" && form != "logit_scale") {
      r.error("qk_norm", in->dump() + " is not allowed; " + allowed);
      r.known("qk_norm");
      return;
    }
    expanded = {{"form", form}};
    in = &expanded;
  } else if (!in->is_object()) {
    r.error("qk_norm", in->dump() + " has the wrong type; " + allowed);
    r.known("qk_norm");
    return;
  }
  ObjectReader o = r.object("qk_norm", in);
  q.form = QkNormForm::gain;
  o.choice("form", q.form, kQkNormFormNames);
  o.number("lr_mult", q.lr_mult);
  if (q.form == QkNormForm::logit_scale) {
    q.logit_scale_init = default_logit_scale_init(seq_len);
    o.number("logit_scale_init", q.logit_scale_init);
  } else {
    o.known("logit_scale_init");  // a key of the object, if not of this form
    if (o.has("logit_scale_init"))
      warnings.push_back(o.path_of("logit_scale_init") + ": unused, the form is \"gain\"");
  }
  o.finish();
}

void read_model(ObjectReader r, ModelConfig& m, std::vector<std::string>& warnings) {
  r.integer("vocab", m.vocab);
  r.integer("layers", m.layers);
  r.integer("heads", m.heads);
  r.integer("dim", m.dim);
  r.integer("seq_len", m.seq_len);
  read_qk_norm(r, m.qk_norm, m.seq_len, warnings);
  r.string("init_from", m.init_from);
  if (m.heads > 0 && m.dim % m.heads != 0)
    r.error("dim", std::to_string(m.dim) + " is not divisible by model.heads = " +
                       std::to_string(m.heads) + "; allowed: a multiple of heads");
  r.finish();
}

void read_kinterval(ObjectReader r, KIntervalOptions& k) {
  r.integer("K", k.K);
  r.choice("calibration", k.calibration, kCalibrationNames);
  r.number("window", k.window);
  r.choice("rounding", k.rounding, kRoundingNames);
  r.choice("ste", k.ste, kSteNames);
  r.boolean("ste_window_mask", k.ste_window_mask);
  r.boolean("detach_extrema", k.detach_extrema);
  r.finish();
}

void read_sage(ObjectReader r, SageOptions& s, std::vector<std::string>& warnings) {
  r.integer("block_q", s.block_q);
  r.integer("block_k", s.block_k);
  r.boolean("smooth_k", s.smooth_k);
  r.boolean("smooth_q", s.smooth_q);
  r.choice("bwd_granularity", s.bwd_granularity, kBwdGranularityNames);
  {
    ObjectReader p = r.object("precision");
    p.choice("qk", s.precision.qk, kPrecisionNames);
    p.choice("pv", s.precision.pv, kPrecisionNames);
    p.choice("dv", s.precision.dv, kPrecisionNames);
    p.choice("dp", s.precision.dp, kPrecisionNames);
    p.choice("dq", s.precision.dq, kPrecisionNames);
    p.choice("dk", s.precision.dk, kPrecisionNames);
    p.finish();
  }
  if (r.has("softmax")) {
    // "exact" is sage's own online softmax (as without the block): a sweep can
    // then vary softmax.kind alone and keep the K-interval options in "set".
    const bool options_given = r.raw("softmax")->is_object() && r.raw("softmax")->size() > 1;
    ObjectReader sm = r.object("softmax");
    std::string kind = "kinterval";
    sm.choice("kind", kind);
    // The remaining keys are the kinterval options; read them from the same
    // object, starting from the block s already has (an attention.layers
    // entry inherits the global one).
    KIntervalOptions k = s.softmax.value_or(KIntervalOptions{});
    read_kinterval(std::move(sm), k);  // "kind" was asked above, so it is not unknown
    if (kind == "kinterval")
      s.softmax = k;
    else
      s.softmax.reset();
    if (kind == "exact" && options_given)
      warnings.push_back(r.path_of("softmax") + ": K-interval options unused, kind is \"exact\"");
  }
  // An fp8 dS takes its scale from a bound on |dS| known before dS is computed
  // (docs/attention-maths.md §4.12); the K-interval gradient has no such bound.
  if (s.softmax)
    for (const auto& [key, p] : {std::pair{"dq", s.precision.dq}, std::pair{"dk", s.precision.dk}})
      if (p == Precision::fp8)
        r.error(std::string("precision.") + key,
                "\"fp8\" is not allowed with softmax.kind \"kinterval\" (fp8's dS scale needs a "
                "bound on exact-softmax gradients); allowed: \"int8\" | \"bf16\"");
  r.finish();
}

// The kind and options of one attention object into a, whose fields hold the
// defaults (the built-in ones; for an attention.layers entry the global ones).
void read_attention_options(ObjectReader& r, AttentionConfig& a, std::vector<std::string>& warnings) {
  r.choice("kind", a.kind, kAttentionKindNames);
  const bool ste_given = r.raw("kinterval") && r.raw("kinterval")->is_object() &&
                         r.raw("kinterval")->contains("ste");
  read_sage(r.object("sage"), a.sage, warnings);
  read_kinterval(r.object("kinterval"), a.kinterval);
  if (ste_given && a.kinterval.rounding == Rounding::lerp)
    warnings.push_back(r.path_of("kinterval") + ".ste: unused with rounding \"lerp\" (lerp has an exact gradient)");
}

// "N" or "A-B" (decimal digits only) -> [first, last]; false when malformed.
bool parse_layer_range(const std::string& s, int& first, int& last) {
  auto number = [](std::string_view t, int& out) {
    if (t.empty() || t.size() > 9 || t.find_first_not_of("0123456789") != std::string_view::npos) return false;
    out = std::stoi(std::string(t));
    return true;
  };
  const auto dash = s.find('-');
  if (dash == std::string::npos) return number(s, first) && number(s, last);
  return number(std::string_view(s).substr(0, dash), first) && number(std::string_view(s).substr(dash + 1), last);
}

// attention.layers: {"N" or "A-B": attention object} over model.layers layers.
void read_layers(ObjectReader& r, const AttentionConfig& global, int num_layers, std::vector<LayerAttention>& out,
                 std::vector<std::string>& warnings) {
  r.known("layers");
  if (!r.has("layers")) return;  // and the effective config gets no empty object
  const nlohmann::json* in = r.raw("layers");
  ObjectReader layers = r.object("layers");
  if (!in->is_object()) return;  // reported by the reader
  const std::string allowed = "allowed: \"N\" or \"A-B\" with 0 <= A <= B < model.layers = " +
                              std::to_string(num_layers);
  for (const auto& [key, value] : in->items()) {
    LayerAttention e{key, 0, 0, global};
    ObjectReader o = layers.object(key);
    read_attention_options(o, e.attention, warnings);
    for (const auto& [name, kind] : {std::pair{"sage", AttentionKind::sage}, {"kinterval", AttentionKind::kinterval}})
      if (e.attention.kind != kind && o.has(name))
        warnings.push_back(o.path_of(name) + ": ignored, the kind of these layers is \"" +
                           to_string(e.attention.kind) + "\"");
    o.finish();
    if (!parse_layer_range(key, e.first, e.last)) {
      layers.error(key, "\"" + key + "\" is not a layer or a range of layers; " + allowed);
    } else if (e.first > e.last) {
      layers.error(key, "the range is empty (" + std::to_string(e.first) + " > " + std::to_string(e.last) + "); " +
                            allowed);
    } else if (e.last >= num_layers) {
      layers.error(key, "layer " + std::to_string(e.last) + " is out of range; " + allowed);
    } else {
      out.push_back(std::move(e));
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  size_t reach = 0;  // the entry so far that reaches furthest
  for (size_t i = 1; i < out.size(); ++i) {
    if (out[i].first <= out[reach].last)
      layers.error(out[i].key, "overlaps attention.layers." + out[reach].key + " (layer " +
                                   std::to_string(out[i].first) +
                                   " is in both); allowed: each layer in at most one entry");
    if (out[i].last > out[reach].last) reach = i;
  }
  layers.finish();
}

// The attention section. layers: where attention.layers is read (null: the
// key is not allowed, as for a single kind).
void read_attention(ObjectReader r, AttentionConfig& a, std::vector<LayerAttention>* layers, int num_layers,
                    std::vector<std::string>& warnings) {
  read_attention_options(r, a, warnings);
  if (layers) read_layers(r, a, num_layers, *layers, warnings);
  // An options object is ignored when no layer runs its kind (entries of
  // attention.layers start from the global options, so they use them).
  auto runs = [&](AttentionKind k) {
    if (a.kind == k) return true;
    return layers && std::any_of(layers->begin(), layers->end(),
                                 [k](const LayerAttention& e) { return e.attention.kind == k; });
  };
  const std::string no_entry = layers && !layers->empty() ? " and no attention.layers entry runs it" : "";
  for (const auto& [name, kind] : {std::pair{"sage", AttentionKind::sage}, {"kinterval", AttentionKind::kinterval}})
    if (!runs(kind) && r.has(name))
      warnings.push_back(r.path_of(name) + ": ignored, attention.kind is \"" + to_string(a.kind) + "\"" + no_entry);
  r.finish();
}

void read_train(ObjectReader r, TrainConfig& t) {
  r.integer("tokens_per_step", t.tokens_per_step);
  r.integer("micro_batch", t.micro_batch);
  r.integer("steps", t.steps);
  r.integer("tokens", t.tokens);
  r.number("lr", t.lr);
  r.integer("warmup", t.warmup);
  r.choice("schedule", t.schedule, kScheduleNames);
  r.number("final_lr_frac", t.final_lr_frac);
  r.number("wsd_decay_frac", t.wsd_decay_frac);
  r.number("weight_decay", t.weight_decay);
  r.number("beta1", t.beta1);
  r.number("beta2", t.beta2);
  r.number("eps", t.eps);
  r.number("grad_clip", t.grad_clip);
  int64_t seed = static_cast<int64_t>(t.seed);
  r.integer("seed", seed);
  t.seed = static_cast<uint64_t>(seed);
  r.choice("device", t.device);
  r.integer("checkpoint_every", t.checkpoint_every);
  r.integer("keep_checkpoints", t.keep_checkpoints);
  r.number("spike_zscore", t.spike_zscore);
  if (!r.has("tokens_per_step")) r.error("tokens_per_step", "required (global tokens per optimizer step)");
  if (!r.has("micro_batch")) r.error("micro_batch", "required (sequences per forward/backward)");
  if (r.has("steps") == r.has("tokens"))
    r.error("steps", "give exactly one of train.steps and train.tokens");
  r.finish();
}

// Cross-section rules and derived values.
void derive(Config& c, int world_size, std::vector<std::string>& errors) {
  TrainConfig& t = c.train;
  if (t.micro_batch <= 0 || t.tokens_per_step <= 0) return;  // already reported
  const int64_t per_micro = static_cast<int64_t>(t.micro_batch) * c.model.seq_len * world_size;
  if (t.tokens_per_step % per_micro != 0) {
    errors.push_back("train.tokens_per_step: " + std::to_string(t.tokens_per_step) +
                     " is not divisible by micro_batch * seq_len * world_size = " +
                     std::to_string(t.micro_batch) + " * " + std::to_string(c.model.seq_len) +
                     " * " + std::to_string(world_size) + " = " + std::to_string(per_micro) +
                     "; allowed: a multiple of " + std::to_string(per_micro));
    return;
  }
  // grad_accum is an int: more micro-batches per step than that would wrap.
  if (t.tokens_per_step / per_micro > kMaxI) {
    errors.push_back("train.tokens_per_step: " + std::to_string(t.tokens_per_step) + " is " +
                     std::to_string(t.tokens_per_step / per_micro) + " micro-batches of " + std::to_string(per_micro) +
                     " tokens; allowed: at most " + std::to_string(kMaxI) + " micro-batches per step");
    return;
  }
  t.grad_accum = static_cast<int>(t.tokens_per_step / per_micro);
  if (t.tokens > 0) {
    if (t.tokens < t.tokens_per_step) {
      errors.push_back("train.tokens: " + std::to_string(t.tokens) +
                       " is less than one step of tokens_per_step = " + std::to_string(t.tokens_per_step));
      return;
    }
    t.steps = t.tokens / t.tokens_per_step;
  }
  // The tokens seen so far (metrics.csv, checkpoints) are an int64.
  if (t.steps > kMaxI64 / t.tokens_per_step)
    errors.push_back("train.steps: " + std::to_string(t.steps) + " steps of tokens_per_step = " +
                     std::to_string(t.tokens_per_step) + " tokens exceed 2^63 tokens; allowed: at most " +
                     std::to_string(kMaxI64 / t.tokens_per_step) + " steps");
  if (t.warmup > t.steps)
    errors.push_back("train.warmup: " + std::to_string(t.warmup) + " exceeds train.steps = " +
                     std::to_string(t.steps));
  c.effective["train"]["grad_accum"] = t.grad_accum;
  c.effective["train"]["steps"] = t.steps;
}

}  // namespace

Config config_from_json(const json& j, const std::string& source, int world_size) {
  Config c;
  c.source = source;
  std::vector<std::string> errors;
  ObjectReader root(&j, c.effective, "", errors);
  read_model(root.object("model"), c.model, c.warnings);
  read_attention(root.object("attention"), c.attention, &c.attention_layers, c.model.layers, c.warnings);
  {
    ObjectReader d = root.object("data");
    d.string("train", c.data.train);
    d.string("val", c.data.val);
    if (c.data.train.empty()) d.error("train", "required (a glob of llm.c token shards)");
    if (c.data.val.empty()) d.error("val", "required (a glob of llm.c token shards)");
    d.finish();
  }
  read_train(root.object("train"), c.train);
  {
    ObjectReader e = root.object("eval");
    e.integer("every", c.eval.every);
    e.integer("batches", c.eval.batches);
    e.finish();
  }
  {
    ObjectReader l = root.object("log");
    l.integer("every", c.log.every);
    l.string("out", c.log.out);
    if (c.log.name.empty() && !source.empty()) c.log.name = std::filesystem::path(source).stem();
    l.string("name", c.log.name);
    l.integer("diag_every", c.log.diag_every);
    if (c.log.name.empty() && source.empty())
      l.error("name", "required when the config does not come from a file");
    else if (const std::string problem = folder_name_problem(c.log.name); !problem.empty())
      l.error("name", problem + " (the run directory is log.out/log.name)");
    l.finish();
  }
  {
    ObjectReader d = root.object("dist");
    d.integer("zero_stage", c.dist.zero_stage);
    d.finish();
  }
  root.finish();
  if (errors.empty()) derive(c, world_size, errors);
  if (!errors.empty()) throw ConfigError(errors);
  return c;
}

AttentionConfig attention_config_from_json(const json& j) {
  AttentionConfig a;
  json effective;
  std::vector<std::string> errors, warnings;
  ObjectReader root(&j, effective, "", errors);
  read_attention(root.object("attention"), a, nullptr, 0, warnings);
  if (!errors.empty()) throw ConfigError(errors);
  return a;
}

const AttentionConfig& Config::attention_of(int layer) const {
  for (const LayerAttention& e : attention_layers)
    if (layer >= e.first && layer <= e.last) return e.attention;
  return attention;
}

std::vector<AttentionConfig> Config::attention_per_layer() const {
  std::vector<AttentionConfig> out;
  for (int l = 0; l < model.layers; ++l) out.push_back(attention_of(l));
  return out;
}

std::string describe_attention(const Config& c) {
  std::string s = to_string(c.attention.kind);
  if (c.attention_layers.empty()) return s;
  s += " (layers ";
  for (size_t i = 0; i < c.attention_layers.size(); ++i)
    s += (i ? ", " : "") + c.attention_layers[i].key + ": " + to_string(c.attention_layers[i].attention.kind);
  return s + ")";
}

std::string folder_name_problem(const std::string& name) {
  if (!name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos) return "";
  return json(name).dump() + " is not allowed; allowed: a folder name (not empty, without '/', not \".\" or \"..\")";
}

void apply_override(json& j, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError({"--set " + assignment + ": expected json.path=value (e.g. train.lr=3e-4)"});
  try {
    (void)json(assignment).dump();  // keys and strings of a config are UTF-8 (the parser checks a file's)
  } catch (const json::type_error&) {
    throw ConfigError({"--set " + assignment + ": not valid UTF-8; allowed: UTF-8 text"});
  }
  const std::string path = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  json value;
  try {
    value = parse_json(text);
  } catch (const JsonError& e) {
    // A bare word is a string (attention.kind=sage); a number out of range
    // (1e400) or an object with a key given twice is not: taken as a string it
    // would only hide the mistake.
    static const std::regex number(R"(-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?)");
    if (text.starts_with('{') || std::regex_match(text, number))
      throw ConfigError({"--set " + assignment + ": " + e.what()});
    value = text;
  }
  json* node = &j;
  size_t start = 0;
  while (true) {
    const auto dot = path.find('.', start);
    const std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (key.empty()) throw ConfigError({"--set " + assignment + ": empty key in path '" + path + "'"});
    if (!node->is_object() && start == 0)
      throw ConfigError({"--set " + assignment + ": the config is not a JSON object"});
    if (!node->is_object()) {
      const std::string through = path.substr(0, start - 1);
      throw ConfigError({"--set " + assignment + ": '" + path + "' goes through " + through + " = " +
                         node->dump() + ", which is not an object; set " + through +
                         " as a whole (e.g. " + through + "={...})"});
    }
    if (dot == std::string::npos) {
      (*node)[key] = value;
      return;
    }
    node = &(*node)[key];
    if (node->is_null()) *node = json::object();
    start = dot + 1;
  }
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides,
                   int world_size) {
  json j;
  try {
    j = read_json_file(path, "config file");
  } catch (const JsonError& e) {
    throw ConfigError({e.what()});
  }
  for (const auto& o : overrides) apply_override(j, o);
  return config_from_json(j, path, world_size);
}

}  // namespace qattn
