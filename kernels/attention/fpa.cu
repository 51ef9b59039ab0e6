// FPA: the flash skeleton with bf16 operands and the exact online softmax.
// Tile shapes per head dim, from tools/attention_tiles.cu on an H200 (see
// docs/performance.md). A warp owns 16 x row-tiles rows and keeps their fp32
// accumulators in registers, so wider heads get fewer rows per warp:
//   forward   d=64:  4 warps x 32 query rows, 64-key steps
//             d=128: 8 warps x 16 query rows, 128-key steps
//   backward  d=64:  4 warps x 16 keys, 64-query steps; a step's dQ: 16 rows x 64 columns per warp
//             d=128: 8 warps x 16 keys, 64-query steps; a step's dQ: 16 rows x 64 columns per warp
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
using ForwardTiles =
    std::conditional_t<D == 64, ForwardTraits<64, 4, 2, 64>, ForwardTraits<128, 8, 1, 128>>;
template <int D>
using BackwardTiles =
    std::conditional_t<D == 64, DkDvTraits<64, 4, 1, 64>, DkDvTraits<128, 8, 1, 64>>;

// Element counts of the backward's scratch, carved from the workspace in this
// order (the sums first: their 16-byte copies need the workspace's alignment
// whatever B H T is), nq = ceil(T / kBlockM):
//   dQ sums (B, H, nq, kBlockM d) fp32, δ (B, H, T) fp32, turn counters (B, H, nq) int.
template <int D>
struct WorkspaceLayout {
  size_t sums, deltas, turns;
  explicit WorkspaceLayout(const AttentionShape& s) {
    const size_t heads = static_cast<size_t>(s.B) * s.H;
    const size_t nq = ceil_div(s.T, BackwardTiles<D>::kBlockM);
    sums = heads * nq * BackwardTiles<D>::kBlockM * D;
    deltas = heads * s.T;
    turns = heads * nq;
  }
  size_t bytes() const { return (sums + deltas) * sizeof(float) + turns * sizeof(int); }
};

template <int D>
void forward(const AttentionShape& s, const bf16* qkv, bf16* o, float* lse, cudaStream_t stream) {
  using Tr = ForwardTiles<D>;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const ForwardParams p{qkv, o, lse, s.B, s.H, s.T, scale * kLog2e};
  launch(flash_forward_kernel<Tr, Bf16Operands, OnlineSoftmax<Tr::kRowTiles>>,
         dim3(ceil_div(s.T, Tr::kBlockM), s.H, s.B), Tr::kThreads, Tr::kSmemBytes, stream, p);
}

template <int D>
void backward(const AttentionShape& s, const bf16* qkv, const bf16* o, const bf16* dout,
              const float* lse, void* workspace, bf16* dqkv, cudaStream_t stream) {
  using Tr = BackwardTiles<D>;
  const WorkspaceLayout<D> layout(s);
  float* dq_sum = static_cast<float*>(workspace);
  float* delta = dq_sum + layout.sums;
  int* dq_turn = reinterpret_cast<int*>(delta + layout.deltas);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const BackwardParams p{qkv, o,   dout,  lse,           delta,  dqkv,   s.B,
                         s.H, s.T, scale, scale * kLog2e, dq_sum, dq_turn};
  // Every query block's dQ sum starts with key block 0's turn.
  CUDA_CHECK(cudaMemsetAsync(dq_turn, 0, layout.turns * sizeof(int), stream));
  constexpr int kDeltaRowsPerBlock = 8;  // one warp per row
  attention_delta_kernel<<<ceil_div(static_cast<long long>(s.B) * s.T * s.H, kDeltaRowsPerBlock),
                           32 * kDeltaRowsPerBlock, 0, stream>>>(p, D);
  CUDA_CHECK_LAUNCH();
  // One dimension, key blocks of a head in ascending order: a block waits only
  // for blocks of lower index (flash_backward_kernel).
  launch(flash_backward_kernel<Tr, Bf16Operands, OnlineSoftmax<1>>,
         dim3(ceil_div(s.T, Tr::kBlockN) * s.H * s.B), Tr::kThreads, Tr::kSmemBytes, stream, p);
}

}  // namespace

void fpa_forward(const AttentionShape& s, const bf16* qkv, bf16* o, float* lse,
                 cudaStream_t stream) {
  if (s.d == 64) return forward<64>(s, qkv, o, lse, stream);
  return forward<128>(s, qkv, o, lse, stream);
}

size_t fpa_workspace_bytes(const AttentionShape& s) {
  if (s.d == 64) return WorkspaceLayout<64>(s).bytes();
  return WorkspaceLayout<128>(s).bytes();
}

void fpa_backward(const AttentionShape& s, const bf16* qkv, const bf16* o, const bf16* dout,
                  const float* lse, void* workspace, bf16* dqkv, cudaStream_t stream) {
  if (s.d == 64) return backward<64>(s, qkv, o, dout, lse, workspace, dqkv, stream);
  return backward<128>(s, qkv, o, dout, lse, workspace, dqkv, stream);
}

}  // namespace qattn::cuda
