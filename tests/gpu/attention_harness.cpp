// The GPU attention tests' harness (attention_harness.hpp).
#include "attention_harness.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "attention/kinterval/kinterval.cuh"
#include "softmax_discontinuities.hpp"

namespace qattn::test {

// ---------------------------------------------------------------------------
// Configs.

AttentionConfig kinterval_config(const KIntervalOptions& opt) {
  AttentionConfig cfg;
  cfg.kind = AttentionKind::kinterval;
  cfg.kinterval = opt;
  return cfg;
}

AttentionConfig sage_config(const SageOptions& opt) {
  AttentionConfig cfg;
  cfg.kind = AttentionKind::sage;
  cfg.sage = opt;
  return cfg;
}

AttentionConfig composed_config(const KIntervalOptions& k, SageOptions sage) {
  sage.softmax = k;
  return sage_config(sage);
}

std::vector<KIntervalOptions> every_option_combination(int K) {
  std::vector<KIntervalOptions> all;
  for (Calibration cal : {Calibration::minmax, Calibration::fwm})
    for (Rounding rounding : {Rounding::nearest, Rounding::lerp})
      for (Ste ste : {Ste::weight, Ste::prob})
        for (bool detach : {false, true})
          for (bool mask : {false, true}) {
            KIntervalOptions o;
            o.K = K, o.calibration = cal, o.rounding = rounding, o.ste = ste;
            o.detach_extrema = detach, o.ste_window_mask = mask;
            all.push_back(o);
          }
  return all;
}

namespace {

std::string describe_kinterval(const KIntervalOptions& o) {
  return "K=" + std::to_string(o.K) + " " + to_string(o.calibration) + " " + to_string(o.rounding) +
         " ste=" + to_string(o.ste) + (o.detach_extrema ? " detach" : "") +
         (o.ste_window_mask ? " mask" : "");
}

std::string describe_sage(const SageOptions& o) {
  const SagePrecision& p = o.precision;
  std::string text = "qk=" + to_string(p.qk) + " pv=" + to_string(p.pv) + " dv=" + to_string(p.dv) +
                     " dp=" + to_string(p.dp) + " dq=" + to_string(p.dq) +
                     " dk=" + to_string(p.dk) + " " + to_string(o.bwd_granularity) +
                     (o.smooth_k ? " smooth_k" : "") + (o.smooth_q ? " smooth_q" : "");
  if (o.softmax) text += ", kinterval " + describe_kinterval(*o.softmax);
  return text;
}

}  // namespace

std::string describe(const AttentionConfig& cfg, const AttentionShape& s) {
  const std::string shape = " (B,H,T,d)=(" + std::to_string(s.B) + "," + std::to_string(s.H) + "," +
                            std::to_string(s.T) + "," + std::to_string(s.d) + ")";
  switch (cfg.kind) {
    case AttentionKind::fpa:
      return "fpa" + shape;
    case AttentionKind::sage:
      return "sage " + describe_sage(cfg.sage) + shape;
    case AttentionKind::kinterval:
      return "kinterval " + describe_kinterval(cfg.kinterval) + shape;
  }
  return "unknown kind" + shape;
}

// ---------------------------------------------------------------------------
// Kernel families.

bool wgmma_available() { return cuda::fpa_wgmma_available(); }

const char* family_name(FpaKernels family) {
  switch (family) {
    case FpaKernels::automatic:
      return wgmma_available() ? "auto(wgmma)" : "auto(mma.sync)";
    case FpaKernels::mma_sync:
      return "mma.sync";
    case FpaKernels::wgmma:
      return "wgmma";
  }
  return "unknown family";
}

std::vector<FpaKernels> every_family() {
  if (wgmma_available()) return {FpaKernels::automatic, FpaKernels::mma_sync};
  return {FpaKernels::automatic};
}

bool wgmma_forward_runs(const SageOptions& opt) { return cuda::sage_wgmma_forward_runs(opt); }
bool wgmma_dq_runs(const SageOptions& opt) { return cuda::sage_wgmma_dq_runs(opt); }
bool wgmma_dkdv_runs(const SageOptions& opt) { return cuda::sage_wgmma_dkdv_runs(opt); }
bool some_sage_kernel_on_wgmma(const SageOptions& opt) {
  return wgmma_forward_runs(opt) || wgmma_dq_runs(opt) || wgmma_dkdv_runs(opt);
}

std::vector<FpaKernels> sage_families(const SageOptions& opt) {
  const SagePrecision& pr = opt.precision;
  for (Precision x : {pr.qk, pr.pv, pr.dp, pr.dv, pr.dq, pr.dk})
    if (x == Precision::fp8) return {FpaKernels::wgmma};  // the fp8 products' only family
  if (some_sage_kernel_on_wgmma(opt)) return {FpaKernels::mma_sync, FpaKernels::wgmma};
  return {FpaKernels::mma_sync};
}

cuda::SageTiles family_tiles(const SageOptions& opt, const AttentionShape& s, FpaKernels family) {
  cuda::SageTiles tiles = cuda::sage_default_tiles(s);
  if (family == FpaKernels::automatic) return tiles;  // as attention_forward runs it
  const bool wgmma = family == FpaKernels::wgmma;
  tiles.forward_kernels = wgmma && !wgmma_forward_runs(opt) ? FpaKernels::mma_sync : family;
  tiles.dq_kernels = wgmma && !wgmma_dq_runs(opt) ? FpaKernels::mma_sync : family;
  tiles.dkdv_kernels = wgmma && !wgmma_dkdv_runs(opt) ? FpaKernels::mma_sync : family;
  return tiles;
}

// ---------------------------------------------------------------------------
// Inputs.

size_t qkv_size(const AttentionShape& s) { return static_cast<size_t>(s.B) * s.T * 3 * s.H * s.d; }
size_t head_size(const AttentionShape& s) { return static_cast<size_t>(s.B) * s.T * s.H * s.d; }

float element(const std::vector<bf16>& v, const AttentionShape& s, int nslots, int b, int t,
              int slot, int h, int x) {
  return __bfloat162float(
      v[(((static_cast<size_t>(b) * s.T + t) * nslots + slot) * s.H + h) * s.d + x]);
}

std::vector<float> slot_of(const std::vector<bf16>& v, const AttentionShape& s, int slot) {
  std::vector<float> out;
  out.reserve(head_size(s));
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.T; ++t)
      for (int h = 0; h < s.H; ++h)
        for (int x = 0; x < s.d; ++x) out.push_back(element(v, s, 3, b, t, slot, h, x));
  return out;
}

std::vector<bf16> normal_qkv(const AttentionShape& s, float q_sigma, float k_sigma, float k_mean,
                             std::mt19937_64& gen) {
  std::vector<float> x = randn(qkv_size(s), gen);
  const size_t hd = static_cast<size_t>(s.H) * s.d;
  for (size_t i = 0; i < x.size(); ++i) {
    const size_t slot = (i / hd) % 3;
    if (slot == 0) x[i] *= q_sigma;
    if (slot == 1) x[i] = x[i] * k_sigma + k_mean;
  }
  return to_bf16(x);
}

std::vector<bf16> normal_heads(const AttentionShape& s, std::mt19937_64& gen) {
  return to_bf16(randn(head_size(s), gen));
}

void repeat_first_four_keys(std::vector<bf16>& qkv, const AttentionShape& s, std::mt19937_64& gen) {
  const size_t row = static_cast<size_t>(s.H) * s.d;  // one token's q, k or v
  std::uniform_int_distribution<int> pick(0, 3);
  for (size_t b = 0; b < static_cast<size_t>(s.B); ++b)
    for (int t = 4; t < s.T; ++t) {
      const size_t src = b * s.T + pick(gen), dst = b * s.T + t;
      std::memcpy(&qkv[(dst * 3 + 1) * row], &qkv[(src * 3 + 1) * row], row * sizeof(bf16));
    }
}

void scale_row_blocks(std::vector<bf16>& x, const AttentionShape& s, int nslots, int slot) {
  const size_t row = static_cast<size_t>(s.H) * s.d;  // one token's slot
  for (size_t b = 0; b < static_cast<size_t>(s.B); ++b)
    for (int t = 0; t < s.T; ++t) {
      const float factor = std::ldexp(1.0f, -((t / 64) % 13));
      bf16* y = &x[((b * s.T + t) * nslots + slot) * row];
      for (size_t i = 0; i < row; ++i) y[i] = __float2bfloat16(__bfloat162float(y[i]) * factor);
    }
}

void zero_head(std::vector<bf16>& x, const AttentionShape& s, int nslots, int slot, int bh) {
  const int b = bh / s.H, h = bh % s.H;
  for (int t = 0; t < s.T; ++t) {
    bf16* y = &x[(((static_cast<size_t>(b) * s.T + t) * nslots + slot) * s.H + h) * s.d];
    std::fill(y, y + s.d, __float2bfloat16(0.0f));
  }
}

int zeroed_head(const AttentionShape& s) { return s.B * s.H - 1; }

namespace {

// Rows that never clear their margin in this many draws: the inputs are degenerate.
constexpr int kMaxDraws = 1000;

std::vector<int> every_head(const AttentionShape& s) {
  std::vector<int> all(s.B * s.H);
  for (int bh = 0; bh < s.B * s.H; ++bh) all[bh] = bh;
  return all;
}

}  // namespace

// Each row's redraw changes only its own scores (its q), so rows are redrawn one at a time.
bool keep_rows_off_discontinuities(const KIntervalOptions& o, const AttentionShape& s,
                                   std::vector<bf16>& qkv, const std::vector<int>& heads,
                                   float q_sigma, std::mt19937_64& gen) {
  const size_t token = static_cast<size_t>(3) * s.H * s.d;
  for (int bh : heads.empty() ? every_head(s) : heads) {
    const int b = bh / s.H, h = bh % s.H;
    for (int t = 0; t < s.T; ++t) {
      bf16* q = &qkv[(static_cast<size_t>(b) * s.T + t) * token + static_cast<size_t>(h) * s.d];
      for (int draws = 0; near_discontinuity(o, s, qkv, b, h, t); ++draws) {
        if (draws == kMaxDraws) return false;
        const std::vector<bf16> fresh = to_bf16(randn(s.d, gen, q_sigma));
        std::copy(fresh.begin(), fresh.end(), q);
      }
    }
  }
  return true;
}

namespace {

// Channel ch of a grid-exact entry drawn from x ~ N(0, 1).
float grid_exact_value(float x, size_t ch, float sigma) {
  const float n = ch == 0 ? (x < 0 ? -127.0f : 127.0f)
                          : std::clamp(std::round(x * sigma * 64.0f), -126.0f, 126.0f);
  return n / 64.0f;
}
// Token t's place in the pairs of its 64-row block (T even, so every block has
// an even number of rows): half the block's rows, and whether t is in the later
// half, the negation of token t - half.
struct GridExactPair {
  int half;
  bool negated;
};
GridExactPair grid_exact_pair(const AttentionShape& s, int t) {
  const int block0 = t / cuda::kSageBlock * cuda::kSageBlock;
  const int half = std::min(cuda::kSageBlock, s.T - block0) / 2;
  return {half, t - block0 >= half};
}

}  // namespace

std::vector<bf16> grid_exact_qkv(const AttentionShape& s, float sigma, std::mt19937_64& gen) {
  const std::vector<float> x = randn(qkv_size(s), gen);
  std::vector<float> out(x.size());
  const size_t hd = static_cast<size_t>(s.H) * s.d;
  for (size_t i = 0; i < x.size(); ++i) {
    const int t = static_cast<int>(i / (3 * hd) % s.T);  // i / (3 hd) = b T + t
    const bool query_or_key = (i / hd) % 3 < 2;
    const GridExactPair pair = grid_exact_pair(s, t);
    if (query_or_key && pair.negated)
      out[i] = -out[i - static_cast<size_t>(pair.half) * 3 * hd];
    else
      out[i] = grid_exact_value(x[i], i % s.d, sigma);
  }
  return to_bf16(out);
}

bool keep_grid_exact_rows_off_discontinuities(const KIntervalOptions& o, const AttentionShape& s,
                                              std::vector<bf16>& qkv, float sigma,
                                              std::mt19937_64& gen) {
  const size_t token = static_cast<size_t>(3) * s.H * s.d;
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.H; ++h)
      for (int t = 0; t < s.T; ++t) {
        const GridExactPair pair = grid_exact_pair(s, t);
        if (pair.negated) continue;  // drawn with its pair's earlier token
        bf16* first =
            &qkv[(static_cast<size_t>(b) * s.T + t) * token + static_cast<size_t>(h) * s.d];
        bf16* second = first + static_cast<size_t>(pair.half) * token;
        for (int draws = 0; near_discontinuity(o, s, qkv, b, h, t) ||
                            near_discontinuity(o, s, qkv, b, h, t + pair.half);
             ++draws) {
          if (draws == kMaxDraws) return false;
          const std::vector<float> x = randn(s.d, gen);
          for (int ch = 0; ch < s.d; ++ch) {
            const float v = grid_exact_value(x[ch], ch, sigma);
            first[ch] = __float2bfloat16(v);
            second[ch] = __float2bfloat16(-v);
          }
        }
      }
  return true;
}

// ---------------------------------------------------------------------------
// GPU runs.

AttentionBuffers::AttentionBuffers(const AttentionConfig& cfg, const AttentionShape& s,
                                   const std::vector<bf16>& qkv_in,
                                   const std::vector<bf16>& dout_in)
    : qkv(qkv_size(s)), o(head_size(s)), dout(head_size(s)), dqkv(qkv_size(s)),
      stats(static_cast<size_t>(s.B) * s.H * s.T * cuda::attention_row_stats(cfg, s.d)),
      saved(cuda::attention_saved_bytes(cfg, s)), work(cuda::attention_workspace_bytes(cfg, s)) {
  qkv.upload(qkv_in);
  dout.upload(dout_in);
  o.poison();
  stats.poison();
  saved.poison();
  dqkv.poison();
  work.poison();
}

void forward_gpu(const AttentionConfig& cfg, const AttentionShape& s, AttentionBuffers& b,
                 FpaKernels family) {
  if (family == FpaKernels::automatic)
    return cuda::attention_forward(cfg, s, b.qkv.get(), b.o.get(), b.stats.get(), b.saved.get(),
                                   nullptr);
  switch (cfg.kind) {
    case AttentionKind::fpa:
      return cuda::fpa_forward(s, b.qkv.get(), b.o.get(), b.stats.get(), nullptr, family);
    case AttentionKind::sage:
      return cuda::sage_forward(cfg.sage, s, b.qkv.get(), b.o.get(), b.stats.get(), b.saved.get(),
                                nullptr, family_tiles(cfg.sage, s, family));
    case AttentionKind::kinterval:
      return cuda::kinterval_forward(cfg.kinterval, s, b.qkv.get(), b.o.get(), b.stats.get(),
                                     nullptr, family);
  }
}

void backward_gpu(const AttentionConfig& cfg, const AttentionShape& s, AttentionBuffers& b,
                  FpaKernels family) {
  if (family == FpaKernels::automatic)
    return cuda::attention_backward(cfg, s, b.qkv.get(), b.o.get(), b.dout.get(), b.stats.get(),
                                    b.saved.get(), b.dqkv.get(), b.work.get(), nullptr);
  switch (cfg.kind) {
    case AttentionKind::fpa:
      return cuda::fpa_backward(s, b.qkv.get(), b.o.get(), b.dout.get(), b.stats.get(),
                                reinterpret_cast<float*>(b.work.get()), b.dqkv.get(), nullptr,
                                family);
    case AttentionKind::sage:
      return cuda::sage_backward(cfg.sage, s, b.qkv.get(), b.o.get(), b.dout.get(), b.stats.get(),
                                 b.saved.get(), b.dqkv.get(), b.work.get(), nullptr,
                                 family_tiles(cfg.sage, s, family));
    case AttentionKind::kinterval:
      return cuda::kinterval_backward(cfg.kinterval, s, b.qkv.get(), b.o.get(), b.dout.get(),
                                      b.stats.get(), b.dqkv.get(), b.work.get(), nullptr, family);
  }
}

GpuRun run_gpu(const AttentionConfig& cfg, const AttentionShape& s, const std::vector<bf16>& qkv,
               const std::vector<bf16>& dout, FpaKernels family) {
  AttentionBuffers b(cfg, s, qkv, dout);
  forward_gpu(cfg, s, b, family);
  auto backward = [&] {
    b.dqkv.poison();
    b.work.poison();
    backward_gpu(cfg, s, b, family);
    return b.dqkv.download();
  };
  GpuRun r{b.o.download(), backward(), b.stats.download()};
  if (cfg.kind == AttentionKind::sage) {  // Q and K of qkv poisoned: only V may be read from it
    std::vector<bf16> v_only = qkv;
    const size_t slot = static_cast<size_t>(s.H) * s.d;
    for (size_t i = 0; i < v_only.size(); ++i)
      if ((i / slot) % 3 != 2) v_only[i] = __ushort_as_bfloat16(0xFFFF);
    b.qkv.upload(v_only);
  }
  const std::vector<bf16> again = backward();
  CHECK(std::memcmp(again.data(), r.dqkv.data(), again.size() * sizeof(bf16)) == 0);
  return r;
}

AttentionErrors errors_against_cpu(const AttentionConfig& cfg, const AttentionShape& s,
                                   const std::vector<bf16>& qkv, const std::vector<bf16>& dout,
                                   const GpuRun& run, const std::vector<int>& heads, bool lse) {
  const std::vector<int> compared = heads.empty() ? every_head(s) : heads;
  std::vector<cuda::AttentionErrorSums> per_head(compared.size());
#pragma omp parallel for schedule(dynamic)
  for (size_t i = 0; i < compared.size(); ++i)
    per_head[i] =
        cuda::compare_head_with_cpu(cfg, s, compared[i] / s.H, compared[i] % s.H, qkv, dout, run.o,
                                    run.dqkv, lse ? run.stats.data() : nullptr);
  cuda::AttentionErrorSums sums;
  for (const auto& e : per_head) sums.add(e);
  return cuda::relative_errors(sums);
}

// ---------------------------------------------------------------------------
// The cases.

namespace {

// The K-interval softmax of a config: the kind's, or sage's block; null if none.
const KIntervalOptions* kinterval_softmax(const AttentionConfig& cfg) {
  switch (cfg.kind) {
    case AttentionKind::fpa:
      return nullptr;
    case AttentionKind::sage:
      return cfg.sage.softmax ? &*cfg.sage.softmax : nullptr;
    case AttentionKind::kinterval:
      return &cfg.kinterval;
  }
  return nullptr;
}

// Inputs and whether their rows cleared the discontinuities' margin.
struct Drawn {
  AttentionInputs in;
  bool clear = true;
};

Drawn draw(const AttentionCase& c) {
  std::mt19937_64 gen = item_rng(c.index);
  const InputRecipe& r = c.inputs;
  const AttentionShape& s = c.shape;
  Drawn d;
  d.in.qkv = r.kind == InputRecipe::grid_exact ? grid_exact_qkv(s, r.q_sigma, gen)
                                               : normal_qkv(s, r.q_sigma, r.k_sigma, r.k_mean, gen);
  d.in.dout = normal_heads(s, gen);
  if (r.kind == InputRecipe::repeated_keys) repeat_first_four_keys(d.in.qkv, s, gen);
  if (r.kind == InputRecipe::wide_values) {
    scale_row_blocks(d.in.qkv, s, 3, 2);
    scale_row_blocks(d.in.dout, s, 1, 0);
  }
  if (r.kind == InputRecipe::zero_values) zero_head(d.in.qkv, s, 3, 2, zeroed_head(s));
  if (r.kind == InputRecipe::zero_dout) zero_head(d.in.dout, s, 1, 0, zeroed_head(s));
  if (const KIntervalOptions* softmax = kinterval_softmax(c.cfg))
    d.clear = r.kind == InputRecipe::grid_exact
                  ? keep_grid_exact_rows_off_discontinuities(*softmax, s, d.in.qkv, r.q_sigma, gen)
                  : keep_rows_off_discontinuities(*softmax, s, d.in.qkv, c.heads, r.q_sigma, gen);
  return d;
}

// Whether this device runs `family` of the case, as a family of its own.
bool runs_here(const AttentionCase& c, FpaKernels family) {
  const bool with_automatic =
      std::find(c.families.begin(), c.families.end(), FpaKernels::automatic) != c.families.end();
  switch (family) {
    case FpaKernels::automatic:
      return true;
    case FpaKernels::mma_sync:  // automatic is mma.sync off Hopper
      return !with_automatic || wgmma_available();
    case FpaKernels::wgmma:
      return wgmma_available();
  }
  return false;
}

// A run's heads compared with the CPU reference and their error sums.
struct Compared {
  std::vector<int> heads;
  std::vector<cuda::AttentionErrorSums> per_head;
};

}  // namespace

std::vector<CaseRun> check_cases(const std::vector<AttentionCase>& cases) {
  for (const AttentionCase& c : cases)
    REQUIRE((c.inputs.kind != InputRecipe::grid_exact || c.shape.T % 2 == 0));
  std::vector<Drawn> drawn(cases.size());
#pragma omp parallel for schedule(dynamic)
  for (size_t i = 0; i < cases.size(); ++i) drawn[i] = draw(cases[i]);

  // The GPU runs one after another, then every compared head of every run against
  // the CPU reference in parallel (the fp64 reference is the cost).
  std::vector<CaseRun> runs;
  std::vector<Compared> compared;
  bool wgmma_skipped = false;
  for (size_t i = 0; i < cases.size(); ++i) {
    const AttentionCase& c = cases[i];
    INFO("case " << c.index << ": " << describe(c.cfg, c.shape));
    REQUIRE(drawn[i].clear);  // a row that never clears its margin: the inputs are degenerate
    for (FpaKernels family : c.families) {
      if (!runs_here(c, family)) {
        wgmma_skipped = wgmma_skipped || family == FpaKernels::wgmma;
        continue;
      }
      INFO("family " << family_name(family));
      const AttentionInputs& in = drawn[i].in;
      runs.push_back({i, family, run_gpu(c.cfg, c.shape, in.qkv, in.dout, family)});
      Compared& k = compared.emplace_back();
      k.heads = c.heads.empty() ? every_head(c.shape) : c.heads;
      k.per_head.resize(k.heads.size());
    }
  }
  if (wgmma_skipped)
    std::printf("attention: no sm_90a device or build, the wgmma kernels are not checked\n");
  std::vector<std::pair<size_t, size_t>> jobs;  // (run, head)
  for (size_t r = 0; r < runs.size(); ++r)
    for (size_t h = 0; h < compared[r].heads.size(); ++h) jobs.push_back({r, h});
#pragma omp parallel for schedule(dynamic)
  for (size_t j = 0; j < jobs.size(); ++j) {
    const auto [r, h] = jobs[j];
    const AttentionCase& c = cases[runs[r].c];
    const AttentionInputs& in = drawn[runs[r].c].in;
    const GpuRun& run = runs[r].run;
    const int bh = compared[r].heads[h];
    compared[r].per_head[h] =
        cuda::compare_head_with_cpu(c.cfg, c.shape, bh / c.shape.H, bh % c.shape.H, in.qkv, in.dout,
                                    run.o, run.dqkv, c.tol.lse >= 0 ? run.stats.data() : nullptr);
  }

  for (size_t r = 0; r < runs.size(); ++r) {
    const AttentionCase& c = cases[runs[r].c];
    const char* family = family_name(runs[r].family);
    cuda::AttentionErrorSums sums;
    for (const auto& e : compared[r].per_head) sums.add(e);
    const AttentionErrors e = cuda::relative_errors(sums);
    const bool lse = c.tol.lse >= 0;
    char lse_text[32] = "";
    if (lse) std::snprintf(lse_text, sizeof lse_text, " lse %.2e", e.lse);
    std::printf("%-14s %s  rel L2: o %.2e%s dq %.2e dk %.2e dv %.2e\n", family,
                describe(c.cfg, c.shape).c_str(), e.o, lse_text, e.dq, e.dk, e.dv);
    INFO("case " << c.index << " (" << family << "): " << describe(c.cfg, c.shape) << "; rel L2 o "
                 << e.o << " lse " << e.lse << " dq " << e.dq << " dk " << e.dk << " dv " << e.dv);
    check_errors(e, c.tol);
  }
  return runs;
}

void check_errors(const AttentionErrors& e, const Tolerance& tol) {
  CHECK(e.o < tol.o);
  if (tol.lse >= 0) CHECK(e.lse < tol.lse);
  CHECK(e.dq < tol.dq);
  CHECK(e.dk < tol.dk);
  CHECK(e.dv < tol.dv);
}

}  // namespace qattn::test
