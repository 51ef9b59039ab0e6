// Tile-shape sweep of the SageBwd kernels (kernels/attention/sage/sage.cu), a tuning
// aid for sage_default_tiles: times the forward and the backward (each with its
// quantisation pre-pass, as training runs them) for every SageTiles choice of
// the mma.sync kernels at the shapes of issue #7, default options, and checks
// that every choice's outputs equal the default's bit for bit. Then the
// forward's and the backward's pre-pass alone, the forward and the backward
// with all kernels on each family (wgmma where the device and build have it;
// sage_default_tiles picks per kernel, sage.cuh), and the backward with each
// combination of the dQ and the dK/dV kernels' families, with how far the
// outputs differ from mma.sync's.
// Random normal inputs, CUDA events, median of 20 runs after 3 warm-ups.
//
//   cmake --build build --target sage_tiles && build/sage_tiles
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "attention/attention.cuh"
#include "attention/fpa/fpa.cuh"
#include "attention/sage/quant.cuh"
#include "attention/sage/sage.cuh"
#include "common.cuh"
#include "tile_timing.cuh"

using namespace qattn;
using namespace qattn::cuda;
using tiles::fill_normal;
using tiles::median_ms;

namespace {

template <class T>
std::vector<T> download(const T* dev, size_t n) {
  std::vector<T> h(n);
  CUDA_CHECK(cudaMemcpy(h.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

void sweep(int B, int H, int T, int d) {
  const AttentionShape s{B, H, T, d};
  const SageOptions opt;
  const size_t n_qkv = size_t(B) * T * 3 * H * d, n_o = size_t(B) * T * H * d,
               n_stats = size_t(B) * H * T;
  const size_t saved_bytes = sage_saved_bytes(opt, s), scratch_bytes = sage_workspace_bytes(opt, s);
  bf16 *qkv, *o, *dout, *dqkv;
  float* stats;
  void *saved, *scratch;  // the forward's quantised Q, K, V; the backward's scratch
  CUDA_CHECK(cudaMalloc(&qkv, n_qkv * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&dqkv, n_qkv * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&o, n_o * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&dout, n_o * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&stats, n_stats * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&saved, saved_bytes));
  CUDA_CHECK(cudaMalloc(&scratch, scratch_bytes));
  fill_normal<<<1024, 256>>>(qkv, n_qkv, 1234u);
  fill_normal<<<1024, 256>>>(dout, n_o, 5678u);
  CUDA_CHECK_LAUNCH();

  const double fwd_flops = 2.0 * B * H * double(T) * T * d;  // FPA's count (performance.md)
  const SageTiles dflt = sage_default_tiles(s);
  std::printf("B=%d H=%d T=%d d=%d (default tiles: forward %d, dq %d, dkdv %d warps)\n", B, H, T, d,
              dflt.forward, dflt.dq, dflt.dkdv);
  // One forward and backward under `tiles`: their median times and outputs.
  struct Pass {
    float fwd, bwd;
    std::vector<bf16> o, dqkv;
  };
  auto timed_pass = [&](const SageTiles& tiles) {
    Pass r;
    r.fwd = median_ms([&] { sage_forward(opt, s, qkv, o, stats, saved, nullptr, tiles); });
    r.o = download(o, n_o);
    r.bwd = median_ms(
        [&] { sage_backward(opt, s, qkv, o, dout, stats, saved, dqkv, scratch, nullptr, tiles); });
    r.dqkv = download(dqkv, n_qkv);
    return r;
  };
  std::vector<bf16> first_o, first_dqkv;
  for (SageTiles tiles : {dflt, SageTiles{4, 4, 4}, SageTiles{8, 8, 8}, SageTiles{4, 4, 8},
                          SageTiles{8, 4, 8}, SageTiles{4, 8, 8}, SageTiles{8, 8, 4}}) {
    tiles.forward_kernels = tiles.dq_kernels = tiles.dkdv_kernels = FpaKernels::mma_sync;
    const auto [fwd, bwd, o_now, dqkv_now] = timed_pass(tiles);
    if (first_o.empty()) first_o = o_now, first_dqkv = dqkv_now;
    const bool same = std::memcmp(o_now.data(), first_o.data(), n_o * sizeof(bf16)) == 0 &&
                      std::memcmp(dqkv_now.data(), first_dqkv.data(), n_qkv * sizeof(bf16)) == 0;
    std::printf(
        "  fwd %d  dq %d  dkdv %d warps: fwd %7.3f ms (%5.1f TFLOP/s)  bwd %7.3f ms (%5.1f)  total "
        "%7.3f ms  "
        "%s\n",
        tiles.forward, tiles.dq, tiles.dkdv, fwd, fwd_flops / (fwd * 1e9), bwd,
        2.5 * fwd_flops / (bwd * 1e9), fwd + bwd,
        same ? "same bits as default" : "DIFFERS from default");
  }

  const SageWorkspace parts = sage_workspace(opt, s, saved, scratch, sage_copies(opt));
  const float prepass = median_ms(
      [&] { sage_quantise_inputs(opt, s, qkv, parts, sage_forward_copies(opt), nullptr); });
  std::printf("  forward pre-pass alone: %7.3f ms\n", prepass);
  std::vector<std::pair<FpaKernels, const char*>> families = {{FpaKernels::mma_sync, "mma.sync"}};
  if (fpa_wgmma_available()) families.push_back({FpaKernels::wgmma, "wgmma"});
  auto max_difference = [](const std::vector<bf16>& a, const std::vector<bf16>& b) {
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i)
      worst = std::max(worst, std::abs(double(__bfloat162float(a[i])) - __bfloat162float(b[i])));
    return worst;
  };
  for (const auto& [family, name] : families) {
    SageTiles tiles = dflt;
    tiles.forward_kernels = tiles.dq_kernels = tiles.dkdv_kernels = family;
    const auto [fwd, bwd, o_now, dqkv_now] = timed_pass(tiles);
    std::printf(
        "  %-8s forward %7.3f ms (%5.1f TFLOP/s) with the pre-pass, %7.3f ms without; backward "
        "(all "
        "on %s) %7.3f ms; total %7.3f ms; max |diff| from mma.sync O %.1e dQKV %.1e\n",
        name, fwd, fwd_flops / (fwd * 1e9), fwd - prepass, name, bwd, fwd + bwd,
        max_difference(o_now, first_o), max_difference(dqkv_now, first_dqkv));
  }
  // The backward with its dQ and dK/dV kernels on each family, after the
  // mma.sync forward (the statistics the default tiles' gradients above came from).
  SageTiles mma_sync = dflt;
  mma_sync.forward_kernels = mma_sync.dq_kernels = mma_sync.dkdv_kernels = FpaKernels::mma_sync;
  sage_forward(opt, s, qkv, o, stats, saved, nullptr, mma_sync);
  // The pre-pass as the default tiles run it: with both backward kernels on
  // wgmma (where they run) V and dO are read in place and not copied.
  const bool in_place = fpa_wgmma_available();
  const float bwd_prepass = median_ms([&] {
    sage_quantise_gradient(opt, s, qkv, o, dout, parts, sage_backward_copies(opt, in_place),
                           nullptr);
  });
  std::printf("  backward pre-pass alone (%s): %7.3f ms\n",
              in_place ? "V, dO in place" : "with V, dO copies", bwd_prepass);
  for (const auto& [dq_family, dq_name] : families) {
    for (const auto& [family, name] : families) {
      SageTiles tiles = mma_sync;
      tiles.dq_kernels = dq_family;
      tiles.dkdv_kernels = family;
      const float bwd = median_ms([&] {
        sage_backward(opt, s, qkv, o, dout, stats, saved, dqkv, scratch, nullptr, tiles);
      });
      const std::vector<bf16> dqkv_now = download(dqkv, n_qkv);
      double worst[3] = {0, 0, 0};  // dQ, dK, dV
      for (size_t i = 0; i < n_qkv; ++i) {
        const size_t slot = (i / (size_t(H) * d)) % 3;
        worst[slot] = std::max(worst[slot], std::abs(double(__bfloat162float(dqkv_now[i])) -
                                                     __bfloat162float(first_dqkv[i])));
      }
      std::printf(
          "  backward, dQ on %-8s dK/dV on %-8s %7.3f ms (%5.1f TFLOP/s) with the pre-pass, %7.3f "
          "ms "
          "without; max |diff| from mma.sync: dQ %.1e dK %.1e dV %.1e\n",
          dq_name, name, bwd, 2.5 * fwd_flops / (bwd * 1e9), bwd - bwd_prepass, worst[0], worst[1],
          worst[2]);
    }
  }
  for (void* p : {(void*)qkv, (void*)dqkv, (void*)o, (void*)dout, (void*)stats, saved, scratch})
    CUDA_CHECK(cudaFree(p));
}

}  // namespace

int main() {
  sweep(8, 12, 1024, 64);
  sweep(8, 12, 2048, 64);
  sweep(4, 12, 4096, 64);
  sweep(4, 16, 4096, 128);
  sweep(1, 16, 16384, 128);
  return 0;
}
