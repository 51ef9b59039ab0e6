// FPA: the flash skeleton with bf16 operands and the exact online softmax, on
// Hopper's wgmma (flash_skeleton_sm90.cuh) where the device and the build have
// it, else on mma.sync (flash_skeleton.cuh).
//
// wgmma tile shapes, from tools/dev/attention_tiles.cu on an H200: two consumer
// warpgroups of 64 rows per block (and a producer warpgroup), two-stage rings;
//   forward   128 query rows, 128-key steps
//   backward  dK/dV 128 keys, 64-query steps; dQ 128 rows, 64-key steps
//
// mma.sync tile shapes per head dim, from tools/dev/attention_tiles.cu on an H200
// (see docs/performance.md). A warp owns 16 x row-tiles rows and keeps their fp32
// accumulators in registers, so wider heads get fewer rows per warp:
//   forward   d=64:  4 warps x 32 query rows, 64-key steps
//             d=128: 8 warps x 16 query rows, 128-key steps
//   backward  d=64:  4 warps; dK/dV 16 keys/warp, 64-query steps; dQ 32 rows/warp, 64-key steps
//             d=128: 8 warps; dK/dV 16 keys/warp, 64-query steps; dQ 16 rows/warp, 64-key steps
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "attention/common/online_softmax.cuh"
#include "attention/fpa/flash_skeleton.cuh"
#include "attention/fpa/flash_skeleton_sm90.cuh"
#include "attention/fpa/fpa.cuh"
#include "attention/phases.cuh"

namespace qattn::cuda {
namespace {

using namespace flash;

template <int D>
using FpaTiles = std::conditional_t<
    D == 64,
    KernelTiles<ForwardTraits<64, 4, 2, 64>, DkDvTraits<64, 4, 1, 64>, DqTraits<64, 4, 2, 64>>,
    KernelTiles<ForwardTraits<128, 8, 1, 128>, DkDvTraits<128, 8, 1, 64>, DqTraits<128, 8, 1, 64>>>;

template <class Tiles, class Params>
void launch_forward(const AttentionShape& s, const Params& p, void (*kernel)(Params),
                    cudaStream_t stream) {
  using Tr = typename Tiles::Forward;
  launch(kernel, dim3(ceil_div(s.T, Tr::kBlockM), s.H, s.B), Tr::kThreads, Tr::kSmemBytes, stream,
         p);
}

template <int D>
void forward(const AttentionShape& s, const bf16* qkv, bf16* o, float* lse, FpaKernels kernels,
             cudaStream_t stream) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const ForwardParams p{qkv, o, lse, s.B, s.H, s.T, scale * kLog2e};
  if (resolve_kernels(kernels, "FPA attention") == FpaKernels::wgmma) {
    using Tr = typename sm90::FpaTiles<D>::Forward;
    return launch_forward<sm90::FpaTiles<D>>(s, sm90::tma_params(p, D),
                                             sm90::flash_forward_kernel<Tr>, stream);
  }
  using Tr = typename FpaTiles<D>::Forward;
  launch_forward<FpaTiles<D>>(s, p, flash_forward_kernel<Tr>, stream);
}

template <class Tiles, class Params>
void launch_backward(const AttentionShape& s, const Params& p, void (*kernel)(Params),
                     cudaStream_t stream) {
  using DkDv = typename Tiles::DkDv;
  using Dq = typename Tiles::Dq;
  launch(kernel, dim3(ceil_div(s.T, DkDv::kBlockN) + ceil_div(s.T, Dq::kBlockM), s.H, s.B),
         DkDv::kThreads, std::max(DkDv::kSmemBytes, Dq::kSmemBytes), stream, p);
}

template <int D>
void backward(const AttentionShape& s, const bf16* qkv, const bf16* o, const bf16* dout,
              const float* lse, float* delta, bf16* dqkv, FpaKernels kernels, cudaStream_t stream,
              PhaseRecorder* phases) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const BackwardParams p{qkv, o, dout, lse, delta, dqkv, s.B, s.H, s.T, scale, scale * kLog2e};
  in_phase(phases, "delta", {attention_delta_bytes(p, D)}, stream,
           [&] { attention_delta(p, D, stream); });
  // dK/dV blocks (S, dP, dV, dK) and dQ blocks (S, dP, dQ).
  in_phase(phases, "dkdv+dq", {0, causal_product_flops(s, 7)}, stream, [&] {
    if (resolve_kernels(kernels, "FPA attention") == FpaKernels::wgmma) {
      using Tiles = sm90::FpaTiles<D>;
      return launch_backward<Tiles>(
          s, sm90::tma_params(p, D),
          sm90::flash_backward_kernel<typename Tiles::DkDv, typename Tiles::Dq>, stream);
    }
    using Tiles = FpaTiles<D>;
    launch_backward<Tiles>(s, p, flash_backward_kernel<typename Tiles::DkDv, typename Tiles::Dq>,
                           stream);
  });
}

template <int D>
void backward_dq(const AttentionShape& s, const BackwardParams& p, FpaKernels kernels,
                 cudaStream_t stream) {
  if (resolve_kernels(kernels, "FPA attention") == FpaKernels::wgmma) {
    using Dq = typename sm90::FpaTiles<D>::Dq;
    return launch(sm90::flash_backward_dq_kernel<Dq>, dim3(ceil_div(s.T, Dq::kBlockM), s.H, s.B),
                  Dq::kThreads, Dq::kSmemBytes, stream, sm90::tma_params(p, D));
  }
  using Dq = typename FpaTiles<D>::Dq;
  launch(flash_backward_dq_kernel<Dq>, dim3(ceil_div(s.T, Dq::kBlockM), s.H, s.B), Dq::kThreads,
         Dq::kSmemBytes, stream, p);
}

}  // namespace

bool fpa_wgmma_available() {
#ifdef QATTN_SM90A_BUILD  // QATTN_CUDA_ARCHS has 90a
  int device = 0, major = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major == 9;
#else
  return false;
#endif
}

FpaKernels resolve_kernels(FpaKernels requested, const char* kind) {
  if (requested != FpaKernels::automatic) {
    if (requested == FpaKernels::wgmma && !fpa_wgmma_available())
      throw std::invalid_argument(
          std::string(kind) +
          ": the wgmma kernels need a compute capability 9.x device and a build with sm_90a in "
          "QATTN_CUDA_ARCHS");
    return requested;
  }
  return fpa_wgmma_available() ? FpaKernels::wgmma : FpaKernels::mma_sync;
}

void fpa_forward(const AttentionShape& s, const bf16* qkv, bf16* o, float* lse, cudaStream_t stream,
                 FpaKernels kernels, PhaseRecorder* phases) {
  // S and PV.
  in_phase(phases, "forward", {0, causal_product_flops(s, 2)}, stream, [&] {
    if (s.d == 64) return forward<64>(s, qkv, o, lse, kernels, stream);
    forward<128>(s, qkv, o, lse, kernels, stream);
  });
}

void fpa_backward(const AttentionShape& s, const bf16* qkv, const bf16* o, const bf16* dout,
                  const float* lse, float* delta, bf16* dqkv, cudaStream_t stream,
                  FpaKernels kernels, PhaseRecorder* phases) {
  if (s.d == 64) return backward<64>(s, qkv, o, dout, lse, delta, dqkv, kernels, stream, phases);
  return backward<128>(s, qkv, o, dout, lse, delta, dqkv, kernels, stream, phases);
}

void fpa_backward_dq(const AttentionShape& s, const bf16* qkv, const bf16* dout, const float* lse,
                     float* delta, bf16* dqkv, cudaStream_t stream, FpaKernels kernels) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  // o is not read: δ is given.
  const BackwardParams p{qkv, nullptr, dout, lse,   delta,         dqkv,
                         s.B, s.H,     s.T,  scale, scale * kLog2e};
  if (s.d == 64) return backward_dq<64>(s, p, kernels, stream);
  return backward_dq<128>(s, p, kernels, stream);
}

}  // namespace qattn::cuda
