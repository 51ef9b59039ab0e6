// What the main loops and launchers of every attention kind share (FPA and
// K-interval through flash_skeleton.cuh, SageBwd in sage.cu): the two-stage
// cp.async pipeline over a kernel's steps, and the launch of a kernel whose
// dynamic shared memory may exceed the default 48 KB.
#pragma once
#include <cuda_runtime.h>

#include "tile_mma.cuh"

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

// Raises the kernel's dynamic shared-memory limit (above 48 KB needs it) and launches it.
template <class... Params>
void launch(void (*kernel)(Params...), dim3 grid, int threads, int smem_bytes, cudaStream_t stream,
            const Params&... params) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  kernel<<<grid, threads, smem_bytes, stream>>>(params...);
  CUDA_CHECK_LAUNCH();
}

}  // namespace qattn::cuda::flash
