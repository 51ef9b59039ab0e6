// FPA: the flash skeleton with bf16 operands and the exact online softmax.
// Tile shapes per head dim, from tools/attention_tiles.cu on an H200 (see
// docs/performance.md). A warp owns 16 x row-tiles rows and keeps their fp32
// accumulators in registers, so wider heads get fewer rows per warp:
//   forward   d=64:  4 warps x 32 query rows, 64-key steps
//             d=128: 8 warps x 16 query rows, 128-key steps
//   backward  d=64:  4 warps; dK/dV 16 keys/warp, 64-query steps; dQ 32 rows/warp, 64-key steps
//             d=128: 8 warps; dK/dV 16 keys/warp, 64-query steps; dQ 16 rows/warp, 64-key steps
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "attention/bf16_operands.cuh"
#include "attention/flash_skeleton.cuh"
#include "attention/fpa.cuh"
#include "attention/online_softmax.cuh"

namespace qattn::cuda {
namespace {

using namespace flash;

template <int D>
using FpaTiles = std::conditional_t<
    D == 64,
    KernelTiles<ForwardTraits<64, 4, 2, 64>, DkDvTraits<64, 4, 1, 64>, DqTraits<64, 4, 2, 64>>,
    KernelTiles<ForwardTraits<128, 8, 1, 128>, DkDvTraits<128, 8, 1, 64>, DqTraits<128, 8, 1, 64>>>;

template <int D>
void forward(const AttentionShape& s, const bf16* qkv, bf16* o, float* lse, cudaStream_t stream) {
  using Tr = typename FpaTiles<D>::Forward;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const ForwardParams p{qkv, o, lse, s.B, s.H, s.T, scale * kLog2e};
  launch(flash_forward_kernel<Tr, Bf16Operands, OnlineSoftmax<Tr::kRowTiles>>,
         dim3(ceil_div(s.T, Tr::kBlockM), s.H, s.B), Tr::kThreads, Tr::kSmemBytes, stream, p);
}

template <int D>
void backward(const AttentionShape& s, const bf16* qkv, const bf16* o, const bf16* dout,
              const float* lse, float* delta, bf16* dqkv, cudaStream_t stream) {
  using DkDv = typename FpaTiles<D>::DkDv;
  using Dq = typename FpaTiles<D>::Dq;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const BackwardParams p{qkv, o, dout, lse, delta, dqkv, s.B, s.H, s.T, scale, scale * kLog2e};
  constexpr int kDeltaRowsPerBlock = 8;  // one warp per row
  attention_delta_kernel<<<ceil_div(static_cast<long long>(s.B) * s.T * s.H, kDeltaRowsPerBlock),
                           32 * kDeltaRowsPerBlock, 0, stream>>>(p, D);
  CUDA_CHECK_LAUNCH();
  launch(flash_backward_kernel<DkDv, Dq, Bf16Operands, OnlineSoftmax<1>>,
         dim3(ceil_div(s.T, DkDv::kBlockN) + ceil_div(s.T, Dq::kBlockM), s.H, s.B), DkDv::kThreads,
         std::max(DkDv::kSmemBytes, Dq::kSmemBytes), stream, p);
}

}  // namespace

void fpa_forward(const AttentionShape& s, const bf16* qkv, bf16* o, float* lse,
                 cudaStream_t stream) {
  if (s.d == 64) return forward<64>(s, qkv, o, lse, stream);
  return forward<128>(s, qkv, o, lse, stream);
}

void fpa_backward(const AttentionShape& s, const bf16* qkv, const bf16* o, const bf16* dout,
                  const float* lse, float* delta, bf16* dqkv, cudaStream_t stream) {
  if (s.d == 64) return backward<64>(s, qkv, o, dout, lse, delta, dqkv, stream);
  return backward<128>(s, qkv, o, dout, lse, delta, dqkv, stream);
}

}  // namespace qattn::cuda
