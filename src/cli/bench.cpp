// qattn bench attention: forward and backward speed of a CUDA attention kind.
// Causal FLOPs as FlashAttention counts them: forward 2·B·H·T²·d (4·B·H·T²·d
// halved by the mask), backward 2.5 × forward. Times are medians of CUDA-event
// intervals after warm-up, on random normal inputs; the error column compares
// head (0, 0) with the fp64 CPU reference (relative L2). Options of the kind
// come from the flags below and from --set attention.PATH=value, read as the
// config's "attention" section (e.g. --set attention.sage.softmax.K=16).
// --phases also times each launch of the two calls (the kinds' launchers record
// CUDA events around their launches into a PhaseRecorder, phases.cuh) in the
// same runs and prints one row per launch under the shape's row.
#include <algorithm>
#include <map>
#include <memory>
#include <cstdio>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "checks.hpp"
#include "commands.hpp"
#include "qattn/attention.hpp"
#include "qattn/config.hpp"

#ifdef QATTN_HAVE_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "attention/attention.cuh"
#include "attention/phases.cuh"
#include "attention/reference_check.hpp"
#include "common.cuh"
#endif

namespace qattn::cli {
namespace {

struct BenchOptions {
  std::string kind = "fpa";
  std::vector<std::string> shapes;
  int warmup = 5, reps = 20;
  bool no_check = false;       // skip the CPU-reference error column
  bool phases = false;         // one row per launch
  KIntervalOptions kinterval;  // used with --kind kinterval
  std::vector<std::string> sets;  // attention.PATH=value
};

AttentionKind parse_kind(const std::string& name) {
  std::string allowed;
  for (const auto& [n, kind] : kAttentionKindNames) {
    if (name == n) return kind;
    allowed += (allowed.empty() ? "" : ", ") + std::string(n);
  }
  throw std::invalid_argument("--kind '" + name + "': unknown attention kind (allowed: " + allowed + ")");
}

// An enum's names (value_names.hpp) as CLI11's transformer takes them.
template <typename E, std::size_t N>
std::map<std::string, E> by_name(const ValueName<E> (&names)[N]) {
  std::map<std::string, E> m;
  for (const auto& [name, value] : names) m[name] = value;
  return m;
}

// The kind and its options: --kind and the kinterval flags, then every --set,
// validated as the config's attention section.
AttentionConfig attention_config(const BenchOptions& opt) {
  nlohmann::json j;
  j["attention"]["kind"] = to_string(parse_kind(opt.kind));
  if (opt.kind == "kinterval") {
    const KIntervalOptions& k = opt.kinterval;
    j["attention"]["kinterval"] = {{"K", k.K},
                                   {"calibration", to_string(k.calibration)},
                                   {"window", k.window},
                                   {"rounding", to_string(k.rounding)},
                                   {"ste", to_string(k.ste)},
                                   {"ste_window_mask", k.ste_window_mask},
                                   {"detach_extrema", k.detach_extrema}};
  }
  for (const auto& a : opt.sets) {
    if (a.rfind("attention.", 0) != 0)
      throw std::invalid_argument("--set " + a + ": bench attention takes only attention.PATH=value");
    apply_override(j, a);
  }
  return attention_config_from_json(j);
}

#ifdef QATTN_HAVE_CUDA
using cuda::AttentionShape;
using bf16 = __nv_bfloat16;

// One line with the options that change the maths of the kind.
void print_options(const AttentionConfig& cfg) {
  auto kinterval = [](const char* what, const KIntervalOptions& k) {
    std::printf("%s: K=%d calibration=%s window=%g rounding=%s ste=%s%s%s\n", what, k.K,
                to_string(k.calibration).c_str(), k.window, to_string(k.rounding).c_str(),
                to_string(k.ste).c_str(), k.detach_extrema ? " detach_extrema" : "",
                k.ste_window_mask ? " ste_window_mask" : "");
  };
  switch (cfg.kind) {
    case AttentionKind::fpa:
      return;  // no options
    case AttentionKind::kinterval:
      return kinterval("kinterval", cfg.kinterval);
    case AttentionKind::sage: {
      const SagePrecision& p = cfg.sage.precision;
      std::printf("sage: qk=%s pv=%s dv=%s dp=%s dq=%s dk=%s bwd_granularity=%s smooth_k=%d smooth_q=%d\n",
                  to_string(p.qk).c_str(), to_string(p.pv).c_str(), to_string(p.dv).c_str(),
                  to_string(p.dp).c_str(), to_string(p.dq).c_str(), to_string(p.dk).c_str(),
                  to_string(cfg.sage.bwd_granularity).c_str(), cfg.sage.smooth_k, cfg.sage.smooth_q);
      if (cfg.sage.softmax) kinterval("sage softmax kinterval", *cfg.sage.softmax);
      return;
    }
  }
}

AttentionShape parse_shape(const std::string& text) {
  const std::string what = "--shape '" + text + "': expected B,H,T,d (four positive integers)";
  std::vector<int> v;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int x = 0;
    try {
      x = std::stoi(item, &used);
    } catch (const std::exception&) {
      throw std::invalid_argument(what);
    }
    if (used != item.size() || x < 1) throw std::invalid_argument(what);
    v.push_back(x);
  }
  if (v.size() != 4) throw std::invalid_argument(what);
  return {v[0], v[1], v[2], v[3]};
}

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  explicit DeviceBuffer(size_t n) {
    CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T)));
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// Normal(0, 1) values in bf16, filled in parallel chunks with their own seeds.
std::vector<bf16> random_bf16(size_t n, unsigned long long seed) {
  std::vector<bf16> x(n);
  constexpr size_t kChunk = 1 << 20;
  const long long chunks = static_cast<long long>((n + kChunk - 1) / kChunk);
#pragma omp parallel for
  for (long long c = 0; c < chunks; ++c) {
    std::mt19937_64 rng(seed * 1000003ULL + c);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const size_t end = std::min(n, static_cast<size_t>(c + 1) * kChunk);
    for (size_t i = static_cast<size_t>(c) * kChunk; i < end; ++i)
      x[i] = __float2bfloat16(normal(rng));
  }
  return x;
}

template <typename T>
std::vector<T> to_host(const T* dev, size_t n) {
  std::vector<T> h(n);
  CUDA_CHECK(cudaMemcpy(h.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One row per launch of a call (`call`: fwd or bwd): its median over the timed
// runs, its share of the call's median time, its work and rate where known;
// then their sum.
void print_phases(const char* call, const std::vector<std::vector<cuda::TimedPhase>>& runs,
                  float call_ms) {
  const std::vector<cuda::TimedPhase>& first = runs.front();
  float sum = 0;
  for (size_t i = 0; i < first.size(); ++i) {
    std::vector<float> ms;
    for (const auto& run : runs) {
      if (run.size() != first.size() || run[i].name != first[i].name)
        throw std::logic_error("bench attention --phases: the " + std::string(call) +
                               " call's launches differ from one run to the next");
      ms.push_back(run[i].ms);
    }
    const float m = median(ms);
    sum += m;
    const cuda::PhaseWork& w = first[i].work;
    std::printf("  %s %-15s %8.3f %5.1f%%", call, first[i].name.c_str(), m, 100 * m / call_ms);
    if (w.flops > 0)
      std::printf("  %9.1f GFLOP %8.1f TFLOP/s", w.flops / 1e9, w.flops / (m * 1e9));
    else if (w.bytes > 0)
      std::printf("  %9.1f MB    %8.1f GB/s", w.bytes / 1e6, w.bytes / (m * 1e6));
    std::printf("\n");
  }
  std::printf("  %s %-15s %8.3f %5.1f%%  of %.3f ms: the rest is between launches\n", call,
              "sum", sum, 100 * sum / call_ms, call_ms);
}

void bench_shape(const AttentionConfig& cfg, const AttentionShape& s, const BenchOptions& opt,
                 unsigned long long seed) {
  const size_t n_qkv = static_cast<size_t>(s.B) * s.T * 3 * s.H * s.d;
  const size_t n_o = static_cast<size_t>(s.B) * s.T * s.H * s.d;
  const size_t n_stats = static_cast<size_t>(s.B) * s.H * s.T * cuda::attention_row_stats(cfg, s.d);
  const std::vector<bf16> qkv = random_bf16(n_qkv, seed), dout = random_bf16(n_o, seed + 1);
  DeviceBuffer<bf16> d_qkv(n_qkv), d_o(n_o), d_dout(n_o), d_dqkv(n_qkv);
  DeviceBuffer<float> d_stats(n_stats);
  // One saved buffer and one scratch, as one layer of a model has.
  DeviceBuffer<unsigned char> d_saved(cuda::attention_saved_bytes(cfg, s)),
      d_work(cuda::attention_workspace_bytes(cfg, s));
  CUDA_CHECK(cudaMemcpy(d_qkv.ptr, qkv.data(), n_qkv * sizeof(bf16), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_dout.ptr, dout.data(), n_o * sizeof(bf16), cudaMemcpyHostToDevice));

  cuda::PhaseRecorder fwd_phases, bwd_phases;  // --phases: each launch of the call
  auto forward = [&] {
    cuda::attention_forward(cfg, s, d_qkv.ptr, d_o.ptr, d_stats.ptr, d_saved.ptr, nullptr,
                            opt.phases ? &fwd_phases : nullptr);
  };
  auto backward = [&] {
    cuda::attention_backward(cfg, s, d_qkv.ptr, d_o.ptr, d_dout.ptr, d_stats.ptr, d_saved.ptr,
                             d_dqkv.ptr, d_work.ptr, nullptr, opt.phases ? &bwd_phases : nullptr);
  };
  for (int i = 0; i < opt.warmup; ++i) forward(), backward();
  fwd_phases.take(), bwd_phases.take();  // the warm-up's
  cudaEvent_t ev[3];
  for (auto& e : ev) CUDA_CHECK(cudaEventCreate(&e));
  std::vector<float> fwd_ms, bwd_ms;
  std::vector<std::vector<cuda::TimedPhase>> fwd_runs, bwd_runs;
  for (int i = 0; i < opt.reps; ++i) {
    CUDA_CHECK(cudaEventRecord(ev[0]));
    forward();
    CUDA_CHECK(cudaEventRecord(ev[1]));
    backward();
    CUDA_CHECK(cudaEventRecord(ev[2]));
    CUDA_CHECK(cudaEventSynchronize(ev[2]));
    float a = 0, b = 0;
    CUDA_CHECK(cudaEventElapsedTime(&a, ev[0], ev[1]));
    CUDA_CHECK(cudaEventElapsedTime(&b, ev[1], ev[2]));
    fwd_ms.push_back(a), bwd_ms.push_back(b);
    if (opt.phases) fwd_runs.push_back(fwd_phases.take()), bwd_runs.push_back(bwd_phases.take());
  }
  for (auto& e : ev) CUDA_CHECK(cudaEventDestroy(e));

  const double fwd_flops = 2.0 * s.B * s.H * static_cast<double>(s.T) * s.T * s.d;
  const float f = median(fwd_ms), b = median(bwd_ms);
  std::printf("%-6s %3d %3d %6d %4d  %8.3f %8.1f  %8.3f %8.1f  %9.3f", to_string(cfg.kind).c_str(),
              s.B, s.H, s.T, s.d, f, fwd_flops / (f * 1e9), b, 2.5 * fwd_flops / (b * 1e9), f + b);
  if (!opt.no_check) {
    const auto sums = cuda::compare_head_with_cpu(cfg, s, 0, 0, qkv, dout, to_host(d_o.ptr, n_o),
                                                  to_host(d_dqkv.ptr, n_qkv), nullptr);
    const auto e = cuda::relative_errors(sums);
    std::printf("  %.1e %.1e %.1e %.1e", e.o, e.dq, e.dk, e.dv);
  }
  std::printf("\n");
  if (opt.phases) {
    print_phases("fwd", fwd_runs, f);
    print_phases("bwd", bwd_runs, b);
  }
  std::fflush(stdout);
}
#endif

void run_bench_attention(const BenchOptions& opt) {
  const AttentionConfig cfg = attention_config(opt);
#ifdef QATTN_HAVE_CUDA
  std::vector<AttentionShape> shapes;
  for (const auto& text : opt.shapes) shapes.push_back(parse_shape(text));
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
    throw std::runtime_error("bench attention needs a CUDA device; none is visible");
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf(
      "device: %s (sm_%d%d), %d warm-up + %d timed runs, median; TFLOP/s causal "
      "(fwd 2BHT^2d, bwd 2.5x)%s\n",
      prop.name, prop.major, prop.minor, opt.warmup, opt.reps,
      !opt.no_check ? "; err = rel. L2 of head (0,0) vs fp64 CPU" : "");
  print_options(cfg);
  if (opt.phases)
    std::printf(
        "phases: each launch between events of its own in the same runs (which the call's time "
        "then includes), median; %% of the call's median; work: the bytes of every array read or "
        "written once, or the FLOPs of the causal products it runs (BHT^2d each)\n");
  std::printf("%-6s %3s %3s %6s %4s  %8s %8s  %8s %8s  %9s%s\n", "kind", "B", "H", "T", "d",
              "fwd ms", "TFLOP/s", "bwd ms", "TFLOP/s", "total ms",
              !opt.no_check ? "  err o   dq      dk      dv" : "");
  unsigned long long seed = std::random_device{}();
  for (const auto& s : shapes) bench_shape(cfg, s, opt, seed++);
#else
  throw std::runtime_error(
      "bench attention needs the CUDA backend; this qattn was built with QATTN_CUDA=OFF");
#endif
}

}  // namespace

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks of the CUDA kernels");
  bench->require_subcommand(1);
  auto opt = std::make_shared<BenchOptions>();
  CLI::App* attn =
      bench->add_subcommand("attention", "Forward and backward TFLOP/s of an attention kind");
  attn->add_option("--kind", opt->kind, "attention kind: fpa, sage or kinterval")
      ->capture_default_str();
  attn->add_option("--shape", opt->shapes, "B,H,T,d (repeatable)")->required();
  attn->add_option("--warmup", opt->warmup, "untimed runs first")
      ->check(integer_range(0, 10000))
      ->capture_default_str();
  attn->add_option("--reps", opt->reps, "timed runs (the median is printed)")
      ->check(integer_range(1, 10000))
      ->capture_default_str();
  attn->add_flag("--no-check", opt->no_check, "skip the comparison with the CPU reference");
  attn->add_flag("--phases", opt->phases,
                 "also time each launch of the forward and the backward (pre-passes, kernels)");
  attn->add_option("--K", opt->kinterval.K, "kinterval: intervals")
      ->check(integer_range(1, 65535))
      ->capture_default_str();
  attn->add_option("--calibration", opt->kinterval.calibration, "kinterval: minmax or fwm")
      ->transform(CLI::CheckedTransformer(by_name(kCalibrationNames)))
      ->capture_default_str();
  attn->add_option("--window", opt->kinterval.window, "kinterval: fwm window W in nats")
      ->check(number_range(1e-6, 1e6))
      ->capture_default_str();
  attn->add_option("--rounding", opt->kinterval.rounding, "kinterval: nearest or lerp")
      ->transform(CLI::CheckedTransformer(by_name(kRoundingNames)))
      ->capture_default_str();
  attn->add_option("--ste", opt->kinterval.ste, "kinterval: weight or prob (nearest only)")
      ->transform(CLI::CheckedTransformer(by_name(kSteNames)))
      ->capture_default_str();
  attn->add_option("--set", opt->sets,
                   "an option of the kind: attention.PATH=value as in a config (repeatable), e.g. "
                   "attention.sage.softmax.K=16")
      ->type_name("attention.PATH=VALUE");
  attn->add_flag("--ste-window-mask", opt->kinterval.ste_window_mask,
                 "kinterval: weight STE zero below the fwm window");
  attn->add_flag("--detach-extrema", opt->kinterval.detach_extrema,
                 "kinterval: no derivative through the row max and min");
  attn->callback([opt] { run_bench_attention(*opt); });
}

}  // namespace qattn::cli
