// Helpers for the GPU tests: device buffers, fresh random inputs (the run's
// seed printed, QATTN_TEST_SEED replays it), poisoning, bf16 rounding,
// relative L2 error.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "common.cuh"

namespace qattn::test {

using cuda::bf16;

// One device allocation of n T's; freed with the object.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)));
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return p_; }
  void upload(const std::vector<T>& h) {
    REQUIRE(h.size() == n_);
    CUDA_CHECK(cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> h(n_);
    CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  // NaN in bf16 and fp32 alike: every byte 0xFF. An element the kernel leaves
  // unwritten then fails the comparison.
  void poison() { CUDA_CHECK(cudaMemset(p_, 0xFF, n_ * sizeof(T))); }

 private:
  T* p_ = nullptr;
  size_t n_;
};

// The run's seed: fresh each run and printed, or QATTN_TEST_SEED=<seed>, which
// replays a run's inputs.
inline uint64_t test_seed() {
  static const uint64_t seed = [] {
    const char* replay = std::getenv("QATTN_TEST_SEED");
    const uint64_t s = replay ? std::strtoull(replay, nullptr, 10) : std::random_device{}();
    std::printf("gpu tests: random seed %llu%s\n", static_cast<unsigned long long>(s),
                replay ? " (QATTN_TEST_SEED)" : "");
    return s;
  }();
  return seed;
}

// One generator from the run's seed for the whole run: a test replays with the
// same seed, test filter and order.
inline std::mt19937_64& rng() {
  static std::mt19937_64 gen(test_seed());
  return gen;
}

// A generator of its own for item `index` of a list (the attention cases), from
// the run's seed: the item replays with the same seed whatever else runs.
inline std::mt19937_64 item_rng(uint64_t index) {
  const uint64_t seed = test_seed();
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                    static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32)};
  return std::mt19937_64(seq);
}

inline std::vector<float> randn(size_t n, std::mt19937_64& gen, float scale = 1.0f,
                                float mean = 0.0f) {
  std::normal_distribution<float> d(mean, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}
inline std::vector<float> randn(size_t n, float scale = 1.0f, float mean = 0.0f) {
  return randn(n, rng(), scale, mean);
}
inline std::vector<int32_t> random_tokens(size_t n, int V) {
  std::uniform_int_distribution<int32_t> d(0, V - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng());
  return v;
}

inline std::vector<bf16> to_bf16(const std::vector<float>& x) {
  std::vector<bf16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = __float2bfloat16(x[i]);
  return y;
}
inline std::vector<float> to_float(const std::vector<bf16>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = __bfloat162float(x[i]);
  return y;
}
// x rounded to bf16 and back: the values the GPU actually sees.
inline std::vector<float> round_bf16(const std::vector<float>& x) { return to_float(to_bf16(x)); }

// ||a - b|| / ||b|| in double; NaN anywhere gives NaN, which fails every "<".
inline double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Fills every SM's shared memory with 0x7F bytes and waits (shared_memory_poison.cu).
void poison_shared_memory();

// ψ's level of each (x[i], s[i]) on the device by quant.cuh's quantise_level (a
// reciprocal per scale) and by quantise_level_by_division (quant_levels.cu).
void quant_levels(const std::vector<float>& x, const std::vector<float>& s,
                  std::vector<uint32_t>& by_reciprocal, std::vector<uint32_t>& by_division);
// ψ's scale and its inverse of weights whose largest magnitude is amax[i], as
// the kernels compute them (scales_of_amax), and the level amax itself gets
// (quant_levels.cu).
void weight_scales(const std::vector<float>& amax, std::vector<float>& scale,
                   std::vector<float>& inv, std::vector<int>& top_level);
// CUDA's e4m3 code of each x[i] (saturating, round to nearest even): by the
// device's conversion instruction and by <cuda_fp8.h>'s host converter (e4m3_codes.cu).
void e4m3_codes(const std::vector<float>& x, std::vector<uint8_t>& on_device,
                std::vector<uint8_t>& on_host);

}  // namespace qattn::test
