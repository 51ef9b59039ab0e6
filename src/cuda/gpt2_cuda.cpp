// The CUDA backend: GPT-2 on one GPU, llm.c style. bf16 parameters and
// activations, fp32 master weights, gradients and AdamW state (docs/design.md,
// "Numerics of the CUDA backend"). The vocabulary is padded to a multiple of 128 inside the backend
// (padded rows of wte are zero and never trained); parameters cross the
// Backend interface in the canonical unpadded ParamLayout. Every activation
// lives in one arena sized for the largest micro-batch seen (the config's at
// start). Loss and grad norm are summed in a fixed order: runs are repeatable.
//
// Data parallel (docs/distributed.md): with a DeviceComm, the backward of the
// last micro-batch of a step (the train.grad_accum-th after zero_grad) hands
// each layer's gradient block to the communication stream as soon as the
// layer is done: a reduce-scatter (ZeRO-1) or an all-reduce (ZeRO-0), both
// averaging over the ranks. Under ZeRO-1 each rank keeps fp32 master weights
// and moments only for its shard of every block (DeviceLayout), updates that
// shard, and all-gathers the bf16 parameters. Checkpoints see the canonical
// full state: get_* gather the shards, set_* keep this rank's part, so a
// checkpoint loads on any number of ranks.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "adamw.cuh"
#include "attention/attention.cuh"
#include "classifier.cuh"
#include "column_sum.cuh"
#include "common.cuh"
#include "cublaslt.hpp"
#include "device_comm.hpp"
#include "device_layout.hpp"
#include "encoder.cuh"
#include "global_norm.cuh"
#include "layernorm.cuh"
#include "qattn/backend.hpp"
#include "qattn/dist.hpp"
#include "qk_norm.cuh"

namespace qattn {

namespace {

using cuda::bf16;
using cuda::DeviceLayout;

constexpr int kVocabMultiple = 128;  // padded vocab: full tensor-core tiles for the head

size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

// One temporary fp32 device buffer in the device layout (checkpoint traffic).
class DeviceFloats {
 public:
  explicit DeviceFloats(size_t n) { CUDA_CHECK(cudaMalloc(&p_, n * sizeof(float))); }
  ~DeviceFloats() { cudaFree(p_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* get() const { return p_; }

 private:
  float* p_ = nullptr;
};

// Bump allocator over one device allocation. Run once with no base to measure,
// then again over the allocation to hand out the pointers.
class Arena {
 public:
  explicit Arena(char* base = nullptr) : base_(base) {}
  template <typename T>
  T* take(size_t count) {
    const size_t at = used_;
    used_ = round_up(used_ + count * sizeof(T), 256);
    return base_ ? reinterpret_cast<T*>(base_ + at) : nullptr;
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

struct LayerActivations {
  bf16* ln1;          // (N, C)
  float* ln1_mean;    // (N)
  float* ln1_rstd;    // (N)
  bf16* qkv;          // (N, 3C) q and k normalised in place with QK-norm on
  bf16* qk_raw;       // (N, 2C) q, k before QK-norm (QK-norm on only)
  float* qk_rrms;     // (N, 2H) (QK-norm on only)
  bf16* atty;         // (N, C) attention output
  float* att_stats;   // (B, H, T, row_stats) softmax statistics
  void* att_saved;    // what the attention forward keeps for its backward (sage: int8 Q, K, V)
  bf16* residual2;    // (N, C) residual + attention projection
  bf16* ln2;          // (N, C)
  float* ln2_mean;    // (N)
  float* ln2_rstd;    // (N)
  bf16* fch;          // (N, 4C) pre-GELU
  bf16* fch_gelu;     // (N, 4C)
  bf16* residual3;    // (N, C) residual2 + MLP projection: the layer's output
};

struct Activations {
  bf16* encoded;      // (N, C)
  std::vector<LayerActivations> layers;
  bf16* lnf;          // (N, C)
  float* lnf_mean;    // (N)
  float* lnf_rstd;    // (N)
  bf16* logits;       // (N, Vp) then dlogits, in place
  float* losses;      // (N)
  // Backward scratch, reused by every layer.
  bf16* dres;         // (N, C) gradient of the residual stream
  bf16* dln;          // (N, C) gradient of a LayerNorm output
  bf16* datty;        // (N, C) gradient of the attention output
  bf16* dbig;         // (N, 4C) d(pre-GELU), then d(qkv) (N, 3C)
  float* partials;    // deterministic partial sums (bias, LayerNorm, QK-norm, norm)
  void* attention_workspace;
  int32_t* inputs;    // (N)
  int32_t* targets;   // (N)
  int32_t* bucket_token;     // (N) encoder backward buckets, see TokenBuckets
  int32_t* bucket_start;     // (N + 1)
  int32_t* bucket_position;  // (N)
  float* norm;        // (blocks) squared grad norm of each owned range

  // att: each layer's attention, which sizes its saved statistics and buffer.
  void carve(Arena& a, const ModelConfig& m, const std::vector<AttentionConfig>& att, int Vp, int B,
             int T, int owned_ranges) {
    const size_t N = static_cast<size_t>(B) * T, C = m.dim, L = m.layers, H = m.heads;
    const size_t qk = m.qk_norm.on() ? 1 : 0;
    const cuda::AttentionShape shape{B, m.heads, T, m.head_dim()};
    encoded = a.take<bf16>(N * C);
    layers.resize(L);
    size_t workspace = 0;  // shared by the layers: the largest any of them needs
    for (size_t i = 0; i < L; ++i) {
      LayerActivations& l = layers[i];
      l.ln1 = a.take<bf16>(N * C);
      l.ln1_mean = a.take<float>(N);
      l.ln1_rstd = a.take<float>(N);
      l.qkv = a.take<bf16>(N * 3 * C);
      l.qk_raw = a.take<bf16>(qk * N * 2 * C);
      l.qk_rrms = a.take<float>(qk * N * 2 * H);
      l.atty = a.take<bf16>(N * C);
      l.att_stats = a.take<float>(N * H * cuda::attention_row_stats(att[i], m.head_dim()));
      l.att_saved = a.take<char>(cuda::attention_saved_bytes(att[i], shape));
      workspace = std::max(workspace, cuda::attention_workspace_bytes(att[i], shape));
      l.residual2 = a.take<bf16>(N * C);
      l.ln2 = a.take<bf16>(N * C);
      l.ln2_mean = a.take<float>(N);
      l.ln2_rstd = a.take<float>(N);
      l.fch = a.take<bf16>(N * 4 * C);
      l.fch_gelu = a.take<bf16>(N * 4 * C);
      l.residual3 = a.take<bf16>(N * C);
    }
    lnf = a.take<bf16>(N * C);
    lnf_mean = a.take<float>(N);
    lnf_rstd = a.take<float>(N);
    logits = a.take<bf16>(N * Vp);
    losses = a.take<float>(N);
    dres = a.take<bf16>(N * C);
    dln = a.take<bf16>(N * C);
    datty = a.take<bf16>(N * C);
    dbig = a.take<bf16>(N * 4 * C);
    const int iN = static_cast<int>(N);
    partials = a.take<float>(std::max({cuda::bias_backward_scratch_floats(iN, 4 * m.dim),
                                       cuda::layernorm_backward_scratch_floats(iN, m.dim),
                                       qk * cuda::qk_norm_backward_scratch_floats(m.qk_norm.form, iN, m.heads, m.head_dim()),
                                       cuda::global_norm_scratch_floats()}));
    attention_workspace = a.take<char>(workspace);
    inputs = a.take<int32_t>(N);
    targets = a.take<int32_t>(N);
    bucket_token = a.take<int32_t>(N);
    bucket_start = a.take<int32_t>(N + 1);
    bucket_position = a.take<int32_t>(N);
    norm = a.take<float>(owned_ranges);
  }
};

// Pinned host mirror of the per-call inputs, so copies run asynchronously.
struct HostStaging {
  int32_t* inputs = nullptr;           // (N)
  int32_t* targets = nullptr;          // (N)
  int32_t* bucket_token = nullptr;     // (N)
  int32_t* bucket_start = nullptr;     // (N + 1)
  int32_t* bucket_position = nullptr;  // (N)
  float* losses = nullptr;             // (N)
  void* block = nullptr;
  void allocate(size_t N) {
    release();
    CUDA_CHECK(cudaMallocHost(&block, (5 * N + 1) * sizeof(int32_t) + N * sizeof(float)));
    auto* p = static_cast<int32_t*>(block);
    inputs = p;
    targets = p + N;
    bucket_token = p + 2 * N;
    bucket_start = p + 3 * N;
    bucket_position = p + 4 * N + 1;
    losses = reinterpret_cast<float*>(p + 5 * N + 1);
  }
  void release() {
    if (block) cudaFreeHost(block);
    block = nullptr;
  }
};

class CudaBackend final : public Backend {
 public:
  // comm: null on one GPU; else this rank's communicator (the device is set).
  CudaBackend(const Config& cfg, std::unique_ptr<cuda::DeviceComm> comm)
      : cfg_(cfg), m_(cfg.model), attention_(cfg.attention_per_layer()), layout_(cfg.model),
        Vp_(static_cast<int>(round_up(cfg.model.vocab, kVocabMultiple))),
        comm_(std::move(comm)), sharded_(comm_ && cfg.dist.zero_stage == 1),
        dev_layout_(layout_, m_.layers, static_cast<size_t>(Vp_) * cfg.model.dim,
                    sharded_ ? comm_->world() : 1, sharded_ ? comm_->rank() : 0) {
    const int hd = m_.head_dim();
    if (m_.dim % m_.heads != 0 || (hd != 64 && hd != 128)) {
      throw std::runtime_error("model.dim / model.heads = " + std::to_string(m_.dim) + " / " +
                               std::to_string(m_.heads) +
                               ": the CUDA backend needs a head dimension of 64 or 128");
    }
    CUDA_CHECK(cudaGetDevice(&device_));
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    name_ = "cuda:" + std::to_string(device_) + " (" + prop.name + ")";
    if (comm_)
      name_ += fmt::format(", rank {} of {}, ZeRO-{}", comm_->rank(), comm_->world(), cfg.dist.zero_stage);
    // Dense bf16 tensor-core peaks (datasheet): Hopper SXM 989, A100 312 TFLOP/s.
    peak_flops_ = prop.major == 9 ? 989e12 : (prop.major == 8 && prop.minor == 0) ? 312e12 : 0.0;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    for (cudaEvent_t* e : {&losses_ready_, &synced_, &compute_done_, &comm_done_})
      CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    CUDA_CHECK(cudaMallocHost(&host_norms_, dev_layout_.owned().size() * sizeof(float)));
    matmuls_ = std::make_unique<cuda::Matmuls>(stream_);

    // Parameters: bf16 copy and fp32 gradients (whole model), then fp32
    // master, m, v (this rank's shards only under ZeRO-1).
    const size_t P = dev_layout_.total(), S = dev_layout_.packed_total();
    const size_t params_bytes = round_up(P * sizeof(bf16), 256);
    state_bytes_ = params_bytes + (P + 3 * S) * sizeof(float);
    CUDA_CHECK(cudaMalloc(&state_, state_bytes_));
    CUDA_CHECK(cudaMemset(state_, 0, state_bytes_));
    params_ = static_cast<bf16*>(state_);
    grads_ = reinterpret_cast<float*>(static_cast<char*>(state_) + params_bytes);
    master_ = grads_ + P;
    adam_m_ = master_ + S;
    adam_v_ = adam_m_ + S;
    std::vector<float> init;
    init_params(m_, cfg.train.seed, init);
    set_params(init);
    if (cfg.train.micro_batch > 0) ensure_capacity(cfg.train.micro_batch, m_.seq_len);
  }

  ~CudaBackend() override {
    staging_.release();
    if (arena_) cudaFree(arena_);
    matmuls_.reset();
    cudaFree(state_);
    cudaFreeHost(host_norms_);
    for (cudaEvent_t e : {losses_ready_, synced_, compute_done_, comm_done_}) cudaEventDestroy(e);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return name_; }
  int rank() const override { return comm_ ? comm_->rank() : 0; }
  int world() const override { return comm_ ? comm_->world() : 1; }
  void sum_over_ranks(double* values, int n) override {
    if (comm_) comm_->sum_on_host(values, n);
  }
  const ParamLayout& layout() const override { return layout_; }
  size_t memory_bytes() const override { return state_bytes_ + arena_bytes_; }
  double peak_flops() const override { return peak_flops_; }

  // The fp32 state crosses the interface whole: get_* gather every rank's
  // shard (collective: every rank calls them together), set_* keep this
  // rank's part of the full vector.
  void get_params(std::vector<float>& out) override { download_packed(master_, out); }
  void set_params(const std::vector<float>& in) override {
    DeviceFloats full(dev_layout_.total());
    upload(full.get(), in);
    cuda::copy_master_to_params(params_, full.get(), dev_layout_.total(), stream_);
    pack(master_, full.get());
    sync("set_params");
  }
  void get_grads(std::vector<float>& out) override {
    if (sharded_) gather_blocks(grads_, sizeof(float));  // ZeRO-1: each rank holds its reduced shard
    download(grads_, out);
  }
  void get_adam_state(std::vector<float>& m, std::vector<float>& v) override {
    download_packed(adam_m_, m);
    download_packed(adam_v_, v);
  }
  void set_adam_state(const std::vector<float>& m, const std::vector<float>& v) override {
    DeviceFloats full(dev_layout_.total());
    for (auto [packed, in] : {std::pair{adam_m_, &m}, std::pair{adam_v_, &v}}) {
      upload(full.get(), *in);
      pack(packed, full.get());
      sync("set_adam_state");
    }
  }

  void zero_grad() override {
    CUDA_CHECK(cudaMemsetAsync(grads_, 0, dev_layout_.total() * sizeof(float), stream_));
    micro_batches_ = 0;
    reduced_ = false;
  }

  float forward_backward(const int32_t* inputs, const int32_t* targets, int B, int T,
                         float grad_scale) override {
    stage(inputs, targets, B, T, true);
    forward(B, T, grad_scale / (static_cast<float>(B) * T), true);
    fetch_losses(B * T);
    const bool reduce = comm_ && ++micro_batches_ == cfg_.train.grad_accum;
    backward(B, T, nullptr, reduce);
    // Only the losses are waited for: the backward keeps the GPU busy while the
    // caller prepares the next micro-batch.
    return mean_loss(B * T);
  }

  float forward_loss(const int32_t* inputs, const int32_t* targets, int B, int T) override {
    stage(inputs, targets, B, T, false);
    forward(B, T, 0.0f, false);
    fetch_losses(B * T);
    return mean_loss(B * T);
  }

  // Squares of the owned ranges summed in a fixed order (then over the ranks
  // under ZeRO-1, where each rank owns a part): the same on every rank.
  float grad_norm() override {
    require_reduced("grad_norm");
    const auto& owned = dev_layout_.owned();
    for (size_t i = 0; i < owned.size(); ++i)
      cuda::global_norm_squared(acts_.norm + i, grads_ + owned[i].begin, owned[i].count,
                                acts_.partials, stream_);
    CUDA_CHECK(cudaMemcpyAsync(host_norms_, acts_.norm, owned.size() * sizeof(float),
                               cudaMemcpyDeviceToHost, stream_));
    sync("the gradient norm");
    double sq = 0.0;
    for (size_t i = 0; i < owned.size(); ++i) sq += host_norms_[i];
    if (sharded_) comm_->sum_on_host(&sq, 1);
    return static_cast<float>(std::sqrt(sq));
  }

  // AdamW on the owned ranges, tensor slice by tensor slice (weight decay and
  // the lr multiplier are per tensor); under ZeRO-1 the updated bf16 shards are
  // then all-gathered.
  void adamw_step(const AdamWHyper& h, float grad_mult, int64_t t) override {
    require_reduced("adamw_step");
    cuda::AdamWArgs a{h.lr, h.beta1, h.beta2, h.eps, 0.0f, grad_mult,
                      1.0f - std::pow(h.beta1, static_cast<float>(t)),
                      1.0f - std::pow(h.beta2, static_cast<float>(t))};
    for (const DeviceLayout::Owned& own : dev_layout_.owned()) {
      for (const DeviceLayout::Slice& s : dev_layout_.slices()) {
        // Canonical count: the padded vocabulary rows of wte stay zero.
        const size_t lo = std::max(own.begin, s.offset);
        const size_t hi = std::min(own.begin + own.count, s.offset + s.count);
        if (lo >= hi) continue;
        a.lr = static_cast<float>(h.lr * lr_multiplier(m_, s.tensor));
        a.weight_decay = ParamLayout::decayed(s.tensor) ? h.weight_decay : 0.0f;
        const size_t packed = own.packed + (lo - own.begin);
        cuda::adamw_update(params_ + lo, master_ + packed, adam_m_ + packed, adam_v_ + packed,
                           grads_ + lo, hi - lo, a, stream_);
      }
    }
    if (sharded_) gather_blocks(params_, sizeof(bf16));
  }

  std::vector<LayerDiag> diagnostics(const int32_t* inputs, const int32_t* targets, int B,
                                     int T) override {
    // The probe's backward must not touch the training gradients: keep a copy.
    sync("the step before diagnostics");
    const size_t grad_bytes = dev_layout_.total() * sizeof(float);
    float* saved = nullptr;
    CUDA_CHECK(cudaMalloc(&saved, grad_bytes));
    CUDA_CHECK(cudaMemcpyAsync(saved, grads_, grad_bytes, cudaMemcpyDeviceToDevice, stream_));
    stage(inputs, targets, B, T, true);
    forward(B, T, 1.0f / (static_cast<float>(B) * T), true);
    std::vector<std::vector<bf16>> dout(m_.layers);
    backward(B, T, &dout, false);
    CUDA_CHECK(cudaMemcpyAsync(grads_, saved, grad_bytes, cudaMemcpyDeviceToDevice, stream_));
    sync("diagnostics");
    CUDA_CHECK(cudaFree(saved));

    const int H = m_.heads, hd = m_.head_dim(), C = m_.dim;
    const size_t N = static_cast<size_t>(B) * T;
    std::vector<bf16> qkv(N * 3 * C);
    std::vector<float> q(N * C), k(N * C), v(N * C), dO(N * C);
    std::vector<LayerDiag> out;
    for (int l = 0; l < m_.layers; ++l) {
      CUDA_CHECK(cudaMemcpy(qkv.data(), acts_.layers[l].qkv, qkv.size() * sizeof(bf16),
                            cudaMemcpyDeviceToHost));
      // (B, T, 3, H, hd) and (B, T, H, hd) -> (B, H, T, hd) fp32.
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
          for (int t = 0; t < T; ++t)
            for (int i = 0; i < hd; ++i) {
              const size_t bht = ((static_cast<size_t>(b) * H + h) * T + t) * hd + i;
              const size_t row = static_cast<size_t>(b) * T + t, col = static_cast<size_t>(h) * hd + i;
              q[bht] = __bfloat162float(qkv[row * 3 * C + col]);
              k[bht] = __bfloat162float(qkv[row * 3 * C + C + col]);
              v[bht] = __bfloat162float(qkv[row * 3 * C + 2 * C + col]);
              dO[bht] = __bfloat162float(dout[l][row * C + col]);
            }
      out.push_back(diagnose_layer(attention_[l], l, B, H, T, hd, q.data(), k.data(), v.data(),
                                   dO.data()));
    }
    return out;
  }

 private:
  // Layer `layer`'s slice of a stacked (L, ...) tensor; whole tensors for the rest.
  const bf16* param(int t, int layer = 0) const { return params_ + dev_layout_.offset(t, layer); }
  float* grad(int t, int layer = 0) const { return grads_ + dev_layout_.offset(t, layer); }
  // Layer `layer`'s QK-norm parameters; the tensors of the other form have size 0.
  cuda::QkNormParams qk_norm_params(int layer) const {
    return {m_.qk_norm.form, param(P_QGAMMA, layer), param(P_KGAMMA, layer), param(P_QKSCALE, layer)};
  }

  // Waits for everything enqueued on the compute stream; with a communicator
  // the wait is bounded and watches NCCL (a dead peer must not hang us).
  void sync(const char* what) { wait(synced_, what, true); }
  void wait(cudaEvent_t event, const char* what, bool record) {
    if (record) CUDA_CHECK(cudaEventRecord(event, stream_));
    if (comm_) {
      comm_->wait(event, what);
    } else {
      CUDA_CHECK(cudaEventSynchronize(event));
    }
  }

  // Slice by slice between the canonical host layout and the device layout
  // (full, unpacked device buffers). The stream is idle before a copy, so the
  // pageable copies never wait on a collective unboundedly.
  void download(const float* dev, std::vector<float>& out) {
    sync("the copy of a state vector to the host");
    out.resize(layout_.total);
    for (const DeviceLayout::Slice& s : dev_layout_.slices()) {
      CUDA_CHECK(cudaMemcpyAsync(out.data() + s.host, dev + s.offset, s.count * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream_));
    }
    sync("the copy of a state vector to the host");
  }
  void upload(float* dev, const std::vector<float>& in) {
    if (in.size() != layout_.total) {
      throw std::runtime_error("cuda backend: parameter vector of " + std::to_string(in.size()) +
                               " floats, the model has " + std::to_string(layout_.total));
    }
    sync("the copy of a state vector to the device");
    CUDA_CHECK(cudaMemsetAsync(dev, 0, dev_layout_.total() * sizeof(float), stream_));  // padding
    for (const DeviceLayout::Slice& s : dev_layout_.slices()) {
      CUDA_CHECK(cudaMemcpyAsync(dev + s.offset, in.data() + s.host, s.count * sizeof(float),
                                 cudaMemcpyHostToDevice, stream_));
    }
    sync("the copy of a state vector to the device");  // `in` may go away after return
  }

  // packed (this rank's optimizer shards) <- its owned ranges of full.
  void pack(float* packed, const float* full) {
    for (const DeviceLayout::Owned& o : dev_layout_.owned())
      CUDA_CHECK(cudaMemcpyAsync(packed + o.packed, full + o.begin, o.count * sizeof(float),
                                 cudaMemcpyDeviceToDevice, stream_));
  }
  // The full canonical vector of a packed fp32 state: this rank's shards,
  // then (ZeRO-1) every other rank's.
  void download_packed(const float* packed, std::vector<float>& out) {
    DeviceFloats full(dev_layout_.total());
    for (const DeviceLayout::Owned& o : dev_layout_.owned())
      CUDA_CHECK(cudaMemcpyAsync(full.get() + o.begin, packed + o.packed, o.count * sizeof(float),
                                 cudaMemcpyDeviceToDevice, stream_));
    if (sharded_) gather_blocks(full.get(), sizeof(float));
    download(full.get(), out);
  }

  // In place over a full buffer of elem_bytes elements: every rank's shard of
  // every block onto every rank, on the communication stream, after the work
  // already on the compute stream; the compute stream then waits for it.
  void gather_blocks(void* base, size_t elem_bytes) {
    CUDA_CHECK(cudaEventRecord(compute_done_, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(comm_->stream(), compute_done_));
    for (int b = 0; b < dev_layout_.blocks(); ++b)
      comm_->all_gather(static_cast<char*>(base) + dev_layout_.block_begin(b) * elem_bytes,
                        dev_layout_.shard_size(b) * elem_bytes);
    join_comm_stream();
  }
  void join_comm_stream() {
    CUDA_CHECK(cudaEventRecord(comm_done_, comm_->stream()));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, comm_done_));
  }

  // Block b's gradients are final for this step: average them over the ranks
  // on the communication stream while the compute stream goes on. Every
  // block's event is recorded before the stream waits on it, so one event
  // serves all blocks.
  void reduce_block(int b) {
    CUDA_CHECK(cudaEventRecord(compute_done_, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(comm_->stream(), compute_done_));
    float* block = grads_ + dev_layout_.block_begin(b);
    if (sharded_) {
      comm_->reduce_scatter_mean(block, dev_layout_.shard_size(b));
    } else {
      comm_->all_reduce_mean(block, dev_layout_.block_size(b));
    }
  }

  void require_reduced(const char* caller) const {
    if (comm_ && !reduced_)
      throw std::logic_error(std::string("cuda backend: ") + caller + " after " +
                             std::to_string(micro_batches_) + " micro-batches; the gradients are "
                             "reduced over the ranks in the backward of micro-batch train.grad_accum = " +
                             std::to_string(cfg_.train.grad_accum));
  }

  // Lays the activations out for B x T tokens, growing the arena (and the
  // pinned staging) when the shape needs more than is there.
  void ensure_capacity(int B, int T) {
    if (T > m_.seq_len) {
      throw std::runtime_error("cuda backend: sequence length " + std::to_string(T) +
                               " exceeds model.seq_len " + std::to_string(m_.seq_len));
    }
    const size_t N = static_cast<size_t>(B) * T;
    const int ranges = static_cast<int>(dev_layout_.owned().size());
    Arena measure;
    acts_.carve(measure, m_, attention_, Vp_, B, T, ranges);
    if (measure.used() > arena_bytes_ || N > staging_tokens_) {
      sync("the work before the activations grow");  // nothing in flight uses the old buffers
    }
    if (measure.used() > arena_bytes_) {
      if (arena_) CUDA_CHECK(cudaFree(arena_));
      arena_bytes_ = measure.used();
      CUDA_CHECK(cudaMalloc(&arena_, arena_bytes_));
      spdlog::info("{}: parameters and optimizer {:.2f} GiB, activations {:.2f} GiB (B={}, T={})",
                   name_, state_bytes_ / 1073741824.0, arena_bytes_ / 1073741824.0, B, T);
    }
    if (N > staging_tokens_) {
      staging_.allocate(N);
      staging_tokens_ = N;
    }
    Arena arena(static_cast<char*>(arena_));
    acts_.carve(arena, m_, attention_, Vp_, B, T, ranges);
  }

  // Copies the batch to the device; for a backward, also the encoder's token
  // buckets (a counting sort by token id, positions ascending in each bucket).
  void stage(const int32_t* inputs, const int32_t* targets, int B, int T, bool with_buckets) {
    ensure_capacity(B, T);
    const int N = B * T, V = m_.vocab;
    for (int i = 0; i < N; ++i) {
      if (inputs[i] < 0 || inputs[i] >= V || targets[i] < 0 || targets[i] >= V) {
        throw std::runtime_error("cuda backend: token id " +
                                 std::to_string(inputs[i] < 0 || inputs[i] >= V ? inputs[i] : targets[i]) +
                                 " at position " + std::to_string(i) + " outside [0, model.vocab = " +
                                 std::to_string(V) + ")");
      }
    }
    std::copy(inputs, inputs + N, staging_.inputs);
    std::copy(targets, targets + N, staging_.targets);
    CUDA_CHECK(cudaMemcpyAsync(acts_.inputs, staging_.inputs, N * sizeof(int32_t),
                               cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemcpyAsync(acts_.targets, staging_.targets, N * sizeof(int32_t),
                               cudaMemcpyHostToDevice, stream_));
    if (!with_buckets) return;
    counts_.assign(V + 1, 0);
    for (int i = 0; i < N; ++i) ++counts_[inputs[i] + 1];
    std::partial_sum(counts_.begin(), counts_.end(), counts_.begin());  // counts_[tok] = start
    int buckets = 0;
    for (int tok = 0; tok < V; ++tok) {
      if (counts_[tok + 1] == counts_[tok]) continue;
      staging_.bucket_token[buckets] = tok;
      staging_.bucket_start[buckets] = counts_[tok];
      ++buckets;
    }
    staging_.bucket_start[buckets] = N;
    for (int i = 0; i < N; ++i) staging_.bucket_position[counts_[inputs[i]]++] = i;
    num_buckets_ = buckets;
    CUDA_CHECK(cudaMemcpyAsync(acts_.bucket_token, staging_.bucket_token, buckets * sizeof(int32_t),
                               cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemcpyAsync(acts_.bucket_start, staging_.bucket_start,
                               (buckets + 1) * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemcpyAsync(acts_.bucket_position, staging_.bucket_position, N * sizeof(int32_t),
                               cudaMemcpyHostToDevice, stream_));
  }

  void fetch_losses(int N) {
    CUDA_CHECK(cudaMemcpyAsync(staging_.losses, acts_.losses, N * sizeof(float),
                               cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaEventRecord(losses_ready_, stream_));
  }
  // Sum in double, in token order: the same value on every run.
  float mean_loss(int N) {
    wait(losses_ready_, "the micro-batch's losses", false);
    double sum = 0.0;
    for (int i = 0; i < N; ++i) sum += staging_.losses[i];
    return static_cast<float>(sum / N);
  }

  // Leaves the losses in acts_.losses and, when with_grad, dlogits in place of
  // the logits (dloss = d(loss)/d(each token's loss)).
  void forward(int B, int T, float dloss, bool with_grad) {
    const int C = m_.dim, H = m_.heads, hd = m_.head_dim(), N = B * T;
    cuda::encoder_forward(acts_.encoded, acts_.inputs, param(P_WTE), param(P_WPE), B, T, C,
                          stream_);
    const bf16* residual = acts_.encoded;
    for (int l = 0; l < m_.layers; ++l) {
      LayerActivations& a = acts_.layers[l];
      cuda::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, param(P_LN1W, l),
                              param(P_LN1B, l), N, C, stream_);
      matmuls_->forward(a.qkv, a.ln1, param(P_QKVW, l), param(P_QKVB, l), nullptr, N, C, 3 * C);
      if (m_.qk_norm.on())
        cuda::qk_norm_forward(a.qkv, a.qk_raw, a.qk_rrms, qk_norm_params(l), N, H, hd, stream_);
      cuda::attention_forward(attention_[l], {B, H, T, hd}, a.qkv, a.atty, a.att_stats,
                              a.att_saved, stream_);
      // residual2 = residual + atty . W^T + b: the add rides in cuBLASLt's C input.
      matmuls_->forward(a.residual2, a.atty, param(P_ATTPROJW, l), param(P_ATTPROJB, l), residual,
                        N, C, C);
      cuda::layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, param(P_LN2W, l),
                              param(P_LN2B, l), N, C, stream_);
      matmuls_->forward_gelu(a.fch_gelu, a.fch, a.ln2, param(P_FCW, l), param(P_FCB, l), N, C,
                             4 * C);
      matmuls_->forward(a.residual3, a.fch_gelu, param(P_FCPROJW, l), param(P_FCPROJB, l),
                        a.residual2, N, 4 * C, C);
      residual = a.residual3;
    }
    cuda::layernorm_forward(acts_.lnf, acts_.lnf_mean, acts_.lnf_rstd, residual, param(P_LNFW),
                            param(P_LNFB), N, C, stream_);
    matmuls_->forward(acts_.logits, acts_.lnf, param(P_WTE), nullptr, nullptr, N, C, Vp_);
    cuda::classifier_forward_backward(acts_.logits, acts_.losses, acts_.targets, N, m_.vocab, Vp_,
                                      dloss, with_grad, stream_);
  }

  // Needs forward(..., with_grad = true) first. Gradients accumulate into
  // grads_. dout_capture (diagnostics): each layer's attention-output gradient.
  // reduce: average each block over the ranks as soon as it is final (layer
  // blocks from the last layer down, then the embeddings); the compute stream
  // waits for the communication stream only at the end.
  void backward(int B, int T, std::vector<std::vector<bf16>>* dout_capture, bool reduce) {
    const int C = m_.dim, H = m_.heads, hd = m_.head_dim(), N = B * T;
    const bf16* last = m_.layers ? acts_.layers.back().residual3 : acts_.encoded;
    matmuls_->backward_input(acts_.dln, acts_.logits, param(P_WTE), nullptr, N, C, Vp_);
    matmuls_->backward_weight(grad(P_WTE), nullptr, acts_.logits, acts_.lnf, N, C, Vp_, nullptr);
    CUDA_CHECK(cudaMemsetAsync(acts_.dres, 0, static_cast<size_t>(N) * C * sizeof(bf16), stream_));
    cuda::layernorm_backward(acts_.dres, grad(P_LNFW), grad(P_LNFB), acts_.dln, last,
                             param(P_LNFW), acts_.lnf_mean, acts_.lnf_rstd, N, C, acts_.partials,
                             stream_);
    for (int l = m_.layers - 1; l >= 0; --l) {
      LayerActivations& a = acts_.layers[l];
      const bf16* residual = l == 0 ? acts_.encoded : acts_.layers[l - 1].residual3;
      // dres holds d(residual3). MLP projection, then fc through GELU' (DGELU epilogue).
      matmuls_->backward_weight(grad(P_FCPROJW, l), grad(P_FCPROJB, l), acts_.dres, a.fch_gelu, N,
                                4 * C, C, acts_.partials);
      matmuls_->backward_input(acts_.dbig, acts_.dres, param(P_FCPROJW, l), a.fch, N, 4 * C, C);
      matmuls_->backward_weight(grad(P_FCW, l), grad(P_FCB, l), acts_.dbig, a.ln2, N, C, 4 * C,
                                acts_.partials);
      matmuls_->backward_input(acts_.dln, acts_.dbig, param(P_FCW, l), nullptr, N, C, 4 * C);
      cuda::layernorm_backward(acts_.dres, grad(P_LN2W, l), grad(P_LN2B, l), acts_.dln,
                               a.residual2, param(P_LN2W, l), a.ln2_mean, a.ln2_rstd, N, C,
                               acts_.partials, stream_);
      // dres holds d(residual2). Attention projection and attention.
      matmuls_->backward_weight(grad(P_ATTPROJW, l), grad(P_ATTPROJB, l), acts_.dres, a.atty, N, C,
                                C, acts_.partials);
      matmuls_->backward_input(acts_.datty, acts_.dres, param(P_ATTPROJW, l), nullptr, N, C, C);
      if (dout_capture) {
        auto& host = (*dout_capture)[l];
        host.resize(static_cast<size_t>(N) * C);
        CUDA_CHECK(cudaMemcpyAsync(host.data(), acts_.datty, host.size() * sizeof(bf16),
                                   cudaMemcpyDeviceToHost, stream_));
      }
      bf16* dqkv = acts_.dbig;  // (N, 3C): the MLP's gradient is no longer needed
      cuda::attention_backward(attention_[l], {B, H, T, hd}, a.qkv, a.atty, acts_.datty,
                               a.att_stats, a.att_saved, dqkv, acts_.attention_workspace, stream_);
      if (m_.qk_norm.on()) {
        const cuda::QkNormGrads qk_grads{grad(P_QGAMMA, l), grad(P_KGAMMA, l), grad(P_QKSCALE, l)};
        cuda::qk_norm_backward(dqkv, qk_grads, a.qk_raw, a.qk_rrms, qk_norm_params(l), N, H, hd,
                               acts_.partials, stream_);
      }
      matmuls_->backward_weight(grad(P_QKVW, l), grad(P_QKVB, l), dqkv, a.ln1, N, C, 3 * C,
                                acts_.partials);
      matmuls_->backward_input(acts_.dln, dqkv, param(P_QKVW, l), nullptr, N, C, 3 * C);
      cuda::layernorm_backward(acts_.dres, grad(P_LN1W, l), grad(P_LN1B, l), acts_.dln, residual,
                               param(P_LN1W, l), a.ln1_mean, a.ln1_rstd, N, C, acts_.partials,
                               stream_);
      // dres holds d(residual): the gradient of the layer's input.
      if (reduce) reduce_block(1 + l);
    }
    const cuda::TokenBuckets buckets{num_buckets_, acts_.bucket_token, acts_.bucket_start,
                                     acts_.bucket_position};
    cuda::encoder_backward(grad(P_WTE), grad(P_WPE), acts_.dres, buckets, B, T, C, stream_);
    if (reduce) {
      reduce_block(0);
      join_comm_stream();
      reduced_ = true;
    }
  }

  Config cfg_;
  ModelConfig m_;
  std::vector<AttentionConfig> attention_;  // per layer (attention.layers applied)
  ParamLayout layout_;
  int Vp_;
  int device_ = 0;
  std::string name_;
  double peak_flops_ = 0.0;
  std::unique_ptr<cuda::DeviceComm> comm_;  // null on one GPU
  bool sharded_;                            // ZeRO-1: optimizer state sharded over the ranks
  DeviceLayout dev_layout_;
  int micro_batches_ = 0;                   // since zero_grad
  bool reduced_ = false;                    // this step's gradients are averaged over the ranks
  cudaStream_t stream_ = nullptr;
  cudaEvent_t losses_ready_ = nullptr, synced_ = nullptr;
  cudaEvent_t compute_done_ = nullptr, comm_done_ = nullptr;  // ordering the two streams
  float* host_norms_ = nullptr;             // (owned ranges) pinned
  std::unique_ptr<cuda::Matmuls> matmuls_;

  void* state_ = nullptr;  // params (bf16) | grads | master | m | v (fp32; the last three packed)
  size_t state_bytes_ = 0;
  bf16* params_ = nullptr;
  float *master_ = nullptr, *grads_ = nullptr, *adam_m_ = nullptr, *adam_v_ = nullptr;

  void* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  size_t staging_tokens_ = 0;
  Activations acts_;
  HostStaging staging_;
  std::vector<int32_t> counts_;  // (V + 1) counting-sort scratch
  int num_buckets_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const Config& cfg) {
  return std::make_unique<CudaBackend>(cfg, nullptr);
}

std::unique_ptr<Backend> make_cuda_backend(const Config& cfg, const DistEnv& env) {
  return std::make_unique<CudaBackend>(cfg, cuda::make_nccl_comm(env, dist_timeout_seconds()));
}

}  // namespace qattn
