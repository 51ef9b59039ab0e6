// qattn probe causality CONFIG: does a kind let later tokens change earlier
// outputs? docs/attention-maths.md §4.11: sage's per-block scales and the K mean mu_K
// include tokens after the query. Random q, k, v at the config's shape; tokens
// from --from on are redrawn; the largest change of an output before --from is
// reported per kind. FPA and K-interval must show exactly 0 (else exit 1).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "checks.hpp"
#include "commands.hpp"
#include "qattn/config.hpp"
#include "qattn/cpu/attention.hpp"

namespace qattn::cli {

namespace {

struct ProbeArgs {
  std::string config;
  std::vector<std::string> sets;
  int from = -1;        // first redrawn token; default T / 2
  int heads = 0;        // heads probed; default model.heads
  double sigma = 1.0;   // standard deviation of q and k (v is standard normal)
  uint64_t seed = 1;
};

struct Change {
  double max_change = 0;  // max |o' - o| over tokens before `from`, all heads
  double max_output = 0;  // max |o| over the same entries
};

std::vector<float> normal(size_t n, double sigma, std::mt19937_64& rng) {
  std::normal_distribution<double> dist(0.0, sigma);
  std::vector<float> x(n);
  for (float& e : x) e = float(dist(rng));
  return x;
}

Change probe(const AttentionConfig& attn, const ProbeArgs& a, int T, int d) {
  const size_t Td = (size_t)T * d, before = (size_t)a.from * d;
  Change c;
  std::mt19937_64 rng(a.seed);
  for (int h = 0; h < a.heads; h++) {
    std::vector<float> q = normal(Td, a.sigma, rng), k = normal(Td, a.sigma, rng),
                       v = normal(Td, 1.0, rng);
    std::vector<float> q2 = q, k2 = k, v2 = v;  // (T, d) each, redrawn from token `from` on
    const std::vector<float> fresh_q = normal(Td, a.sigma, rng), fresh_k = normal(Td, a.sigma, rng),
                             fresh_v = normal(Td, 1.0, rng);
    std::copy(fresh_q.begin() + before, fresh_q.end(), q2.begin() + before);
    std::copy(fresh_k.begin() + before, fresh_k.end(), k2.begin() + before);
    std::copy(fresh_v.begin() + before, fresh_v.end(), v2.begin() + before);
    std::vector<float> o(Td), o2(Td);
    cpu::attention_forward(attn, T, d, q.data(), k.data(), v.data(), o.data());
    cpu::attention_forward(attn, T, d, q2.data(), k2.data(), v2.data(), o2.data());
    for (size_t n = 0; n < before; n++) {
      c.max_change = std::max(c.max_change, (double)std::abs(o2[n] - o[n]));
      c.max_output = std::max(c.max_output, (double)std::abs(o[n]));
    }
  }
  return c;
}

void run_causality(const ProbeArgs& args_in) {
  Config cfg;
  try {
    cfg = load_config(args_in.config, args_in.sets);
  } catch (const ConfigError& e) {
    spdlog::error("{}: {}", args_in.config, e.what());
    throw CLI::RuntimeError(kExitBadInput);
  }
  ProbeArgs a = args_in;
  const int T = cfg.model.seq_len, d = cfg.model.head_dim();
  if (a.from < 0) a.from = T / 2;
  if (a.heads == 0) a.heads = cfg.model.heads;
  if (a.from < 1 || a.from >= T)
    throw CLI::ValidationError("--from", std::to_string(a.from) + " is not allowed; allowed: 1 .. " +
                                             std::to_string(T - 1) + " (model.seq_len - 1)");

  struct Row {
    std::string name;
    AttentionConfig attn;
    bool must_be_causal;
  };
  std::vector<Row> rows;
  AttentionConfig fpa = cfg.attention;
  fpa.kind = AttentionKind::fpa;
  rows.push_back({"fpa", fpa, true});
  AttentionConfig kint = cfg.attention;
  kint.kind = AttentionKind::kinterval;
  rows.push_back({"kinterval (config's options)", kint, true});
  AttentionConfig sage = cfg.attention;
  sage.kind = AttentionKind::sage;
  rows.push_back({"sage (config's options)", sage, false});
  sage.sage.smooth_k = !cfg.attention.sage.smooth_k;
  rows.push_back({std::string("sage, smooth_k ") + (sage.sage.smooth_k ? "on" : "off"), sage, false});

  std::printf("causality probe: T = %d, d = %d, %d heads, sigma_qk = %g, seed %llu;\n"
              "tokens %d..%d redrawn; largest change of an output at a token < %d\n\n",
              T, d, a.heads, a.sigma, (unsigned long long)a.seed, a.from, T - 1, a.from);
  std::printf("%-32s %14s %12s %12s\n", "kind", "max |do|", "max |o|", "relative");
  bool leaked = false;
  for (const Row& r : rows) {
    const Change c = probe(r.attn, a, T, d);
    std::printf("%-32s %14.6g %12.6g %12.3g\n", r.name.c_str(), c.max_change, c.max_output,
                c.max_change / c.max_output);
    if (r.must_be_causal && c.max_change != 0) leaked = true;
  }
  if (leaked) {
    std::printf("\nERROR: a kind that must be causal changed an earlier output\n");
    throw CLI::RuntimeError(1);
  }
}

}  // namespace

void add_probe_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("probe", "Measurements of the attention kinds");
  cmd->require_subcommand(1);
  auto args = std::make_shared<ProbeArgs>();
  CLI::App* causality = cmd->add_subcommand(
      "causality", "Redraw the later tokens of random heads; report the largest change of earlier "
                   "outputs per kind (fpa and kinterval must be 0)");
  causality->add_option("config", args->config, "run config (JSON): shape and attention options")
      ->required()
      ->check(nonempty_path());
  causality->add_option("--set", args->sets, "override a key: json.path=value (repeatable)");
  causality->add_option("--from", args->from, "first redrawn token (default: seq_len / 2)")
      ->check(integer_range(1, 1 << 20));
  causality->add_option("--heads", args->heads, "random heads to probe (default: model.heads)")
      ->check(integer_range(1, 1024));
  causality->add_option("--sigma", args->sigma, "standard deviation of q and k (default 1)")
      ->check(number_range(1e-3, 1e3));
  causality->add_option("--seed", args->seed, "random seed (default 1)")
      ->check(integer_range(0, std::numeric_limits<int64_t>::max()));
  causality->callback([args] { run_causality(*args); });
}

}  // namespace qattn::cli
