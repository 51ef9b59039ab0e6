// Collectives among the data-parallel ranks (one process and one GPU each), as
// the CUDA backend uses them. Every device collective is enqueued on the
// communicator's own stream, so the backend overlaps it with compute by
// ordering the two streams with events. Every wait on the host is bounded:
// a collective that does not finish within the timeout (a peer died or hangs)
// or an asynchronous NCCL error aborts the communicator and throws DistError
// naming this rank. The implementation is NCCL (nccl_comm.cpp).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

#include "qattn/dist.hpp"

namespace qattn::cuda {

class DeviceComm {
 public:
  virtual ~DeviceComm() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual cudaStream_t stream() const = 0;  // the communication stream

  // In place on stream(): buf (n floats) = its mean over the ranks.
  virtual void all_reduce_mean(float* buf, size_t n) = 0;
  // In place on stream(): block holds world() shards of `shard` floats; this
  // rank's shard [rank * shard, (rank + 1) * shard) becomes the mean over the
  // ranks of that shard (the other shards are left as they were).
  virtual void reduce_scatter_mean(float* block, size_t shard) = 0;
  // In place on stream(): block holds world() shards of shard_bytes bytes;
  // every rank's shard is copied into every rank's block.
  virtual void all_gather(void* block, size_t shard_bytes) = 0;
  // Blocking: values (n doubles on the host) = their sum over the ranks, the
  // same on every rank.
  virtual void sum_on_host(double* values, int n) = 0;
  // Blocks until `event` has completed, watching for NCCL errors and the
  // timeout; `what` names the wait in the error.
  virtual void wait(cudaEvent_t event, const char* what) = 0;
};

// Sets the CUDA device to env.local_rank, exchanges the NCCL unique id through
// the rendezvous (rendezvous.cpp) and creates the communicator, every step
// bounded by timeout_s. Throws DistError (and, in a build without NCCL, says so).
std::unique_ptr<DeviceComm> make_nccl_comm(const DistEnv& env, double timeout_s);

}  // namespace qattn::cuda
