// Hopper's warpgroup MMA (wgmma.mma_async, sm_90a) on the skeleton's shared-
// memory tiles: bf16 x bf16 -> fp32, M = 64 rows per warpgroup (4 warps, 16
// rows each), N in {64, 128}, K = 16 per instruction.
//
// Operands. B (and A, when not in registers) is read by the tensor cores from
// shared memory through a 64-bit matrix descriptor (PTX ISA, "Matrix
// Descriptor"): start address, leading and stride byte offsets, swizzle mode.
// SmemTile (tile_mma.cuh) stores a tile as 64-column panels of 128-byte rows
// with the 128-byte swizzle, which is both of the descriptor's canonical
// 128-byte-swizzle layouts:
//   K-major  (tile rows are M or N, columns are K): a k16 step lies inside one
//            panel; 8-row groups are 1024 bytes apart (stride offset), the
//            leading offset is unused.
//   MN-major (tile rows are K, columns are N; the "transposed" B): a k16 step is
//            16 rows = two 8-row groups 1024 bytes apart (stride offset), and
//            64-column panels are kRows·128 bytes apart (leading offset).
// Every panel starts at a multiple of 1024 bytes (tiles are 64-row multiples
// from a 1024-aligned base), as the swizzle is computed from address bits.
//
// Register fragments are those of mma.m16n8k16 (tile_mma.cuh), per warp:
//   accumulator (64, N): warp w holds rows 16w .. 16w+15 as acc[1][N/8][4]
//   A from registers (64, 16): warp w holds rows 16w .. as one A fragment
// so the softmax policies and acc_to_a work on them unchanged.
//
// Ordering. wgmma_fence() before the first MMA of a group (its registers were
// written by ordinary instructions), commit after the group, wait before any
// register of the group is read; fence_operands() pins the accumulators so the
// compiler does not move their reads above the wait. The operand tiles come
// from TMA copies (tma.cuh), which like wgmma work in the async proxy.
//
// int8 (SageBwd): s8 x s8 -> s32, K = 32 per instruction, N in {64, 128}.
// For 8-bit types wgmma reads shared-memory operands K-major only, so every
// product over T (O += P̂ V̂, ...) reads the pre-pass's transposed copies (quant.cuh)
// as B. Tiles are Int8SmemTile (tma.cuh): a 64- or 128-byte row swizzled by its
// width; a k32 step is 32 bytes of every row; 8-row groups are 8·row bytes apart
// (stride offset). The register fragments per warp are those of mma.m16n8k32
// (int8_operands.cuh; PTX ISA, "Matrix Fragments for wgmma .m64nNk32"; CUTLASS's
// CuTe decodes to the same its register-source layout for 8-bit types, ALayout_64x32):
//   A (64, 32) s8, 4 regs: (row g, k 4t..4t+3), (g+8, 4t..), (g, 16+4t..), (g+8, 16+4t..)
//   accumulator (64, N) s32: as the fp32 one above,
// so int8_operands.cuh's packing of fp32 weights into A fragments over the
// permuted k (kPermuted), and the transposed copies in that order, serve both.
// The first k step of a product overwrites its accumulators (scale-d 0), so
// that no instruction sets them to zero; int8_operands.cuh converts the sums.
#pragma once
#include <cstdint>
#include <type_traits>

#include "attention/common/tile_mma.cuh"
#include "attention/common/tma.cuh"

namespace qattn::cuda::flash::sm90 {

// True where this translation unit is compiled for sm_90a (wgmma available).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QATTN_SM90A_DEVICE 1
#else
#define QATTN_SM90A_DEVICE 0
#endif

// The descriptor's layout field (bits 62-63): 1 = 128-byte swizzle, 2 = 64-byte.
__device__ __forceinline__ uint64_t smem_desc(const void* p, uint32_t leading_bytes,
                                              uint32_t stride_bytes, uint64_t swizzle = 1) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |
         static_cast<uint64_t>(leading_bytes >> 4) << 16 |
         static_cast<uint64_t>(stride_bytes >> 4) << 32 | swizzle << 62;
}
// The descriptor d moved on by `bytes` (a multiple of 16): one 32-bit add to its
// start address (bits 0-13, in 16-byte units), which cannot carry out of the
// field inside the 256 KB shared window. The products below build one
// descriptor per tile and advance it per k step, so that each step costs one
// add, not the address arithmetic of smem_desc (measured: 165 instructions to
// issue the dK/dV kernel's S and dP products, most of them descriptors).
__device__ __forceinline__ uint64_t desc_plus(uint64_t d, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(d) + (bytes >> 4);
  return (d & 0xFFFFFFFF00000000ull) | lo;
}

// Rows [row0, row0 + 64) of a tile read K-major; columns [16 ks, 16 ks + 16)
// are desc_plus(desc, k_major_step_bytes<kRows>(ks)) (64-column panels of kRows
// 128-byte rows).
template <int kRows, int kCols>
__device__ __forceinline__ uint64_t desc_k_major(SmemTile<kRows, kCols> tile, int row0) {
  return smem_desc(tile.at(row0, 0), 16, 1024);
}
template <int kRows>
__host__ __device__ constexpr uint32_t k_major_step_bytes(int ks) {
  return (ks / 4) * kRows * 128 + (ks % 4) * 32;
}
// All columns of a tile read MN-major (rows are K); rows [16 ks, 16 ks + 16) are
// desc_plus(desc, mn_major_step_bytes(ks)).
template <int kRows, int kCols>
__device__ __forceinline__ uint64_t desc_mn_major(SmemTile<kRows, kCols> tile) {
  return smem_desc(tile.data, kRows * 128, 1024);
}
__host__ __device__ constexpr uint32_t mn_major_step_bytes(int ks) { return ks * 16 * 128; }
// Rows [row0, row0 + 64) (or all rows, as B) of an int8 tile read K-major;
// bytes [32 ks, 32 ks + 32) of each row are desc_plus(desc, 32 ks).
template <int kRows, int kRowBytes>
__device__ __forceinline__ uint64_t desc_k_major(Int8SmemTile<kRows, kRowBytes> tile, int row0) {
  return smem_desc(tile.data + row0 * kRowBytes, 16, 8 * kRowBytes, kRowBytes == 128 ? 1 : 2);
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Pins registers of an in-flight group: accumulators (fp32, s32) or A fragments
// (bf16 pairs, s8 quads).
__device__ __forceinline__ void pin(float& x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void pin(uint32_t& x) { asm volatile("" : "+r"(x)::"memory"); }
__device__ __forceinline__ void pin(int& x) { asm volatile("" : "+r"(x)::"memory"); }
template <class T, int kNTiles>
__device__ __forceinline__ void fence_operands(T (&regs)[1][kNTiles][4]) {
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) pin(regs[0][nt][e]);
}

// The accumulator operand lists of the asm statements below.
#define QATTN_ACC4(a, i) "+f"(a[i][0]), "+f"(a[i][1]), "+f"(a[i][2]), "+f"(a[i][3])
#define QATTN_ACC32(a)                                                                      \
  QATTN_ACC4(a, 0), QATTN_ACC4(a, 1), QATTN_ACC4(a, 2), QATTN_ACC4(a, 3), QATTN_ACC4(a, 4), \
      QATTN_ACC4(a, 5), QATTN_ACC4(a, 6), QATTN_ACC4(a, 7)
#define QATTN_ACC64(a)                                                                      \
  QATTN_ACC32(a), QATTN_ACC4(a, 8), QATTN_ACC4(a, 9), QATTN_ACC4(a, 10), QATTN_ACC4(a, 11), \
      QATTN_ACC4(a, 12), QATTN_ACC4(a, 13), QATTN_ACC4(a, 14), QATTN_ACC4(a, 15)
#define QATTN_IACC4(a, i) "+r"(a[i][0]), "+r"(a[i][1]), "+r"(a[i][2]), "+r"(a[i][3])
#define QATTN_IACC32(a)                                                                          \
  QATTN_IACC4(a, 0), QATTN_IACC4(a, 1), QATTN_IACC4(a, 2), QATTN_IACC4(a, 3), QATTN_IACC4(a, 4), \
      QATTN_IACC4(a, 5), QATTN_IACC4(a, 6), QATTN_IACC4(a, 7)
#define QATTN_IACC64(a)                                                                          \
  QATTN_IACC32(a), QATTN_IACC4(a, 8), QATTN_IACC4(a, 9), QATTN_IACC4(a, 10), QATTN_IACC4(a, 11), \
      QATTN_IACC4(a, 12), QATTN_IACC4(a, 13), QATTN_IACC4(a, 14), QATTN_IACC4(a, 15)
#define QATTN_REGS32                                                                       \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define QATTN_REGS64                                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "     \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, " \
  "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, " \
  "%55, %56, %57, %58, %59, %60, %61, %62, %63}"

// acc (64, N) (+)= A (64, 16) Bᵀ with A and B K-major in shared memory (B is
// (N, 16): rows are output columns). accumulate = false overwrites acc.
template <int kNTiles>
__device__ __forceinline__ void mma_ss(float (&acc)[1][kNTiles][4], uint64_t a_desc,
                                       uint64_t b_desc, bool accumulate) {
  static_assert(kNTiles == 8 || kNTiles == 16, "wgmma N is 64 or 128 here");
#if QATTN_SM90A_DEVICE
  auto& a = acc[0];
  const int scale_d = accumulate ? 1 : 0;
  if constexpr (kNTiles == 8) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " QATTN_REGS32
        ", %32, %33, p, 1, 1, 0, 0;\n}\n"
        : QATTN_ACC32(a)
        : "l"(a_desc), "l"(b_desc), "r"(scale_d));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " QATTN_REGS64
        ", %64, %65, p, 1, 1, 0, 0;\n}\n"
        : QATTN_ACC64(a)
        : "l"(a_desc), "l"(b_desc), "r"(scale_d));
  }
#endif
}

// acc (64, N) += A (64, 16) B with A from registers (one A fragment per warp)
// and B (16, N) MN-major in shared memory (rows are K, N is contiguous).
template <int kNTiles>
__device__ __forceinline__ void mma_rs(float (&acc)[1][kNTiles][4], const uint32_t (&a)[4],
                                       uint64_t b_desc) {
  static_assert(kNTiles == 8 || kNTiles == 16, "wgmma N is 64 or 128 here");
#if QATTN_SM90A_DEVICE
  auto& c = acc[0];
  if constexpr (kNTiles == 8) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " QATTN_REGS32
                 ", {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
                 : QATTN_ACC32(c)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc));
  } else {
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " QATTN_REGS64
                 ", {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
                 : QATTN_ACC64(c)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc));
  }
#endif
}

// acc (64, N) (+)= A (64, 32) Bᵀ, s8 x s8 -> s32, A and B K-major int8 tiles in
// shared memory (B is (N, 32): rows are output columns). accumulate = false
// overwrites acc.
template <int kNTiles>
__device__ __forceinline__ void mma_s8_ss(int (&acc)[1][kNTiles][4], uint64_t a_desc,
                                          uint64_t b_desc, bool accumulate) {
  static_assert(kNTiles == 8 || kNTiles == 16, "wgmma N is 64 or 128 here");
#if QATTN_SM90A_DEVICE
  auto& c = acc[0];
  if constexpr (kNTiles == 8) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 " QATTN_REGS32 ", %32, %33, p;\n}\n"
        : QATTN_IACC32(c)
        : "l"(a_desc), "l"(b_desc), "r"(accumulate ? 1 : 0));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 " QATTN_REGS64 ", %64, %65, p;\n}\n"
        : QATTN_IACC64(c)
        : "l"(a_desc), "l"(b_desc), "r"(accumulate ? 1 : 0));
  }
#endif
}

// acc (64, N) (+)= A (64, 32) B, s8 x s8 -> s32, A from registers (one s8 A
// fragment per warp) and B K-major in shared memory (B's rows are output
// columns). accumulate = false overwrites acc.
template <int kNTiles>
__device__ __forceinline__ void mma_s8_rs(int (&acc)[1][kNTiles][4], const uint32_t (&a)[4],
                                          uint64_t b_desc, bool accumulate) {
  static_assert(kNTiles == 8 || kNTiles == 16, "wgmma N is 64 or 128 here");
#if QATTN_SM90A_DEVICE
  auto& c = acc[0];
  if constexpr (kNTiles == 8) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 " QATTN_REGS32
        ", {%32, %33, %34, %35}, %36, p;\n}\n"
        : QATTN_IACC32(c)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate ? 1 : 0));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 " QATTN_REGS64
        ", {%64, %65, %66, %67}, %68, p;\n}\n"
        : QATTN_IACC64(c)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate ? 1 : 0));
  }
#endif
}

// acc (64, N) += A (64, 32) B, e4m3 x e4m3 -> f32, A from registers (one
// 8-bit A fragment per warp, the s8 layout) and B K-major in shared memory (B's
// rows are output columns). The accumulators carry over from earlier products:
// fp8 sums need no conversion, so one accumulator runs over every block.
template <int kNTiles>
__device__ __forceinline__ void mma_e4m3_rs(float (&acc)[1][kNTiles][4], const uint32_t (&a)[4],
                                            uint64_t b_desc) {
  static_assert(kNTiles == 8 || kNTiles == 16, "wgmma N is 64 or 128 here");
#if QATTN_SM90A_DEVICE
  auto& c = acc[0];
  if constexpr (kNTiles == 8) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " QATTN_REGS32
                 ", {%32, %33, %34, %35}, %36, 1, 1, 1;\n"
                 : QATTN_ACC32(c)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc));
  } else {
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " QATTN_REGS64
                 ", {%64, %65, %66, %67}, %68, 1, 1, 1;\n"
                 : QATTN_ACC64(c)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc));
  }
#endif
}

// acc (64, N) (+)= A (64, 32) Bᵀ, e4m3 x e4m3 -> f32, A and B K-major 8-bit
// tiles in shared memory (B is (N, 32): rows are output columns), as mma_s8_ss.
// accumulate = false overwrites acc.
template <int kNTiles>
__device__ __forceinline__ void mma_e4m3_ss(float (&acc)[1][kNTiles][4], uint64_t a_desc,
                                            uint64_t b_desc, bool accumulate) {
  static_assert(kNTiles == 8 || kNTiles == 16, "wgmma N is 64 or 128 here");
#if QATTN_SM90A_DEVICE
  auto& c = acc[0];
  if constexpr (kNTiles == 8) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " QATTN_REGS32
        ", %32, %33, p, 1, 1;\n}\n"
        : QATTN_ACC32(c)
        : "l"(a_desc), "l"(b_desc), "r"(accumulate ? 1 : 0));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " QATTN_REGS64
        ", %64, %65, p, 1, 1;\n}\n"
        : QATTN_ACC64(c)
        : "l"(a_desc), "l"(b_desc), "r"(accumulate ? 1 : 0));
  }
#endif
}

#undef QATTN_ACC4
#undef QATTN_ACC32
#undef QATTN_ACC64
#undef QATTN_IACC4
#undef QATTN_IACC32
#undef QATTN_IACC64
#undef QATTN_REGS32
#undef QATTN_REGS64

// The products of the Hopper kernels: each is one wgmma group of the calling
// warpgroup (fence, the k16 steps, commit), acc (64, N). issue_* returns with
// the group in flight, so that independent work (the next product, element-wise
// maths on another accumulator) overlaps it; wait_for<n>(acc) then waits until
// at most n of the groups issued after acc's are in flight. product_* issue and
// wait at once.

template <int kPending, class... Acc>
__device__ __forceinline__ void wait_for(Acc&... acc) {
  wgmma_wait<kPending>();
  (fence_operands(acc), ...);
}

// acc = rows [row0, row0 + 64) of a times bᵀ, both K-major (S = Q Kᵀ, dP = dO Vᵀ
// and the transposes Sᵀ = K Qᵀ, dPᵀ = V dOᵀ).
template <int kNTiles, int kRowsA, int kRowsB, int kCols>
__device__ __forceinline__ void issue_ss(float (&acc)[1][kNTiles][4], SmemTile<kRowsA, kCols> a,
                                         int row0, SmemTile<kRowsB, kCols> b) {
  static_assert(kNTiles * 8 == kRowsB, "B's rows are the output columns");
  const uint64_t a_desc = desc_k_major(a, row0), b_desc = desc_k_major(b, 0);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kCols / 16; ++ks)
    mma_ss(acc, desc_plus(a_desc, k_major_step_bytes<kRowsA>(ks)),
           desc_plus(b_desc, k_major_step_bytes<kRowsB>(ks)), ks > 0);
  wgmma_commit();
  fence_operands(acc);
}

// acc += a b, a (64, 16 kKSteps) bf16 A fragments of the calling warpgroup (P or
// dS, from acc_to_a; they must stay untouched until the wait), b (16 kKSteps, N)
// MN-major (O += P V, dV += Pᵀ dO, dK += dSᵀ Q, dQ += dS K).
template <int kNTiles, int kKSteps, int kRows, int kCols>
__device__ __forceinline__ void issue_rs(float (&acc)[1][kNTiles][4], uint32_t (&a)[1][kKSteps][4],
                                         SmemTile<kRows, kCols> b) {
  static_assert(kNTiles * 8 == kCols && kKSteps * 16 <= kRows);
  const uint64_t b_desc = desc_mn_major(b);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks)
    mma_rs(acc, a[0][ks], desc_plus(b_desc, mn_major_step_bytes(ks)));
  wgmma_commit();
  fence_operands(acc);
}

template <int kNTiles, int kRowsA, int kRowsB, int kCols>
__device__ __forceinline__ void product_ss(float (&acc)[1][kNTiles][4], SmemTile<kRowsA, kCols> a,
                                           int row0, SmemTile<kRowsB, kCols> b) {
  issue_ss(acc, a, row0, b);
  wait_for<0>(acc);
}

// acc += w b with w (64, 16 kKSteps) fp32 weights rounded to bf16 here.
template <int kNTiles, int kWTiles, int kRows, int kCols>
__device__ __forceinline__ void product_rs(float (&acc)[1][kNTiles][4],
                                           const float (&w)[1][kWTiles][4],
                                           SmemTile<kRows, kCols> b) {
  uint32_t a[1][kWTiles / 2][4];
  acc_to_a(a, w);
  issue_rs(acc, a, b);
  wait_for<0>(acc, a);
}

// The 8-bit products, issued like issue_ss / issue_rs, into fresh
// accumulators. acc (64, N) = rows [row0, row0 + 64) of a times bᵀ over the
// tiles' row bytes (S = Q̂ K̂ᵀ, dP = dÔ V̂ᵀ and the transposes). The
// accumulator picks the instruction: s32 sums of int8 levels, or fp32 sums of
// e4m3 values (docs/attention-maths.md §4.12; one scale per tile, applied by
// the caller).
template <class Acc, int kNTiles, int kRowsA, int kRowsB, int kRowBytes>
__device__ __forceinline__ void issue_8bit_ss(Acc (&acc)[1][kNTiles][4],
                                              Int8SmemTile<kRowsA, kRowBytes> a, int row0,
                                              Int8SmemTile<kRowsB, kRowBytes> b) {
  static_assert(kNTiles * 8 == kRowsB, "B's rows are the output columns");
  static_assert(std::is_same_v<Acc, int> || std::is_same_v<Acc, float>,
                "s32 (int8) or fp32 (e4m3) accumulators");
  const uint64_t a_desc = desc_k_major(a, row0), b_desc = desc_k_major(b, 0);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kRowBytes / 32; ++ks) {
    const uint64_t a_step = desc_plus(a_desc, 32 * ks), b_step = desc_plus(b_desc, 32 * ks);
    if constexpr (std::is_same_v<Acc, int>)
      mma_s8_ss(acc, a_step, b_step, ks > 0);
    else
      mma_e4m3_ss(acc, a_step, b_step, ks > 0);
  }
  wgmma_commit();
  fence_operands(acc);
}

// acc (64, N) = a bᵀ, a (64, 32 kKSteps) s8 A fragments of the calling
// warpgroup (they must stay untouched until the wait), bt (N, 32 kKSteps) the
// transposed B (P̂ V̂ with bt = V̂ᵀ, and the other products over T).
template <int kNTiles, int kKSteps, int kRowsB, int kRowBytes>
__device__ __forceinline__ void issue_s8_rs(int (&acc)[1][kNTiles][4], uint32_t (&a)[1][kKSteps][4],
                                            Int8SmemTile<kRowsB, kRowBytes> bt) {
  static_assert(kNTiles * 8 == kRowsB && kKSteps * 32 == kRowBytes);
  const uint64_t b_desc = desc_k_major(bt, 0);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) mma_s8_rs(acc, a[0][ks], desc_plus(b_desc, 32 * ks), ks > 0);
  wgmma_commit();
  fence_operands(acc);
}

// acc (64, N) += a bᵀ over e4m3 operands, into the fp32 accumulators as they
// are: a (64, 32 kKSteps) e4m3 A fragments of the calling warpgroup (untouched
// until the wait), bt (N, 32 kKSteps) the transposed B (O += P̂ V̂ with bt = V̂ᵀ).
template <int kNTiles, int kKSteps, int kRowsB, int kRowBytes>
__device__ __forceinline__ void issue_e4m3_rs(float (&acc)[1][kNTiles][4],
                                              uint32_t (&a)[1][kKSteps][4],
                                              Int8SmemTile<kRowsB, kRowBytes> bt) {
  static_assert(kNTiles * 8 == kRowsB && kKSteps * 32 == kRowBytes);
  const uint64_t b_desc = desc_k_major(bt, 0);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) mma_e4m3_rs(acc, a[0][ks], desc_plus(b_desc, 32 * ks));
  wgmma_commit();
  fence_operands(acc);
}

}  // namespace qattn::cuda::flash::sm90
