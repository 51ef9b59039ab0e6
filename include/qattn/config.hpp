// The run configuration: JSON sections model, attention, data, train, eval,
// log, dist. Every key is validated; errors name the JSON path, the value and
// what is allowed (docs/config.md).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "qattn/attention.hpp"
#include "qattn/qk_norm.hpp"
#include "qattn/value_names.hpp"

namespace qattn {

struct ModelConfig {
  int vocab = 50257;       // real vocabulary size (tokens in the data are < vocab)
  int layers = 12;
  int heads = 12;
  int dim = 768;           // channels C; head_dim = dim / heads
  int seq_len = 1024;      // T
  QkNormConfig qk_norm;    // docs/attention-maths.md §3
  std::string init_from;   // llm.c model file or HF GPT-2 directory to start from ("": random init)
  int head_dim() const { return dim / heads; }
};

struct DataConfig {
  std::string train;       // glob of llm.c shards
  std::string val;         // glob of llm.c shards
};

enum class Schedule { cosine, linear, constant, wsd };
inline constexpr ValueName<Schedule> kScheduleNames[] = {{"cosine", Schedule::cosine},
                                                         {"linear", Schedule::linear},
                                                         {"constant", Schedule::constant},
                                                         {"wsd", Schedule::wsd}};

struct TrainConfig {
  int64_t tokens_per_step = 0;   // global tokens per optimizer step
  int micro_batch = 0;           // sequences per forward/backward
  int64_t steps = 0;             // optimizer steps (derived from tokens when tokens is given)
  int64_t tokens = 0;            // alternative to steps: total training tokens
  double lr = 6e-4;
  int64_t warmup = 0;            // steps of linear warmup
  Schedule schedule = Schedule::cosine;
  double final_lr_frac = 0.1;    // lr at the end as a fraction of lr
  double wsd_decay_frac = 0.2;   // wsd: fraction of steps in the final decay
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double grad_clip = 1.0;        // 0 disables clipping
  uint64_t seed = 1337;
  std::string device = "auto";   // cuda | cpu | auto
  int64_t checkpoint_every = 0;  // 0: only at the end
  int keep_checkpoints = 2;
  double spike_zscore = 0.0;     // 0 disables the loss-spike rule
  int grad_accum = 1;            // derived: tokens_per_step / (micro_batch * seq_len * world)
};

struct EvalConfig {
  int64_t every = 100;     // steps between evaluations (0: only at the end)
  int batches = 10;        // micro-batches per evaluation
};

struct LogConfig {
  int64_t every = 1;       // steps between console lines
  std::string out = "runs";// parent folder of the run directory
  std::string name;        // run name (default: config file stem)
  int64_t diag_every = 0;  // steps between diagnostics, attention-maths.md §7 (0: off)
};

struct DistConfig {
  int zero_stage = 1;      // 0: all-reduce, 1: optimizer state sharded
};

// One entry of attention.layers: layers first .. last (inclusive) run
// `attention` in place of the global kind and options. Its fields start from
// the global ones, so an entry states only what differs.
struct LayerAttention {
  std::string key;            // as written: "0", "1-10"
  int first = 0, last = 0;
  AttentionConfig attention;
};

struct Config {
  ModelConfig model;
  AttentionConfig attention;  // the global kind and options
  std::vector<LayerAttention> attention_layers;  // attention.layers, sorted by first layer
  // The attention layer l runs: its attention.layers entry, else the global one.
  const AttentionConfig& attention_of(int layer) const;
  std::vector<AttentionConfig> attention_per_layer() const;  // model.layers entries
  DataConfig data;
  TrainConfig train;
  EvalConfig eval;
  LogConfig log;
  DistConfig dist;
  nlohmann::json effective;   // the validated config with every default filled in
  std::string source;         // file it came from ("" when built in code)
  std::vector<std::string> warnings;  // legal but suspicious settings ("path: why")
};

// All problems found in one config, one per line ("path: message").
struct ConfigError : std::runtime_error {
  std::vector<std::string> errors;
  explicit ConfigError(std::vector<std::string> errs);
};

// Parses and validates. `overrides` are "json.path=value" strings (value parsed
// as JSON, else taken as a string), applied before validation. world_size enters
// the grad_accum derivation. Throws ConfigError.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {},
                   int world_size = 1);
Config config_from_json(const nlohmann::json& j, const std::string& source = "",
                        int world_size = 1);
// Only the "attention" section of j (absent: the defaults), validated as in a
// full config but without attention.layers (one kind); for tools that need no
// run (qattn bench attention). Throws ConfigError.
AttentionConfig attention_config_from_json(const nlohmann::json& j);
// "fpa", or for per-layer kinds e.g. "sage (layers 0, 11: fpa)": for logs.
std::string describe_attention(const Config& c);

// What is wrong with name as the name of a run's or a sweep's folder, which is
// joined onto log.out or the sweep's "out" ("" when nothing): it must name one
// folder inside that one, not that folder itself ("", ".") nor its parent ("..").
std::string folder_name_problem(const std::string& name);

// Applies one "a.b.c=value" override to j (creating objects as needed).
void apply_override(nlohmann::json& j, const std::string& assignment);

}  // namespace qattn
