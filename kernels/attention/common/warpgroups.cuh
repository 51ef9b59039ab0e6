// The roles of a warp-specialised Hopper block (sm_90a), shared by every
// wgmma kernel: consumer warpgroups of 64 rows each, which compute, and one
// producer warpgroup, which copies (TmaFeed, feeds.cuh). What the roles need to
// know of each other: the block's threads, the register split between them, the
// rows a warpgroup owns, and the barrier at which the consumers alone meet.
#pragma once
#include <cuda_runtime.h>

namespace qattn::cuda::flash::sm90 {

constexpr int kWarpgroupRows = 64;

// Threads of a block: two or three consumer warpgroups (warps 0 .. 4 kWarpgroups - 1),
// then a producer warpgroup, of which one thread issues the copies. The producer
// gives its registers to the consumers (setmaxnreg): 2 x 128 x 240 + 128 x 24 and
// 3 x 128 x 160 + 128 x 24 fit the SM's 64 K. Three warpgroups give each warp
// scheduler a third warp to switch to where the element-wise work per score is
// long (K-interval's forward at d = 64), at 160 registers a thread.
template <int kWarpgroups>
constexpr int block_threads() {
  static_assert(kWarpgroups == 2 || kWarpgroups == 3,
                "the register split below is for two or three consumer warpgroups");
  return 128 * (kWarpgroups + 1);
}
template <int kWarpgroups>
__host__ __device__ constexpr int consumer_register_count() {
  return kWarpgroups == 2 ? 240 : 160;
}
constexpr int kProducerRegisters = 24;
static_assert(2 * 128 * consumer_register_count<2>() + 128 * kProducerRegisters <= 65536 &&
              3 * 128 * consumer_register_count<3>() + 128 * kProducerRegisters <= 65536);

// First row of the calling warpgroup within the block, and of its warp.
// Read through a shuffle from lane 0 so that the compiler knows the value is
// the same on every lane (threadIdx.x / 128 is, but it cannot prove it): the
// descriptors built from it then live in uniform registers, as wgmma takes them.
__device__ __forceinline__ int warpgroup_row0() {
  return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0) * kWarpgroupRows;
}
__device__ __forceinline__ int warp_row0() { return (threadIdx.x / 32) * 16; }

// Register reallocation between the roles, at the top of each role's branch.
__device__ __forceinline__ void producer_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
}
template <int kWarpgroups>
__device__ __forceinline__ void consumer_registers() {
  constexpr int kRegisters = consumer_register_count<kWarpgroups>();
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// The consumer warpgroups meet (not the producer), e.g. before staging a
// result tile that all of them then store.
template <int kWarpgroups>
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(128 * kWarpgroups) : "memory");
}

}  // namespace qattn::cuda::flash::sm90
