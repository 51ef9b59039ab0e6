// FPA flash attention on the GPU against the CPU reference (fp64, on the same
// bf16-rounded inputs), forward and backward, at T in {64, 1000, 1024, 4096}
// (1000: a tail tile) and d in {64, 128}, for each kernel family the device
// runs (mma.sync everywhere; wgmma on Hopper). Inputs are fresh random every run
// (the seed is printed); outputs are poisoned with NaN first, so an element the
// kernels forget to write fails the comparison.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

#include "attention/attention.cuh"
#include "attention/fpa/fpa.cuh"
#include "attention/reference_check.hpp"
#include "common.cuh"
#include "gpu_test_util.hpp"

namespace {

using qattn::AttentionConfig;
using qattn::cuda::AttentionErrors;
using qattn::cuda::AttentionErrorSums;
using qattn::cuda::AttentionShape;
using qattn::cuda::FpaKernels;
using bf16 = __nv_bfloat16;

using qattn::test::DeviceBuffer;

std::vector<bf16> random_bf16(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<bf16> x(n);
  for (auto& v : x) v = __float2bfloat16(normal(rng));
  return x;
}

// Runs forward and backward (twice) with one kernel family on the GPU and
// compares every head with the CPU reference; heads run in parallel on the host.
AttentionErrors check_fpa(const AttentionShape& s, FpaKernels kernels, unsigned long long seed) {
  const AttentionConfig cfg;  // kind fpa
  const size_t n_qkv = static_cast<size_t>(s.B) * s.T * 3 * s.H * s.d;
  const size_t n_o = static_cast<size_t>(s.B) * s.T * s.H * s.d;
  const size_t n_stats =
      static_cast<size_t>(s.B) * s.H * s.T * qattn::cuda::attention_row_stats(cfg, s.d);
  std::mt19937_64 rng(seed);
  const std::vector<bf16> qkv = random_bf16(n_qkv, rng);  // (B, T, 3, H, d)
  const std::vector<bf16> dout = random_bf16(n_o, rng);   // (B, T, H, d)

  DeviceBuffer<bf16> d_qkv(n_qkv), d_o(n_o), d_dout(n_o), d_dqkv(n_qkv), d_dqkv2(n_qkv);
  DeviceBuffer<float> d_stats(n_stats);
  DeviceBuffer<unsigned char> d_work(qattn::cuda::attention_workspace_bytes(cfg, s));
  d_qkv.upload(qkv);
  d_dout.upload(dout);
  // Poison: all-ones bytes are NaN in bf16 and fp32.
  d_o.poison();
  d_stats.poison();
  d_dqkv.poison();
  d_dqkv2.poison();

  qattn::cuda::fpa_forward(s, d_qkv.get(), d_o.get(), d_stats.get(), nullptr, kernels);
  for (auto* dqkv_out : {&d_dqkv, &d_dqkv2})
    qattn::cuda::fpa_backward(s, d_qkv.get(), d_o.get(), d_dout.get(), d_stats.get(),
                              reinterpret_cast<float*>(d_work.get()), dqkv_out->get(), nullptr,
                              kernels);
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto o = d_o.download();
  const auto stats = d_stats.download();
  const auto dqkv = d_dqkv.download();
  const auto dqkv2 = d_dqkv2.download();
  // Deterministic backward: two runs agree bit for bit.
  CHECK(std::memcmp(dqkv.data(), dqkv2.data(), n_qkv * sizeof(bf16)) == 0);

  const int heads = s.B * s.H;
  std::vector<AttentionErrorSums> per_head(heads);
#pragma omp parallel for schedule(dynamic)
  for (int bh = 0; bh < heads; ++bh)
    per_head[bh] = qattn::cuda::compare_head_with_cpu(cfg, s, bh / s.H, bh % s.H, qkv, dout, o,
                                                      dqkv, stats.data());
  AttentionErrorSums sums;
  for (const auto& e : per_head) sums.add(e);
  return qattn::cuda::relative_errors(sums);
}

// bf16 operands (8-bit mantissa) with fp32 accumulation: O, dQ, dK, dV land
// near 3e-3; L is fp32 throughout.
constexpr double kTolBf16 = 1e-2;
constexpr double kTolLse = 1e-4;

}  // namespace

TEST_CASE("FPA flash attention matches the CPU reference, forward and backward", "[attention]") {
  const unsigned long long seed =
      static_cast<unsigned long long>(std::chrono::system_clock::now().time_since_epoch().count());
  std::printf("FPA attention test seed %llu\n", seed);
  // Few heads at long T keep the O(T^2 d) fp64 reference fast.
  const AttentionShape shapes[] = {
      {2, 3, 64, 64},   {2, 3, 64, 128},   {2, 2, 1000, 64}, {2, 2, 1000, 128},
      {1, 3, 1024, 64}, {1, 3, 1024, 128}, {1, 2, 4096, 64}, {1, 2, 4096, 128},
  };
  std::vector<std::pair<FpaKernels, const char*>> families = {{FpaKernels::mma_sync, "mma.sync"}};
  if (qattn::cuda::fpa_wgmma_available())
    families.push_back({FpaKernels::wgmma, "wgmma"});
  else
    std::printf("FPA attention: no sm_90a device or build, the wgmma kernels are not checked\n");
  for (const auto& [kernels, name] : families) {
    for (const auto& s : shapes) {
      const AttentionErrors e = check_fpa(s, kernels, seed + s.T + s.d);
      std::printf("%-8s B=%d H=%d T=%4d d=%3d  rel L2: o %.2e  lse %.2e  dq %.2e  dk %.2e  dv %.2e\n",
                  name, s.B, s.H, s.T, s.d, e.o, e.lse, e.dq, e.dk, e.dv);
      INFO(name << " B=" << s.B << " H=" << s.H << " T=" << s.T << " d=" << s.d << " seed=" << seed);
      CHECK(e.o < kTolBf16);
      CHECK(e.lse < kTolLse);
      CHECK(e.dq < kTolBf16);
      CHECK(e.dk < kTolBf16);
      CHECK(e.dv < kTolBf16);
    }
  }
}

TEST_CASE("CUDA attention rejects unsupported head dims", "[attention]") {
  const AttentionShape bad_d{1, 1, 64, 96};
  CHECK_THROWS_AS(qattn::cuda::attention_forward(AttentionConfig{}, bad_d, nullptr, nullptr,
                                                 nullptr, nullptr, nullptr),
                  std::invalid_argument);
}
