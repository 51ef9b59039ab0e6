// The config key table (config_keys.hpp): what docs/config.md documents, key
// by key, and what the reader enforces.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>

#include "qattn/attention.hpp"
#include "qattn/config.hpp"
#include "qattn/config_keys.hpp"

namespace qattn {

using nlohmann::json;

namespace {

constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();  // keys held in an int
constexpr double kMaxBeta = 1.0 - 0x1p-24;  // the largest float below 1
const json kNoBound;                                              // no upper bound

ConfigKey object(std::string path, std::string keys_of = "", std::string default_doc = "") {
  return {.path = std::move(path),
          .type = KeyType::object,
          .keys_of = std::move(keys_of),
          .default_doc = std::move(default_doc)};
}
ConfigKey integer(std::string path, int64_t lo, json hi, std::string default_doc = "") {
  return {.path = std::move(path),
          .type = KeyType::integer,
          .lo = lo,
          .hi = std::move(hi),
          .default_doc = std::move(default_doc)};
}
ConfigKey integer_of(std::string path, std::vector<json> allowed) {
  return {.path = std::move(path), .type = KeyType::integer, .choices = std::move(allowed)};
}
ConfigKey number(std::string path, double lo, json hi, bool lo_open = false,
                 std::string default_doc = "") {
  return {.path = std::move(path),
          .type = KeyType::number,
          .lo = lo,
          .hi = std::move(hi),
          .lo_open = lo_open,
          .default_doc = std::move(default_doc)};
}
ConfigKey boolean(std::string path) { return {.path = std::move(path), .type = KeyType::boolean}; }
ConfigKey text(std::string path, std::string default_doc = "") {
  return {.path = std::move(path), .type = KeyType::text, .default_doc = std::move(default_doc)};
}
ConfigKey choice(std::string path, std::vector<json> allowed) {
  return {.path = std::move(path), .type = KeyType::choice, .choices = std::move(allowed)};
}
template <typename E, std::size_t N>
ConfigKey choice(std::string path, const ValueName<E> (&names)[N]) {
  std::vector<json> allowed;
  for (const ValueName<E>& n : names) allowed.push_back(n.name);
  return choice(std::move(path), std::move(allowed));
}

std::vector<ConfigKey> make_table() {
  return {
      object("model"),
      integer("model.vocab", 2, 65536),  // tokens are uint16 in the shards
      integer("model.layers", 1, 1024),
      integer("model.heads", 1, 1024),
      integer("model.dim", 1, 1 << 16),
      integer("model.seq_len", 1, 1 << 20),
      object("model.qk_norm"),  // or its shorthands false, true and a form's name
      choice("model.qk_norm.form", {"gain", "logit_scale"}),
      number("model.qk_norm.lr_mult", 0.0, 1e4),
      number("model.qk_norm.logit_scale_init", 0.0, 1e4, /*lo_open=*/true,
             "log₂(T² − T), T = model.seq_len"),
      text("model.init_from"),

      object("attention"),
      choice("attention.kind", kAttentionKindNames),
      object("attention.sage"),
      integer_of("attention.sage.block_q", {16, 32, 64, 128}),  // must divide the kernel tile
      integer_of("attention.sage.block_k", {16, 32, 64, 128}),
      boolean("attention.sage.smooth_k"),
      boolean("attention.sage.smooth_q"),
      choice("attention.sage.bwd_granularity", kBwdGranularityNames),
      object("attention.sage.precision"),
      choice("attention.sage.precision.qk", kPrecisionNames),
      choice("attention.sage.precision.pv", kPrecisionNames),
      choice("attention.sage.precision.dv", kPrecisionNames),
      choice("attention.sage.precision.dp", kPrecisionNames),
      choice("attention.sage.precision.dq", kPrecisionNames),
      choice("attention.sage.precision.dk", kPrecisionNames),
      object("attention.sage.softmax", "attention.kinterval", "none"),
      choice("attention.sage.softmax.kind", {"exact", "kinterval"}),
      object("attention.kinterval"),
      integer("attention.kinterval.K", 1, 65535),
      choice("attention.kinterval.calibration", kCalibrationNames),
      number("attention.kinterval.window", 0.0, kNoBound, /*lo_open=*/true),
      choice("attention.kinterval.rounding", kRoundingNames),
      choice("attention.kinterval.ste", kSteNames),
      boolean("attention.kinterval.ste_window_mask"),
      boolean("attention.kinterval.detach_extrema"),
      {.path = "attention.layers",
       .type = KeyType::entries,
       .keys_of = "attention",
       .default_doc = "none"},

      object("data"),
      text("data.train", "required"),
      text("data.val", "required"),

      object("train"),
      integer("train.tokens_per_step", 1, kNoBound, "required"),
      integer("train.micro_batch", 1, kMaxInt, "required"),
      integer("train.steps", 1, kNoBound, "required, or train.tokens"),
      integer("train.tokens", 1, kNoBound, "required, or train.steps"),
      number("train.lr", 0.0, 10.0, /*lo_open=*/true),
      integer("train.warmup", 0, kNoBound),
      choice("train.schedule", kScheduleNames),
      number("train.final_lr_frac", 0.0, 1.0),
      number("train.wsd_decay_frac", 0.0, 1.0),
      number("train.weight_decay", 0.0, 10.0),
      // AdamW divides by 1 - beta^t in float: at a beta that is 1 as a float it
      // divides by 0, and the run ends in NaN at its second step.
      number("train.beta1", 0.0, kMaxBeta),
      number("train.beta2", 0.0, kMaxBeta),
      number("train.eps", 0.0, 1.0, /*lo_open=*/true),
      number("train.grad_clip", 0.0, kNoBound),
      integer("train.seed", 0, kNoBound),
      choice("train.device", {"auto", "cpu", "cuda"}),
      integer("train.checkpoint_every", 0, kNoBound),
      integer("train.keep_checkpoints", 1, 1000),
      number("train.spike_zscore", 0.0, kNoBound),

      object("eval"),
      integer("eval.every", 0, kNoBound),
      integer("eval.batches", 1, kMaxInt),

      object("log"),
      integer("log.every", 1, kNoBound),
      text("log.out"),
      text("log.name", "the config file's stem"),
      integer("log.diag_every", 0, kNoBound),

      object("dist"),
      integer("dist.zero_stage", 0, 1),
  };
}

}  // namespace

const std::vector<ConfigKey>& config_keys() {
  static const std::vector<ConfigKey> table = make_table();
  return table;
}

const ConfigKey* find_config_key(const std::string& path) {
  static const std::map<std::string, const ConfigKey*> by_path = [] {
    std::map<std::string, const ConfigKey*> m;
    for (const ConfigKey& k : config_keys()) m[k.path] = &k;
    return m;
  }();
  auto entry = [](const std::string& p) -> const ConfigKey* {
    const auto it = by_path.find(p);
    return it == by_path.end() ? nullptr : it->second;
  };
  const ConfigKey* at = nullptr;  // the entry of the path read so far
  for (size_t start = 0; start <= path.size();) {
    const size_t dot = std::min(path.find('.', start), path.size());
    const std::string key = path.substr(start, dot - start);
    start = dot + 1;
    if (key.empty()) return nullptr;
    if (const ConfigKey* own = entry(at ? at->path + "." + key : key)) {
      at = own;
    } else if (at && at->type == KeyType::entries) {
      at = entry(at->keys_of);  // key names an entry
    } else if (at && !at->keys_of.empty()) {
      at = entry(at->keys_of + "." + key);
      if (!at) return nullptr;
    } else {
      return nullptr;
    }
  }
  return at;
}

}  // namespace qattn
