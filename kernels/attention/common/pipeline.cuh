// What the main loops and launchers of every attention kind share (FPA and
// K-interval through flash_skeleton.cuh, SageBwd in sage.cu): the two-stage
// cp.async pipeline over a kernel's steps, the order of a grid's blocks over the
// heads (block_by_rank), and the launch of a kernel whose dynamic shared memory
// may exceed the default 48 KB.
#pragma once
#include <cuda_runtime.h>

#include "attention/common/tile_mma.cuh"

namespace qattn::cuda::flash {

// Steps [first, last) with two shared-memory stages: step i + 1 loads
// (load(i + 1, stage)) while step i computes (body(i, stage)); step i uses
// stage (i - first) % 2. Loads issued before the call join the first step's
// group. A body that returns early still meets both barriers.
template <class Load, class Body>
__device__ __forceinline__ void pipelined(int first, int last, Load&& load, Body&& body) {
  load(first, 0);
  cp_async_commit();
  for (int i = first; i < last; ++i) {
    const int s = (i - first) % 2;
    if (i + 1 < last) {
      load(i + 1, 1 - s);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    body(i, s);
    __syncthreads();  // the stage just read is refilled by the next load
  }
}

// A block's place in a grid (blocks per head, H, B): which of its head's blocks
// it is, and the head. Sage's grids are (tiles, B·H): there h is the flattened
// head b·H + h and b is 0 (its kernels say so where they read it).
struct BlockIndex {
  int block, h, b;
};
// Ranked over all heads in the order the hardware starts blocks (x, then y, then
// z: what the block scheduler does, not a CUDA guarantee, and only a matter of
// speed): first every head's block 0, then every head's block 1, and so on. A
// kernel whose block 0 is its longest (causal) then ends on every head's shortest
// blocks, and its last wave is short.
__device__ __forceinline__ BlockIndex block_by_rank() {
  const unsigned heads = gridDim.y * gridDim.z;
  const unsigned linear = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned bh = linear % heads;
  return {static_cast<int>(linear / heads), static_cast<int>(bh % gridDim.y),
          static_cast<int>(bh / gridDim.y)};
}

// Query blocks (whose causal loop grows with the block) by rank, the last first.
__device__ __forceinline__ BlockIndex last_first(BlockIndex at) {
  return {static_cast<int>(gridDim.x) - 1 - at.block, at.h, at.b};
}

// Raises the kernel's dynamic shared-memory limit (above 48 KB needs it) and launches it.
template <class... Params>
void launch(void (*kernel)(Params...), dim3 grid, int threads, int smem_bytes, cudaStream_t stream,
            const Params&... params) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  kernel<<<grid, threads, smem_bytes, stream>>>(params...);
  CUDA_CHECK_LAUNCH();
}

}  // namespace qattn::cuda::flash
