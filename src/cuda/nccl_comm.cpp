// DeviceComm over NCCL. The communicator is non-blocking (ncclConfig_t
// blocking = 0): no NCCL call can hold the host forever, so every call is
// followed by settle(), which polls ncclCommGetAsyncError until the call is
// done, fails, or the deadline passes; wait() watches a CUDA event the same
// way. Either failure aborts the communicator (in-flight NCCL kernels end)
// and throws DistError naming this rank.
// NVLink multicast (NVLS) follows the machine's NCCL_NVLS_ENABLE; nothing here
// sets NCCL variables.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "common.cuh"
#include "device_comm.hpp"

#ifdef QATTN_HAVE_NCCL
#include <nccl.h>
#include <spdlog/spdlog.h>
#endif

namespace qattn::cuda {

#ifdef QATTN_HAVE_NCCL

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kMaxHostValues = 16;  // sum_on_host: doubles per call

class NcclComm final : public DeviceComm {
 public:
  NcclComm(const DistEnv& env, double timeout_s)
      : rank_(env.rank), world_(env.world), timeout_s_(timeout_s) {
    // The local rank indexes the visible GPUs; a process that sees exactly one
    // GPU (a launcher bound one to each task) uses it whatever its local rank.
    int devices = 0;
    CUDA_CHECK(cudaGetDeviceCount(&devices));
    if (env.local_rank >= devices && devices != 1)
      throw DistError(who() + ": local rank " + std::to_string(env.local_rank) + " but this process sees " +
                      std::to_string(devices) + " GPU(s); allowed: one rank per visible GPU, local rank < " +
                      std::to_string(devices));
    CUDA_CHECK(cudaSetDevice(devices == 1 ? 0 : env.local_rank));
    ncclUniqueId id{};
    if (rank_ == 0) settle(ncclGetUniqueId(&id), "ncclGetUniqueId");
    const std::string got = rendezvous(env, std::string(id.internal, sizeof(id.internal)), timeout_s);
    if (got.size() != sizeof(id.internal))
      throw DistError(who() + ": the rendezvous delivered " + std::to_string(got.size()) +
                      " bytes, an NCCL unique id has " + std::to_string(sizeof(id.internal)));
    std::memcpy(id.internal, got.data(), got.size());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    settle(ncclCommInitRankConfig(&comm_, world_, id, rank_, &config), "creating the NCCL communicator");
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    CUDA_CHECK(cudaMalloc(&dev_values_, kMaxHostValues * sizeof(double)));
    CUDA_CHECK(cudaMallocHost(&host_values_, kMaxHostValues * sizeof(double)));
  }

  ~NcclComm() override {
    if (comm_) {
      // Finalize flushes outstanding work; a peer that is gone makes it hang,
      // so it gets the same deadline and an abort after it.
      try {
        settle(ncclCommFinalize(comm_), "finalizing the NCCL communicator");
        ncclCommDestroy(comm_);
      } catch (const std::exception& e) {
        spdlog::warn("{}", e.what());
      }
    }
    cudaFreeHost(host_values_);
    cudaFree(dev_values_);
    cudaEventDestroy(done_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  cudaStream_t stream() const override { return stream_; }

  void all_reduce_mean(float* buf, size_t n) override {
    settle(ncclAllReduce(buf, buf, n, ncclFloat32, ncclAvg, comm_, stream_), "all-reduce of gradients");
  }
  void reduce_scatter_mean(float* block, size_t shard) override {
    settle(ncclReduceScatter(block, block + rank_ * shard, shard, ncclFloat32, ncclAvg, comm_, stream_),
           "reduce-scatter of gradients");
  }
  void all_gather(void* block, size_t shard_bytes) override {
    auto* b = static_cast<char*>(block);
    settle(ncclAllGather(b + rank_ * shard_bytes, b, shard_bytes, ncclUint8, comm_, stream_), "all-gather");
  }
  void sum_on_host(double* values, int n) override {
    if (n > kMaxHostValues)
      throw std::logic_error("sum_on_host: " + std::to_string(n) + " values, at most " +
                             std::to_string(kMaxHostValues));
    std::copy(values, values + n, host_values_);  // pinned: the copies below never block the host
    CUDA_CHECK(cudaMemcpyAsync(dev_values_, host_values_, n * sizeof(double), cudaMemcpyHostToDevice, stream_));
    settle(ncclAllReduce(dev_values_, dev_values_, n, ncclFloat64, ncclSum, comm_, stream_),
           "all-reduce of host values");
    CUDA_CHECK(cudaMemcpyAsync(host_values_, dev_values_, n * sizeof(double), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaEventRecord(done_, stream_));
    wait(done_, "the all-reduce of the step's loss and flags");
    std::copy(host_values_, host_values_ + n, values);
  }

  void wait(cudaEvent_t event, const char* what) override {
    const auto deadline = Clock::now() + timeout();
    for (;;) {
      const cudaError_t e = cudaEventQuery(event);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) CUDA_CHECK(e);
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress)
        fail(std::string("waiting for ") + what + ": NCCL error: " + ncclGetErrorString(async) + " (" +
             ncclGetLastError(comm_) + ")");
      if (Clock::now() > deadline)
        fail(std::string("waiting for ") + what + ": not done after " + seconds() +
             " s; a peer rank died or hangs (QATTN_DIST_TIMEOUT_S sets the limit)");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  std::string who() const { return "rank " + std::to_string(rank_) + " of " + std::to_string(world_); }
  std::string seconds() const { return std::to_string(static_cast<long>(timeout_s_)); }
  Clock::duration timeout() const {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
  }

  // Waits out ncclInProgress (non-blocking communicator) within the deadline.
  void settle(ncclResult_t r, const char* what) {
    const auto deadline = Clock::now() + timeout();
    while (r == ncclInProgress) {
      if (Clock::now() > deadline)
        fail(std::string(what) + ": not done after " + seconds() +
             " s; a peer rank died or hangs (QATTN_DIST_TIMEOUT_S sets the limit)");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      ncclCommGetAsyncError(comm_, &r);
    }
    if (r != ncclSuccess)
      fail(std::string(what) + ": NCCL error: " + ncclGetErrorString(r) + " (" + ncclGetLastError(comm_) + ")");
  }

  [[noreturn]] void fail(const std::string& msg) {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    throw DistError(who() + ": " + msg);
  }

  int rank_, world_;
  double timeout_s_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  double* dev_values_ = nullptr;   // (kMaxHostValues) device
  double* host_values_ = nullptr;  // (kMaxHostValues) pinned host
};

}  // namespace

std::unique_ptr<DeviceComm> make_nccl_comm(const DistEnv& env, double timeout_s) {
  return std::make_unique<NcclComm>(env, timeout_s);
}

#else

std::unique_ptr<DeviceComm> make_nccl_comm(const DistEnv& env, double) {
  throw DistError("rank " + std::to_string(env.rank) +
                  ": this qattn was built without NCCL, so it trains on one GPU only; "
                  "install NCCL (nccl.h, libnccl) and reconfigure for several GPUs");
}

#endif

}  // namespace qattn::cuda
