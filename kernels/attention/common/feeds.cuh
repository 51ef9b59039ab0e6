// How the tiles of a kernel reach shared memory, one feed per tensor-core
// family (a kernel written once over a row group, row_groups.cuh and
// kinterval.cu, takes either; the Hopper kernels of FPA and SageBwd take TmaFeed):
//   CpAsyncFeed  every thread copies with cp.async into two stages, with a
//                block-wide barrier per step (pipelined, pipeline.cuh): sm_80 and up.
//   TmaFeed      a producer warpgroup (warpgroups.cuh): one thread copies the
//                tiles with TMA, one warp the per-row values with plain loads
//                and stores, into a ring of stages guarded by mbarriers
//                (tma.cuh); the consumer warpgroups never meet inside the
//                loop: sm_90a.
// A kernel describes its copies once, as lambdas over a copy target `to`:
//   resident(to)         the tiles that stay for the whole block
//   step(i, stage, to)   step i's tiles and row values, into a stage
// with to.tile(dst, source) for a tile and to.rows(copy) for per-row values, where
// copy(thread, threads, copier) splits the rows over `threads` threads. Then:
//   Feed feed(barriers);                     // shared memory after the kernel's own
//   if (feed.producer()) { feed.produce(...); return; }   // TmaFeed's producer only
//   feed.consumer_start();
//   feed.resident(resident);                 // copied (cp.async) or waited for (TMA)
//   feed.consume(first, last, step, body);   // body(i, stage), once per step
//   (TmaFeed also: feed.consume_overlapped(first, last, step, lead, body, drain),
//   each step held into the next one's body)
//   feed.sync();                             // the consumers meet (epilogues)
#pragma once
#include "attention/common/pipeline.cuh"
#include "attention/common/tma.cuh"
#include "attention/common/warpgroups.cuh"

namespace qattn::cuda::flash {

// A (rows x d) tile of an activation: rows [row0, row0 + rows) of the matrix
// (B T, cols) at column col0, as a pointer for cp.async and as a tensor map for TMA.
struct TileSource {
  const bf16* matrix;      // (B T, cols) row-major
  const CUtensorMap* map;  // the same matrix (TmaFeed)
  int cols;                // row stride, elements
  int row0, col0;          // b T + t0; slot and head column
  int rows_valid;  // T - t0: rows past it belong to the next batch (cp.async zero-fills them)
};
// The tile at row t0 of batch b (of T rows each) and column col0 of the (B T, cols)
// activation x (its map for TMA; x may be null for the TMA feed alone).
__device__ __forceinline__ TileSource activation_tile(const bf16* x, const CUtensorMap* map,
                                                      int cols, int b, int T, int t0, int col0) {
  return {x, map, cols, b * T + t0, col0, T - t0};
}

// An int8 tile of the sage pre-pass's workspace (TmaFeed only): box origin (row0,
// col0) of a tensor map over one of its copies (sage_forward_sm90.cuh).
struct Int8TileSource {
  const CUtensorMap* map;
  int row0, col0;
};

// Per-row values: 16 or 4 bytes from global to shared memory; invalid ones read 0.
struct CpAsyncCopier {
  __device__ static void copy16(void* dst, const void* src, bool valid) {
    cp_async_16(dst, src, valid);
  }
  __device__ static void copy4(void* dst, const void* src, bool valid) {
    cp_async_4(dst, src, valid);
  }
};
struct PlainCopier {
  __device__ static void copy16(void* dst, const void* src, bool valid) {
    *static_cast<float4*>(dst) = valid ? *static_cast<const float4*>(src) : float4{0, 0, 0, 0};
  }
  __device__ static void copy4(void* dst, const void* src, bool valid) {
    *static_cast<float*>(dst) = valid ? *static_cast<const float*>(src) : 0.0f;
  }
};

// ---------------------------------------------------------------------------
template <int kThreads_>
struct CpAsyncFeed {
  static constexpr int kThreads = kThreads_, kConsumerThreads = kThreads_;
  static constexpr int kBarrierBytes = 0;
  static constexpr bool kZeroFillsBeforeRow0 = false;  // a tile may not start before row 0

  struct Target {
    template <int kRows, int kCols>
    __device__ void tile(SmemTile<kRows, kCols> dst, const TileSource& src) const {
      load_tile_async<kThreads>(dst,
                                src.matrix + static_cast<size_t>(src.row0) * src.cols + src.col0,
                                src.cols, src.rows_valid);
    }
    template <class Copy>
    __device__ void rows(Copy&& copy) const {
      copy(static_cast<int>(threadIdx.x), kThreads, CpAsyncCopier{});
    }
  };

  __device__ explicit CpAsyncFeed(unsigned char* /*barriers*/) {}
  __device__ static constexpr bool producer() { return false; }
  template <class Resident, class... Steps>
  __device__ void produce(Resident&&, Steps&&...) {}
  __device__ void consumer_start() {}
  template <class Resident>
  __device__ void resident(Resident&& resident) {
    Target to;
    resident(to);  // joins the first step's copy group
  }
  template <class Step, class Body>
  __device__ void consume(int first, int last, Step&& step, Body&& body) {
    pipelined(
        first, last,
        [&](int i, int s) {
          Target to;
          step(i, s, to);
        },
        body);
  }
  __device__ void sync() { __syncthreads(); }
};

// ---------------------------------------------------------------------------
// kRowValues: steps copy per-row values too (a second producer warp does).
// kStages_: the ring's depth; with three, a consumer warpgroup that is a step
// ahead of another finds its next step's tiles landed (the ring frees a stage
// only when every warpgroup has released it).
// Step i of the ring (counted over every consume call) uses stage i % kStages.
// Its barriers: full[s] counts the producers' arrivals (the copy issuer's, with
// the bytes of its copies, and with kRowValues the row warp's 32), empty[s] one
// arrival per consumer thread once it no longer reads the stage.
template <int kConsumerThreads_, bool kRowValues, int kStages_ = 2>
struct TmaFeed {
  static constexpr int kConsumerThreads = kConsumerThreads_;
  static constexpr int kThreads = kConsumerThreads_ + 128;  // and the producer warpgroup
  static constexpr int kStages = kStages_;
  static constexpr int kBarrierBytes = (1 + 2 * kStages) * 8;
  // TMA zero-fills a tile's rows before row 0 of its matrix (negative coordinates).
  static constexpr bool kZeroFillsBeforeRow0 = true;
  static_assert(kConsumerThreads == 256 || kConsumerThreads == 384,
                "sm90's register split is for two or three consumer warpgroups");

  struct Bytes {  // counts the tile bytes of a step, copying nothing
    uint32_t n = 0;
    template <int kRows, int kCols>
    __device__ void tile(SmemTile<kRows, kCols>, const TileSource&) {
      n += sm90::tile_bytes<kRows, kCols>();
    }
    template <int kRows, int kRowBytes>
    __device__ void tile(sm90::Int8SmemTile<kRows, kRowBytes>, const Int8TileSource&) {
      n += sm90::Int8SmemTile<kRows, kRowBytes>::kBytes;
    }
    template <class Copy>
    __device__ void rows(Copy&&) {}
  };
  struct TileIssuer {  // the tiles, by TMA
    uint64_t* full;
    template <int kRows, int kCols>
    __device__ void tile(SmemTile<kRows, kCols> dst, const TileSource& src) {
      sm90::tma_load_tile(dst, src.map, src.row0, src.col0, full);
    }
    template <int kRows, int kRowBytes>
    __device__ void tile(sm90::Int8SmemTile<kRows, kRowBytes> dst, const Int8TileSource& src) {
      sm90::tma_load_tile(dst, src.map, src.row0, src.col0, full);
    }
    template <class Copy>
    __device__ void rows(Copy&&) {}
  };
  struct RowCopier {  // the per-row values, by a warp
    template <int kRows, int kCols>
    __device__ void tile(SmemTile<kRows, kCols>, const TileSource&) {}
    template <int kRows, int kRowBytes>
    __device__ void tile(sm90::Int8SmemTile<kRows, kRowBytes>, const Int8TileSource&) {}
    template <class Copy>
    __device__ void rows(Copy&& copy) {
      copy(static_cast<int>(threadIdx.x % 32), 32, PlainCopier{});
    }
  };

  uint64_t* resident_full;
  uint64_t* full;   // kStages barriers
  uint64_t* empty;  // kStages barriers
  int step_ = 0;    // steps fed or consumed so far: the ring position across consume calls

  __device__ explicit TmaFeed(unsigned char* barriers)
      : resident_full(reinterpret_cast<uint64_t*>(barriers)), full(resident_full + 1),
        empty(resident_full + 1 + kStages) {
    if (threadIdx.x == 0) {
      sm90::barrier_init(resident_full, 1);
      for (int s = 0; s < kStages; ++s) {
        sm90::barrier_init(&full[s], kRowValues ? 1 + 32 : 1);
        sm90::barrier_init(&empty[s], kConsumerThreads);
      }
      sm90::barrier_init_fence();
    }
    __syncthreads();
  }
  __device__ bool producer() const { return static_cast<int>(threadIdx.x) >= kConsumerThreads; }

  // The producer warpgroup's whole work: the resident tiles, then each run of
  // steps (first, last, step) in the order the consumers consume them.
  template <class Resident, class... Runs>
  __device__ void produce(Resident&& resident, Runs&&... runs) {
    sm90::producer_registers();
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    if (warp == 0 && lane == 0) {
      Bytes bytes;
      resident(bytes);
      sm90::barrier_arrive_expect_bytes(resident_full, bytes.n);
      TileIssuer issuer{resident_full};
      resident(issuer);
    }
    (produce_run(warp, lane, runs), ...);
  }
  template <class Run>
  __device__ void produce_run(int warp, int lane, Run& run) {
    for (int i = run.first; i < run.last; ++i, ++step_) {
      const int s = stage(step_);
      if (warp == 0 && lane == 0) {
        Bytes bytes;
        run.step(i, s, bytes);
        wait_empty(step_);
        sm90::barrier_arrive_expect_bytes(&full[s], bytes.n);
        TileIssuer issuer{&full[s]};
        run.step(i, s, issuer);
      } else if (kRowValues && warp == 1) {
        wait_empty(step_);
        RowCopier copier;
        run.step(i, s, copier);
        sm90::barrier_arrive(&full[s]);  // the warp's stores into the stage are done
      }
    }
  }

  __device__ void consumer_start() { sm90::consumer_registers<kConsumerThreads / 128>(); }
  // The producer copies them; the consumers wait until they have landed.
  template <class Resident>
  __device__ void resident(Resident&&) {
    sm90::barrier_wait(resident_full, 0);
  }
  template <class Step, class Body>
  __device__ void consume(int first, int last, Step&&, Body&& body) {
    for (int i = first; i < last; ++i, ++step_) {
      sm90::barrier_wait(&full[stage(step_)], parity(step_));
      body(i, stage(step_));
      sm90::barrier_arrive(&empty[stage(step_)]);
    }
  }
  // Steps [first, last) for a consumer that leaves each step's last product
  // in flight into the next step (FlashAttention-3's overlap within a
  // warpgroup): lead(first, stage) runs once the first step has landed;
  // body(i, stage, previous) for each later step once it has landed, with
  // step i − 1 still held in stage `previous`, which is released after the
  // body; drain(stage) ends the last step, which is released after it. A
  // consumer holds two stages at once, so a ring of kStages keeps kStages − 2
  // steps' copies ahead of it. The first step has a body of its own so that
  // no branch joins code with a product in flight and code without.
  template <class Step, class Lead, class Body, class Drain>
  __device__ void consume_overlapped(int first, int last, Step&&, Lead&& lead, Body&& body,
                                     Drain&& drain) {
    if (first >= last) return;
    sm90::barrier_wait(&full[stage(step_)], parity(step_));
    lead(first, stage(step_));
    ++step_;
    for (int i = first + 1; i < last; ++i, ++step_) {
      sm90::barrier_wait(&full[stage(step_)], parity(step_));
      body(i, stage(step_), stage(step_ - 1));
      sm90::barrier_arrive(&empty[stage(step_ - 1)]);
    }
    drain(stage(step_ - 1));
    sm90::barrier_arrive(&empty[stage(step_ - 1)]);
  }
  __device__ void sync() { sm90::consumers_sync<kConsumerThreads / 128>(); }

 private:
  __device__ static int stage(int step) { return step % kStages; }
  __device__ static uint32_t parity(int step) { return (step / kStages) & 1; }
  // The producer, before filling a step's stage: until step - kStages released it.
  __device__ void wait_empty(int step) const {
    if (step >= kStages) sm90::barrier_wait(&empty[stage(step)], parity(step) ^ 1);
  }
};

// One run of steps for TmaFeed::produce: steps [first, last), copied by step.
template <class Step>
struct StepRun {
  int first, last;
  Step& step;
};
template <class Step>
__device__ StepRun<Step> steps(int first, int last, Step& step) {
  return {first, last, step};
}

}  // namespace qattn::cuda::flash
