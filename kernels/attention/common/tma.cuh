// Hopper's tensor memory accelerator (TMA, sm_90a) and shared-memory
// barriers (mbarrier): how the wgmma kernels (flash_skeleton_sm90.cuh) stream
// tiles. One thread of a producer warp issues a tile copy; the copy engine
// writes it in the 128-byte-swizzled panel layout of SmemTile (tile_mma.cuh)
// and counts its bytes on the stage's "full" barrier; consumer warpgroups wait
// on that barrier, compute, and arrive on the stage's "empty" barrier, which the
// producer waits on before refilling the stage. No block-wide barrier sits in
// the main loop, so the consumer warpgroups run out of step with each other.
//
// Tensor maps describe the activations as 2-D bf16 matrices (rows B·T, row
// stride in elements) with 64 x 64 boxes, one 8 KB panel piece per copy. Rows
// past a batch's T read the next batch's rows (finite; masked or multiplied by
// zero weights like the zero rows of the cp.async kernels), rows past the
// tensor read as zeros.
//
// SageBwd's int8 operands (sage_sm90.cuh) come from the pre-pass's workspace
// copies (quant.cuh) as Int8SmemTile: rows of 64 or 128 bytes (the K extent of
// the products reading them), swizzled by TMA with the 64- or 128-byte pattern
// of that width. A 128-byte int8 row is byte for byte a 64-column bf16 panel row.
#pragma once
#include <cuda.h>  // CUtensorMap and its enums (the encoder is fetched at run time)
#include <cudaTypedefs.h>

#include <cstdint>

#include "attention/common/tile_mma.cuh"

namespace qattn::cuda::flash::sm90 {

constexpr int kBoxRows = 64, kBoxCols = 64;  // one TMA copy: 64 rows of one 64-column panel
constexpr int kBoxBytes = kBoxRows * kBoxCols * 2;

// A (rows, cols) row-major bf16 matrix in global memory (row stride ld elements,
// a multiple of 8) as a tensor map with 64 x 64 boxes and the 128-byte swizzle.
// A 2-D row-major matrix of `type` (row stride ld_bytes) as a tensor map with
// (box_rows, box_cols) boxes and the given swizzle.
inline CUtensorMap encode_tensor_map(CUtensorMapDataType type, const void* base, uint64_t rows,
                                     uint64_t cols, uint64_t ld_bytes, uint32_t box_rows,
                                     uint32_t box_cols, CUtensorMapSwizzle swizzle) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || fn == nullptr)
      throw std::runtime_error("CUDA attention: the driver has no cuTensorMapEncodeTiled (TMA)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  CUtensorMap map;
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {ld_bytes};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode(&map, type, 2, const_cast<void*>(base), dims, strides, box,
                            element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("CUDA attention: cuTensorMapEncodeTiled failed with error " +
                             std::to_string(static_cast<int>(r)));
  return map;
}

inline CUtensorMap make_tensor_map(const bf16* base, uint64_t rows, uint64_t cols, uint64_t ld) {
  return encode_tensor_map(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, base, rows, cols, ld * sizeof(bf16),
                           kBoxRows, kBoxCols, CU_TENSOR_MAP_SWIZZLE_128B);
}

// ---------------------------------------------------------------------------
// int8 tiles. kRows rows of kRowBytes = 64 or 128 int8, row-major and packed,
// the 16-byte chunks of each row permuted by the swizzle of that width (TMA's
// SWIZZLE_64B / SWIZZLE_128B: chunk bits [4, 6) or [4, 7) of the address XOR
// bits [7, 9) or [7, 10)). The pattern repeats every 8 rows (512 or 1024 bytes),
// so a tile starts at a multiple of 1024 bytes. wgmma reads such a tile K-major
// (wgmma.cuh): rows are M or N, the kRowBytes bytes are K.
template <int kRows_, int kRowBytes_>
struct Int8SmemTile {
  static constexpr int kRows = kRows_, kRowBytes = kRowBytes_;
  static_assert(kRowBytes == 64 || kRowBytes == 128,
                "int8 rows are one 64- or 128-byte swizzle row");
  static_assert(kRows % kBoxRows == 0, "tiles are copied in 64-row boxes");
  static constexpr int kBytes = kRows * kRowBytes;
  int8_t* data;
};

// A (rows, cols) row-major int8 matrix (row stride ld bytes, a multiple of 16)
// as a tensor map with (64, box_cols) boxes swizzled by their width (64 or 128 bytes).
inline CUtensorMap make_int8_tensor_map(const int8_t* base, uint64_t rows, uint64_t cols,
                                        uint64_t ld, uint32_t box_cols) {
  return encode_tensor_map(
      CU_TENSOR_MAP_DATA_TYPE_UINT8, base, rows, cols, ld, kBoxRows, box_cols,
      box_cols == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---------------------------------------------------------------------------
// mbarrier: a 64-bit shared-memory barrier with an arrival count and a
// transaction (byte) count; each completion flips its phase parity.
__device__ __forceinline__ void barrier_init(uint64_t* bar, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals));
}
// After every init, before any other thread or the copy engine uses the barriers.
__device__ __forceinline__ void barrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void barrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// The producer's arrival that also announces the bytes its copies will deliver.
__device__ __forceinline__ void barrier_arrive_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
// Waits until the phase with this parity (0, 1, 0, ... for the 1st, 2nd, 3rd use)
// completed. The suspend-time hint (10 ms, an upper bound: the thread wakes when
// the phase completes) lets a waiting warp sleep rather than retry: without it
// the producer warps' retries were 11% of the instructions of a sage dK/dV
// launch (about 4 million; tools/dev/profile_source.sh sage_dkdv_sm90).
__device__ __forceinline__ void barrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1, %2;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity), "r"(10000000u)
      : "memory");
}

// ---------------------------------------------------------------------------
// Rows [row0, row0 + kRows) x columns [col0, col0 + kCols) of a tensor map into
// a tile (kRows / 64 x kCols / 64 box copies), counted on bar.
template <int kRows, int kCols>
__device__ __forceinline__ void tma_load_tile(SmemTile<kRows, kCols> tile, const CUtensorMap* map,
                                              int row0, int col0, uint64_t* bar) {
  static_assert(kRows % kBoxRows == 0 && kCols % kBoxCols == 0);
#pragma unroll
  for (int panel = 0; panel < kCols / kBoxCols; ++panel)
#pragma unroll
    for (int r = 0; r < kRows / kBoxRows; ++r)
      asm volatile(
          "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
          "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(smem_addr(tile.at(r * kBoxRows, panel * kBoxCols))),
          "l"(reinterpret_cast<uint64_t>(map)), "r"(col0 + panel * kBoxCols),
          "r"(row0 + r * kBoxRows), "r"(smem_addr(bar))
          : "memory");
}

template <int kRows, int kCols>
__host__ __device__ constexpr uint32_t tile_bytes() {
  return kRows * kCols * 2;
}

// Rows [row0, row0 + kRows) x bytes [col0, col0 + kRowBytes) of an int8 tensor
// map (boxes of 64 rows x kRowBytes) into a tile, counted on bar.
template <int kRows, int kRowBytes>
__device__ __forceinline__ void tma_load_tile(Int8SmemTile<kRows, kRowBytes> tile,
                                              const CUtensorMap* map, int row0, int col0,
                                              uint64_t* bar) {
#pragma unroll
  for (int r = 0; r < kRows / kBoxRows; ++r)
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
        "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(smem_addr(tile.data + r * kBoxRows * kRowBytes)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(col0), "r"(row0 + r * kBoxRows),
        "r"(smem_addr(bar))
        : "memory");
}

}  // namespace qattn::cuda::flash::sm90
