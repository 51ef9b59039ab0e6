// GPT-2 on the CPU: the fp32 reference model (and fp64 for gradient tests).
// Forward keeps every activation the backward needs, llm.c style.
#pragma once
#include <cstdint>
#include <vector>

#include "qattn/config.hpp"
#include "qattn/model.hpp"

namespace qattn::cpu {

template <typename F>
class Gpt2 {
 public:
  // Every layer runs a, or layer l runs per_layer[l] (model.layers entries).
  Gpt2(const ModelConfig& m, const AttentionConfig& a);
  Gpt2(const ModelConfig& m, std::vector<AttentionConfig> per_layer);
  const ParamLayout& layout() const { return layout_; }
  std::vector<F> params, grads;  // (layout.total) each

  // Mean cross-entropy over (B, T) targets; keeps activations for backward.
  F forward(const int32_t* inputs, const int32_t* targets, int B, int T);
  // Accumulates d(loss * grad_scale)/d(params) into grads. Needs forward first.
  void backward(F grad_scale);

  // Per-layer attention inputs of the last forward (after QK-norm) and its
  // output, each (B, H, T, hd), and the gradient reaching each layer's
  // attention output in the last backward (same shape): the diagnostics read
  // these.
  struct AttentionIO {
    std::vector<F> q, k, v, o, dout;
  };
  const std::vector<AttentionIO>& attention_io() const { return attn_io_; }
  // Logits of the last forward, (B, T, vocab): what sampling reads.
  const std::vector<F>& logits() const { return logits_; }

 private:
  struct LayerActs {
    std::vector<F> ln1, ln1_mean, ln1_rstd;   // (B,T,C), (B,T), (B,T)
    std::vector<F> qkv;                       // (B,T,3C)
    std::vector<F> q_raw, k_raw;              // (B,H,T,hd) before QK-norm (QK-norm on)
    std::vector<F> q_rrms, k_rrms;            // (B,H,T) QK-norm saved statistics (QK-norm on)
    std::vector<F> atty;                      // (B,T,C)
    std::vector<F> residual2;                 // (B,T,C)
    std::vector<F> ln2, ln2_mean, ln2_rstd;   // (B,T,C), (B,T), (B,T)
    std::vector<F> fch, fch_gelu;             // (B,T,4C)
    std::vector<F> residual3;                 // (B,T,C)
  };
  void resize(int B, int T);
  const F* param(int tensor, int layer = 0) const;
  F* grad(int tensor, int layer = 0);

  ModelConfig m_;
  std::vector<AttentionConfig> attention_;   // per layer
  ParamLayout layout_;
  int B_ = 0, T_ = 0;
  std::vector<int32_t> inputs_, targets_;
  std::vector<F> encoded_;                    // (B,T,C)
  std::vector<LayerActs> layers_;
  std::vector<AttentionIO> attn_io_;          // q, k, v as attention saw them
  std::vector<F> lnf_, lnf_mean_, lnf_rstd_;  // (B,T,C), (B,T), (B,T)
  std::vector<F> logits_, losses_;            // (B,T,V), (B,T)
  // Working buffers of one step, sized with the activations so that a step
  // allocates nothing.
  struct Scratch {
    std::vector<F> tmp;                       // (B,T,C) projection outputs
    std::vector<F> dlogits;                   // (B,T,V)
    std::vector<F> dlnf, dres, dln, datty;    // (B,T,C)
    std::vector<F> dfch_gelu, dfch;           // (B,T,4C)
    std::vector<F> dqkv;                      // (B,T,3C)
    std::vector<F> dq, dk, dv;                // (B,H,T,hd) attention gradients
    std::vector<F> dq_raw, dk_raw;            // (B,H,T,hd) before QK-norm (QK-norm on)
  } scratch_;
};

}  // namespace qattn::cpu
