// Tile-shape sweep of the FPA flash kernels, a tuning aid for kernels/attention/fpa/fpa.cu:
// times the forward and the backward launch (after the δ pre-pass) alone for
// several tile shapes of both kernel families (mma.sync: "w" warps; wgmma on
// sm_90a: "wg" warpgroups) at one problem shape per head dim, and checks every
// shape's output against the first (the one fpa.cu uses) by relative L2. Random normal inputs, CUDA
// events, median of 20 runs after 3 warm-ups.
//
//   cmake --build build --target attention_tiles && build/attention_tiles
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>
#include <vector>

#include "attention/common/online_softmax.cuh"
#include "attention/fpa/flash_skeleton.cuh"
#include "attention/fpa/flash_skeleton_sm90.cuh"
#include "attention/fpa/fpa.cuh"
#include "tile_timing.cuh"

using namespace qattn::cuda;
using namespace qattn::cuda::flash;
using qattn::cuda::tiles::fill_normal;

namespace {

template <class Params>
float time_kernel(void (*kernel)(Params), dim3 grid, int threads, int smem, const Params& p) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  return tiles::median_ms([&] {
    kernel<<<grid, threads, smem>>>(p);
    CUDA_CHECK_LAUNCH();
  });
}

std::vector<float> to_float(const bf16* dev, size_t n) {
  std::vector<bf16> h(n);
  CUDA_CHECK(cudaMemcpy(h.data(), dev, n * sizeof(bf16), cudaMemcpyDeviceToHost));
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = __bfloat162float(h[i]);
  return f;
}

double rel_l2(const std::vector<float>& x, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i)
    num += double(x[i] - ref[i]) * (x[i] - ref[i]), den += double(ref[i]) * ref[i];
  return std::sqrt(num / den);
}

struct Problem {
  int B, H, T, d;
  bf16 *qkv, *o, *dout, *dqkv;
  float *lse, *delta;
  size_t n_qkv, n_o;
  double fwd_flops() const { return 2.0 * B * H * double(T) * T * d; }
};

void report(const char* kernel, const char* tiles, float ms, double flops, double err) {
  std::printf("  %-5s %-22s %8.3f ms %7.1f TFLOP/s  rel L2 vs first %.1e\n", kernel, tiles, ms,
              flops / (ms * 1e9), err);
}

// mma.sync traits name their warps; the wgmma (sm90) traits do not.
template <class Tr>
constexpr bool kMmaSync = requires {
  Tr::kWarps;
};

template <class Tr>
void sweep_forward(Problem& pb, std::vector<float>& first) {
  const ForwardParams p{pb.qkv, pb.o, pb.lse, pb.B, pb.H, pb.T, kLog2e / std::sqrt(float(pb.d))};
  const dim3 grid((pb.T + Tr::kBlockM - 1) / Tr::kBlockM, pb.H, pb.B);
  char name[64];
  float ms;
  if constexpr (kMmaSync<Tr>) {
    ms = time_kernel(flash_forward_kernel<Tr>, grid, Tr::kThreads, Tr::kSmemBytes, p);
    std::snprintf(name, sizeof name, "w%d rt%d M%d N%d", Tr::kWarps, Tr::kRowTiles, Tr::kBlockM,
                  Tr::kBlockN);
  } else {
    ms = time_kernel(sm90::flash_forward_kernel<Tr>, grid, Tr::kThreads, Tr::kSmemBytes,
                     sm90::tma_params(p, pb.d));
    std::snprintf(name, sizeof name, "wg%d M%d N%d st%d", Tr::kWarpgroups, Tr::kBlockM, Tr::kBlockN,
                  Tr::kStages);
  }
  const auto o = to_float(pb.o, pb.n_o);
  if (first.empty()) first = o;
  report("fwd", name, ms, pb.fwd_flops(), rel_l2(o, first));
}

BackwardParams backward_params(const Problem& pb) {
  const float c = 1.0f / std::sqrt(float(pb.d));
  return {pb.qkv, pb.o, pb.dout, pb.lse, pb.delta, pb.dqkv, pb.B, pb.H, pb.T, c, c * kLog2e};
}

// One backward launch (dK/dV blocks and dQ blocks); FLOPs counted as the
// 7 products it does (3.5 x forward), not the 2.5 x of the usual convention.
template <class DkDv, class Dq>
struct BackwardPair {};

template <class DkDv, class Dq>
void sweep_backward(Problem& pb, std::vector<float>& first, BackwardPair<DkDv, Dq>) {
  const int blocks =
      (pb.T + DkDv::kBlockN - 1) / DkDv::kBlockN + (pb.T + Dq::kBlockM - 1) / Dq::kBlockM;
  const dim3 grid(blocks, pb.H, pb.B);
  const int smem = std::max(DkDv::kSmemBytes, Dq::kSmemBytes);
  char name[96];
  float ms;
  if constexpr (kMmaSync<DkDv>) {
    ms = time_kernel(flash_backward_kernel<DkDv, Dq>, grid, DkDv::kThreads, smem,
                     backward_params(pb));
    std::snprintf(name, sizeof name, "w%d kv:rt%d N%d M%d q:rt%d M%d N%d", DkDv::kWarps,
                  DkDv::kRowTiles, DkDv::kBlockN, DkDv::kBlockM, Dq::kRowTiles, Dq::kBlockM,
                  Dq::kBlockN);
  } else {
    ms = time_kernel(sm90::flash_backward_kernel<DkDv, Dq>, grid, DkDv::kThreads, smem,
                     sm90::tma_params(backward_params(pb), pb.d));
    std::snprintf(name, sizeof name, "wg%d kv:N%d M%d q:M%d N%d st%d", DkDv::kWarpgroups,
                  DkDv::kBlockN, DkDv::kBlockM, Dq::kBlockM, Dq::kBlockN, DkDv::kStages);
  }
  const auto g = to_float(pb.dqkv, pb.n_qkv);
  if (first.empty()) first = g;
  report("bwd", name, ms, 3.5 * pb.fwd_flops(), rel_l2(g, first));
}

template <class... Fwd>
struct ForwardList {};
template <class... Pairs>
struct BackwardList {};

template <class... Fwd, class... Pairs>
void sweep(int B, int H, int T, int d, ForwardList<Fwd...>, BackwardList<Pairs...>) {
  Problem pb{B, H, T, d};
  pb.n_qkv = size_t(B) * T * 3 * H * d, pb.n_o = size_t(B) * T * H * d;
  CUDA_CHECK(cudaMalloc(&pb.qkv, pb.n_qkv * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&pb.dqkv, pb.n_qkv * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&pb.o, pb.n_o * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&pb.dout, pb.n_o * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&pb.lse, size_t(B) * H * T * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&pb.delta, size_t(B) * H * T * sizeof(float)));
  fill_normal<<<1024, 256>>>(pb.qkv, pb.n_qkv, 1234u);
  fill_normal<<<1024, 256>>>(pb.dout, pb.n_o, 5678u);
  CUDA_CHECK_LAUNCH();
  std::printf("B=%d H=%d T=%d d=%d\n", B, H, T, d);
  std::vector<float> first_o, first_dqkv;
  (sweep_forward<Fwd>(pb, first_o), ...);
  // The backward reads o and L of the first forward shape, and δ from the pre-pass.
  sweep_forward<typename std::tuple_element<0, std::tuple<Fwd...>>::type>(pb, first_o);
  const BackwardParams bp = backward_params(pb);
  attention_delta(bp, d, nullptr);
  (sweep_backward(pb, first_dqkv, Pairs{}), ...);
  for (void* ptr :
       {(void*)pb.qkv, (void*)pb.dqkv, (void*)pb.o, (void*)pb.dout, (void*)pb.lse, (void*)pb.delta})
    CUDA_CHECK(cudaFree(ptr));
}

}  // namespace

int main() {
  // First of each list: the mma.sync shapes fpa.cu uses (the reference for rel L2);
  // the wgmma shapes run only on sm_90a.
  const bool wgmma = fpa_wgmma_available();
  if (!wgmma) std::printf("no sm_90a device or build: the wgmma shapes are skipped\n");
  sweep(8, 12, 1024, 64, ForwardList<ForwardTraits<64, 4, 2, 64>, ForwardTraits<64, 8, 2, 64>>{},
        BackwardList<BackwardPair<DkDvTraits<64, 4, 1, 64>, DqTraits<64, 4, 2, 64>>,
                     BackwardPair<DkDvTraits<64, 8, 1, 128>, DqTraits<64, 8, 1, 64>>,
                     BackwardPair<DkDvTraits<64, 4, 1, 128>, DqTraits<64, 4, 2, 32>>,
                     BackwardPair<DkDvTraits<64, 4, 2, 32>, DqTraits<64, 4, 2, 64>>>{});
  if (wgmma)
    sweep(
        8, 12, 1024, 64,
        ForwardList<ForwardTraits<64, 4, 2, 64>, sm90::ForwardTraits<64, 2, 64>,
                    sm90::ForwardTraits<64, 2, 128>, sm90::ForwardTraits<64, 2, 64, 3>,
                    sm90::ForwardTraits<64, 2, 128, 3>>{},
        BackwardList<BackwardPair<DkDvTraits<64, 4, 1, 64>, DqTraits<64, 4, 2, 64>>,
                     BackwardPair<sm90::DkDvTraits<64, 2, 128>, sm90::DqTraits<64, 2, 128>>,
                     BackwardPair<sm90::DkDvTraits<64, 2, 64>, sm90::DqTraits<64, 2, 64>>,
                     BackwardPair<sm90::DkDvTraits<64, 2, 64, 3>, sm90::DqTraits<64, 2, 64, 3>>>{});
  sweep(4, 16, 4096, 128,
        ForwardList<ForwardTraits<128, 8, 1, 128>, ForwardTraits<128, 8, 1, 64>,
                    ForwardTraits<128, 4, 1, 128>>{},
        BackwardList<BackwardPair<DkDvTraits<128, 8, 1, 64>, DqTraits<128, 8, 1, 64>>,
                     BackwardPair<DkDvTraits<128, 4, 1, 64>, DqTraits<128, 4, 1, 64>>,
                     BackwardPair<DkDvTraits<128, 8, 1, 32>, DqTraits<128, 8, 1, 64>>>{});
  if (wgmma)
    sweep(4, 16, 4096, 128,
          ForwardList<ForwardTraits<128, 8, 1, 128>, sm90::ForwardTraits<128, 2, 128>,
                      sm90::ForwardTraits<128, 2, 64>, sm90::ForwardTraits<128, 2, 64, 3>>{},
          BackwardList<
              BackwardPair<DkDvTraits<128, 8, 1, 64>, DqTraits<128, 8, 1, 64>>,
              BackwardPair<sm90::DkDvTraits<128, 2, 64>, sm90::DqTraits<128, 2, 64>>,
              BackwardPair<sm90::DkDvTraits<128, 2, 64, 3>, sm90::DqTraits<128, 2, 64, 3>>>{});
  return 0;
}
