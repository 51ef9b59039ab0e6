// Shared by every CUDA file: error checks, bf16 <-> fp32 helpers, 16-byte
// packed vectors, an L1 prefetch and warp/block reductions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace qattn::cuda {

using bf16 = __nv_bfloat16;

// Throws std::runtime_error naming the call site and CUDA's message.
inline void cuda_check(cudaError_t err, const char* what, const char* file, int line) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA error at ") + file + ":" + std::to_string(line) +
                             " (" + what + "): " + cudaGetErrorString(err));
  }
}
#define CUDA_CHECK(call) ::qattn::cuda::cuda_check((call), #call, __FILE__, __LINE__)
// After every <<<...>>>: a bad configuration shows up here, not at a later sync.
#define CUDA_CHECK_LAUNCH() ::qattn::cuda::cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

inline int ceil_div(long long a, long long b) { return static_cast<int>((a + b - 1) / b); }

// Device helpers below; host files (tests, launcher users) see only the above.
#ifdef __CUDACC__

// Eight bf16 in one 16-byte load/store: the unit of every elementwise kernel.
struct alignas(16) Bf16x8 {
  bf16 v[8];
};
__device__ __forceinline__ Bf16x8 load8(const bf16* p) { return *reinterpret_cast<const Bf16x8*>(p); }
__device__ __forceinline__ void store8(bf16* p, const Bf16x8& x) { *reinterpret_cast<Bf16x8*>(p) = x; }
__device__ __forceinline__ void load8_f32(const bf16* p, float (&out)[8]) {
  Bf16x8 x = load8(p);
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = __bfloat162float(x.v[i]);
}
__device__ __forceinline__ void store8_f32(bf16* p, const float (&in)[8]) {
  Bf16x8 x;
#pragma unroll
  for (int i = 0; i < 8; ++i) x.v[i] = __float2bfloat16(in[i]);
  store8(p, x);
}

// Brings `bytes` of global memory from `at` into L1 for a later read, one
// 128-byte line per lane of the calling warp (at most 32 lines). The sage
// kernels prefetch smooth_q's bias rows and means a step ahead: their L2
// latency, waited on by the FFMA that adds them, was the largest stall of
// those kernels with smooth_q (tools/dev/profile_source.sh sage_dq_sm90 --kind sage
// --set attention.sage.smooth_q=true).
__device__ __forceinline__ void prefetch_l1(const void* at, int bytes) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(at) & ~uintptr_t{127};
  const uintptr_t line = first + 128 * (threadIdx.x % 32);
  if (line < reinterpret_cast<uintptr_t>(at) + bytes) asm volatile("prefetch.global.L1 [%0];" : : "l"(line));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread
// gets the result. `scratch` holds 32 floats of shared memory. Fixed order:
// deterministic for a fixed launch shape.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}

#endif  // __CUDACC__

}  // namespace qattn::cuda
