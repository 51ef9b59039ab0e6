// Turn counters: blocks of one launch that add into the same fp32 sum in global
// memory take turns in a fixed order, so the sum is the same bit for bit on every
// run (the deterministic dQ of the flash backward). A counter is an int in global
// memory holding the number of the block whose turn it is; it starts at 0
// (set before the launch) and each block passes the turn to the next.
//
// Memory order (PTX memory model): the holder's writes to the sum, a block
// barrier, then one thread's release store of the next turn; the next holder's
// acquire load that sees it, a block barrier, then its reads. Reads and writes
// of the sum go to L2 (cp.async.cg, st.cg), past the SM's non-coherent L1.
//
// Forward progress is the caller's to ensure: a block may only wait for blocks
// with a lower linear index, which the hardware has dispatched before it (see
// flash_backward_kernel).
#pragma once
#include <cuda_runtime.h>

namespace qattn::cuda::flash {

__device__ __forceinline__ int load_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release_gpu(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// One look, by one thread: is it `turn`'s turn? (A block barrier must follow
// before the other threads read what the previous holder wrote.)
__device__ __forceinline__ bool is_turn(const int* counter, int turn) {
  return load_acquire_gpu(counter) == turn;
}

// Returns, for every thread of the block, once *counter == turn. One thread
// polls (backing off to at most 256 ns between reads); the barrier then orders
// the whole block's later reads after the previous holder's writes.
__device__ __forceinline__ void wait_for_turn(const int* counter, int turn) {
  if (threadIdx.x == 0) {
    unsigned backoff_ns = 16;
    while (!is_turn(counter, turn)) {
      __nanosleep(backoff_ns);
      backoff_ns = min(2 * backoff_ns, 256u);
    }
  }
  __syncthreads();
}

// Hands the turn to `next`. One thread calls it after a block barrier that
// follows every thread's writes to the sum: the release store orders them all
// (cumulatively, through the barrier) before the next holder's acquire.
__device__ __forceinline__ void pass_turn(int* counter, int next) {
  store_release_gpu(counter, next);
}

}  // namespace qattn::cuda::flash
