// The CUDA attention API (attention.cuh): shape checks, then one kernel family per kind.
#include <stdexcept>
#include <string>

#include "attention/attention.cuh"
#include "attention/fpa/fpa.cuh"
#include "attention/kinterval/kinterval.cuh"
#include "attention/sage/sage.cuh"

namespace qattn::cuda {
namespace {

[[noreturn]] void unknown_kind(AttentionKind kind) {
  throw std::invalid_argument("CUDA attention: unknown kind " +
                              std::to_string(static_cast<int>(kind)));
}

void check_shape(const AttentionShape& s) {
  if (s.d != 64 && s.d != 128)
    throw std::invalid_argument("CUDA attention: head dim d = " + std::to_string(s.d) +
                                " is not supported (allowed: 64, 128)");
  if (s.B < 1 || s.H < 1 || s.T < 1)
    throw std::invalid_argument("CUDA attention: shape (B, H, T) = (" + std::to_string(s.B) + ", " +
                                std::to_string(s.H) + ", " + std::to_string(s.T) +
                                ") must be positive");
}

}  // namespace

// Every per-kind function is a switch over the kind with no default, built with
// -Werror=switch: a new kind does not compile until each of them handles it.
int attention_row_stats(const AttentionConfig& cfg, int head_dim) {
  switch (cfg.kind) {
    case AttentionKind::fpa:
      return 1;  // L = m + log l of c q.k
    case AttentionKind::sage:
      return sage_row_stats(cfg.sage);
    case AttentionKind::kinterval:
      return kinterval_row_stats(cfg.kinterval, head_dim);
  }
  unknown_kind(cfg.kind);
}

size_t attention_saved_bytes(const AttentionConfig& cfg, const AttentionShape& s) {
  switch (cfg.kind) {
    case AttentionKind::fpa:
      return 0;
    case AttentionKind::sage:
      return sage_saved_bytes(cfg.sage, s);
    case AttentionKind::kinterval:
      return 0;
  }
  unknown_kind(cfg.kind);
}

size_t attention_workspace_bytes(const AttentionConfig& cfg, const AttentionShape& s) {
  switch (cfg.kind) {
    case AttentionKind::fpa:
      return static_cast<size_t>(s.B) * s.H * s.T * sizeof(float);  // δ
    case AttentionKind::sage:
      return sage_workspace_bytes(cfg.sage, s);
    case AttentionKind::kinterval:
      return kinterval_workspace_bytes(cfg.kinterval, s);
  }
  unknown_kind(cfg.kind);
}

void attention_forward(const AttentionConfig& cfg, const AttentionShape& s, const bf16* qkv,
                       bf16* o, float* stats, void* saved, cudaStream_t stream,
                       PhaseRecorder* phases) {
  check_shape(s);
  switch (cfg.kind) {
    case AttentionKind::fpa:
      return fpa_forward(s, qkv, o, stats, stream, FpaKernels::automatic, phases);
    case AttentionKind::sage:
      return sage_forward(cfg.sage, s, qkv, o, stats, saved, stream, sage_default_tiles(s), phases);
    case AttentionKind::kinterval:
      return kinterval_forward(cfg.kinterval, s, qkv, o, stats, stream, FpaKernels::automatic,
                               phases);
  }
  unknown_kind(cfg.kind);
}

void attention_backward(const AttentionConfig& cfg, const AttentionShape& s, const bf16* qkv,
                        const bf16* o, const bf16* dout, const float* stats, const void* saved,
                        bf16* dqkv, void* workspace, cudaStream_t stream, PhaseRecorder* phases) {
  check_shape(s);
  switch (cfg.kind) {
    case AttentionKind::fpa:
      return fpa_backward(s, qkv, o, dout, stats, static_cast<float*>(workspace), dqkv, stream,
                          FpaKernels::automatic, phases);
    case AttentionKind::sage:
      return sage_backward(cfg.sage, s, qkv, o, dout, stats, saved, dqkv, workspace, stream,
                           sage_default_tiles(s), phases);
    case AttentionKind::kinterval:
      return kinterval_backward(cfg.kinterval, s, qkv, o, dout, stats, dqkv, workspace, stream,
                                FpaKernels::automatic, phases);
  }
  unknown_kind(cfg.kind);
}

}  // namespace qattn::cuda
