// The backend interface: one GPT-2 with its optimizer state on one device.
// The trainer (src/train/) drives it; the CPU backend (src/cpu/) is the fp32
// reference, the CUDA backend (src/cuda/) the fast path. Parameters cross the
// interface in the canonical fp32 ParamLayout order.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qattn/config.hpp"
#include "qattn/model.hpp"

namespace qattn {

struct AdamWHyper {
  float lr, beta1, beta2, eps, weight_decay;
};

// Attention diagnostics (docs/attention-maths.md §7): one row per layer of diag.csv.
struct LayerDiag {
  int layer = 0;
  AttentionKind kind = AttentionKind::fpa;  // what the layer runs
  double q_rms = 0, k_rms = 0, max_abs_score = 0;
  bool compared = false;  // quantised kinds: the fields below are filled
  // cosine similarity and relative L2 error vs FPA on the same inputs
  double cos_o = 0, cos_p = 0, cos_ds = 0, cos_dq = 0, cos_dk = 0, cos_dv = 0;
  double rel_o = 0, rel_p = 0, rel_ds = 0, rel_dq = 0, rel_dk = 0, rel_dv = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;             // "cpu" or "cuda:0 (NVIDIA H200)"
  virtual const ParamLayout& layout() const = 0;

  virtual void get_params(std::vector<float>& out) = 0;   // fp32 master weights
  virtual void set_params(const std::vector<float>& in) = 0;
  virtual void get_grads(std::vector<float>& out) = 0;    // accumulated gradients
  virtual void get_adam_state(std::vector<float>& m, std::vector<float>& v) = 0;
  virtual void set_adam_state(const std::vector<float>& m, const std::vector<float>& v) = 0;

  virtual void zero_grad() = 0;
  // Forward and backward of one micro-batch (B, T) of token ids; gradients
  // accumulate, scaled by grad_scale (1 / grad_accum). Returns the mean loss.
  virtual float forward_backward(const int32_t* inputs, const int32_t* targets, int B, int T,
                                 float grad_scale) = 0;
  // Forward only; returns the mean loss.
  virtual float forward_loss(const int32_t* inputs, const int32_t* targets, int B, int T) = 0;
  // Global L2 norm of the accumulated gradients (deterministic).
  virtual float grad_norm() = 0;
  // AdamW on every parameter; grads are multiplied by grad_mult first (clipping).
  // t is the 1-based step for bias correction.
  virtual void adamw_step(const AdamWHyper& h, float grad_mult, int64_t t) = 0;
  // Attention diagnostics (docs/attention-maths.md §7) on a probe batch
  // (forward + backward, no update).
  virtual std::vector<LayerDiag> diagnostics(const int32_t* inputs, const int32_t* targets, int B,
                                             int T) = 0;
  // Peak device memory the backend reserved, bytes (0 when not applicable).
  virtual size_t memory_bytes() const { return 0; }
  // Dense bf16 peak of the device in FLOP/s for MFU (0: unknown, MFU not reported).
  virtual double peak_flops() const { return 0.0; }

  // Data parallel (docs/distributed.md): this replica's rank among `world`
  // processes that each run a backend on their own slice of every batch. A
  // distributed backend averages the gradients over the ranks inside the
  // backward of micro-batch train.grad_accum, so grad_norm and adamw_step see
  // the global gradient; get_params/get_adam_state are then collective (every
  // rank calls them together). One process is rank 0 of 1.
  virtual int rank() const { return 0; }
  virtual int world() const { return 1; }
  // values (n doubles, at most 16) = their sum over the ranks, the same on every rank.
  virtual void sum_over_ranks(double* /*values*/, int /*n*/) {}
};

std::unique_ptr<Backend> make_cpu_backend(const Config& cfg);

// The attention-maths.md §7 statistics of one layer (running attention a) from its attention inputs q, k, v and the
// gradient dout reaching its output, all (B, H, T, hd) fp32 on the host. Shared
// by the backends (the CUDA one copies these to the host first).
LayerDiag diagnose_layer(const AttentionConfig& a, int layer, int B, int H, int T, int hd,
                         const float* q, const float* k, const float* v, const float* dout);
#ifdef QATTN_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(const Config& cfg);
// One rank of a data-parallel job (dist.hpp): uses GPU env.local_rank, joins
// the NCCL communicator through the rendezvous, shards the optimizer state
// when cfg.dist.zero_stage = 1. Throws DistError.
struct DistEnv;
std::unique_ptr<Backend> make_cuda_backend(const Config& cfg, const DistEnv& env);
#endif

}  // namespace qattn
