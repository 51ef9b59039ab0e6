// GPT-2 forward and backward on the CPU, composed from src/cpu/ops.cpp and the
// attention reference (src/cpu/attention/). Reads top to bottom like the model:
// encoder -> L x [LN -> QKV -> (QK-norm) -> attention -> proj -> residual ->
// LN -> MLP -> residual] -> LN -> tied head -> cross-entropy.
#include "qattn/cpu/gpt2.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "qattn/cpu/attention.hpp"
#include "qattn/cpu/ops.hpp"

namespace qattn::cpu {

namespace {

// Rows of `stride` channels (B,T,stride), columns [offset, offset + C) <-> x (B,H,T,hd).
// q, k, v are the offsets 0, C, 2C of qkv (B,T,3C).
template <typename F>
void split_heads(F* x, const F* rows, int B, int T, int H, int hd, int stride, int offset) {
#pragma omp parallel for collapse(2)
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < T; ++t)
        for (int i = 0; i < hd; ++i)
          x[((static_cast<size_t>(b) * H + h) * T + t) * hd + i] =
              rows[(static_cast<size_t>(b) * T + t) * stride + offset + h * hd + i];
}

template <typename F>
void merge_heads(F* out, const F* x, int B, int T, int H, int hd, int stride, int offset) {
#pragma omp parallel for collapse(2)
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < T; ++t)
        for (int i = 0; i < hd; ++i)
          out[(static_cast<size_t>(b) * T + t) * stride + offset + h * hd + i] =
              x[((static_cast<size_t>(b) * H + h) * T + t) * hd + i];
}

}  // namespace

template <typename F>
Gpt2<F>::Gpt2(const ModelConfig& m, const AttentionConfig& a)
    : Gpt2(m, std::vector<AttentionConfig>(static_cast<size_t>(m.layers), a)) {}

template <typename F>
Gpt2<F>::Gpt2(const ModelConfig& m, std::vector<AttentionConfig> per_layer)
    : m_(m), attention_(std::move(per_layer)), layout_(m) {
  if (attention_.size() != static_cast<size_t>(m.layers))
    throw std::invalid_argument("cpu::Gpt2: " + std::to_string(attention_.size()) + " attention configs for " +
                                std::to_string(m.layers) + " layers");
  params.assign(layout_.total, F(0));
  grads.assign(layout_.total, F(0));
}

template <typename F>
const F* Gpt2<F>::param(int tensor, int layer) const {
  // Per-layer tensors are stacked (L, ...); the others ignore `layer`.
  const size_t per_layer = ParamLayout::layered(tensor) ? layout_.size[tensor] / m_.layers : 0;
  return params.data() + layout_.offset[tensor] + layer * per_layer;
}

template <typename F>
F* Gpt2<F>::grad(int tensor, int layer) {
  return grads.data() + (param(tensor, layer) - params.data());
}

template <typename F>
void Gpt2<F>::resize(int B, int T) {
  if (B == B_ && T == T_) return;
  B_ = B;
  T_ = T;
  const size_t BT = static_cast<size_t>(B) * T, C = m_.dim, BHT = BT * m_.heads;
  encoded_.resize(BT * C);
  layers_.assign(m_.layers, {});
  attn_io_.assign(m_.layers, {});
  for (int l = 0; l < m_.layers; ++l) {
    auto& a = layers_[l];
    a.ln1.resize(BT * C), a.ln1_mean.resize(BT), a.ln1_rstd.resize(BT);
    a.qkv.resize(BT * 3 * C);
    if (m_.qk_norm.on()) a.q_raw.resize(BT * C), a.k_raw.resize(BT * C), a.q_rrms.resize(BHT), a.k_rrms.resize(BHT);
    a.atty.resize(BT * C), a.residual2.resize(BT * C);
    a.ln2.resize(BT * C), a.ln2_mean.resize(BT), a.ln2_rstd.resize(BT);
    a.fch.resize(BT * 4 * C), a.fch_gelu.resize(BT * 4 * C), a.residual3.resize(BT * C);
    auto& io = attn_io_[l];
    io.q.resize(BT * C), io.k.resize(BT * C), io.v.resize(BT * C), io.o.resize(BT * C), io.dout.resize(BT * C);
  }
  lnf_.resize(BT * C), lnf_mean_.resize(BT), lnf_rstd_.resize(BT);
  logits_.resize(BT * m_.vocab), losses_.resize(BT);
  Scratch& g = scratch_;
  g.tmp.resize(BT * C), g.dlogits.resize(BT * m_.vocab), g.dlnf.resize(BT * C), g.dres.resize(BT * C);
  g.dfch_gelu.resize(4 * BT * C), g.dfch.resize(4 * BT * C), g.dln.resize(BT * C), g.datty.resize(BT * C);
  g.dqkv.resize(3 * BT * C), g.dq.resize(BT * C), g.dk.resize(BT * C), g.dv.resize(BT * C);
  if (m_.qk_norm.on()) g.dq_raw.resize(BT * C), g.dk_raw.resize(BT * C);
}

template <typename F>
F Gpt2<F>::forward(const int32_t* inputs, const int32_t* targets, int B, int T) {
  resize(B, T);
  inputs_.assign(inputs, inputs + static_cast<size_t>(B) * T);
  targets_.assign(targets, targets + static_cast<size_t>(B) * T);
  const int C = m_.dim, H = m_.heads, hd = m_.head_dim(), N = B * T;
  std::vector<F>& tmp = scratch_.tmp;  // (B,T,C) projection outputs

  encoder_forward(encoded_.data(), inputs, param(P_WTE), param(P_WPE), B, T, C);
  for (int l = 0; l < m_.layers; ++l) {
    auto& a = layers_[l];
    auto& io = attn_io_[l];
    const F* residual = l == 0 ? encoded_.data() : layers_[l - 1].residual3.data();
    layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), residual,
                      param(P_LN1W, l), param(P_LN1B, l), N, C);
    matmul_forward(a.qkv.data(), a.ln1.data(), param(P_QKVW, l), param(P_QKVB, l), N, C, 3 * C);
    // Without QK-norm, q and k go straight to what attention reads.
    F* q_split = m_.qk_norm.on() ? a.q_raw.data() : io.q.data();
    F* k_split = m_.qk_norm.on() ? a.k_raw.data() : io.k.data();
    split_heads(q_split, a.qkv.data(), B, T, H, hd, 3 * C, 0);
    split_heads(k_split, a.qkv.data(), B, T, H, hd, 3 * C, C);
    split_heads(io.v.data(), a.qkv.data(), B, T, H, hd, 3 * C, 2 * C);
    if (m_.qk_norm.form == QkNormForm::gain) {
      qk_norm_forward(io.q.data(), a.q_rrms.data(), a.q_raw.data(), param(P_QGAMMA, l), B * H * T, hd);
      qk_norm_forward(io.k.data(), a.k_rrms.data(), a.k_raw.data(), param(P_KGAMMA, l), B * H * T, hd);
    } else if (m_.qk_norm.form == QkNormForm::logit_scale) {
      qk_logit_scale_forward(io.q.data(), io.k.data(), a.q_rrms.data(), a.k_rrms.data(), a.q_raw.data(),
                             a.k_raw.data(), param(P_QKSCALE, l), B, H, T, hd);
    }
#pragma omp parallel for
    for (int bh = 0; bh < B * H; ++bh) {
      const size_t o = static_cast<size_t>(bh) * T * hd;  // one (b, h): (T, hd)
      attention_forward(attention_[l], T, hd, io.q.data() + o, io.k.data() + o, io.v.data() + o, io.o.data() + o);
    }
    merge_heads(a.atty.data(), io.o.data(), B, T, H, hd, C, 0);
    matmul_forward(tmp.data(), a.atty.data(), param(P_ATTPROJW, l), param(P_ATTPROJB, l), N, C, C);
    residual_forward(a.residual2.data(), residual, tmp.data(), tmp.size());
    layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.residual2.data(),
                      param(P_LN2W, l), param(P_LN2B, l), N, C);
    matmul_forward(a.fch.data(), a.ln2.data(), param(P_FCW, l), param(P_FCB, l), N, C, 4 * C);
    gelu_forward(a.fch_gelu.data(), a.fch.data(), a.fch.size());
    matmul_forward(tmp.data(), a.fch_gelu.data(), param(P_FCPROJW, l), param(P_FCPROJB, l), N, 4 * C, C);
    residual_forward(a.residual3.data(), a.residual2.data(), tmp.data(), tmp.size());
  }
  const F* last = m_.layers ? layers_.back().residual3.data() : encoded_.data();
  layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), last, param(P_LNFW),
                    param(P_LNFB), N, C);
  matmul_forward(logits_.data(), lnf_.data(), param(P_WTE), static_cast<const F*>(nullptr), N, C, m_.vocab);
  return crossentropy_forward(losses_.data(), logits_.data(), targets, N, m_.vocab);
}

template <typename F>
void Gpt2<F>::backward(F grad_scale) {
  const int B = B_, T = T_, C = m_.dim, H = m_.heads, hd = m_.head_dim(), N = B * T, V = m_.vocab;
  Scratch& g = scratch_;  // sized by resize(); the accumulating ones are zeroed before use
  auto &dlogits = g.dlogits, &dlnf = g.dlnf, &dres = g.dres, &dfch_gelu = g.dfch_gelu, &dfch = g.dfch;
  auto &dln = g.dln, &datty = g.datty, &dqkv = g.dqkv, &dq = g.dq, &dk = g.dk, &dv = g.dv;
  crossentropy_backward(dlogits.data(), logits_.data(), targets_.data(), grad_scale / N, N, V);
  std::fill(dlnf.begin(), dlnf.end(), F(0));
  std::fill(dres.begin(), dres.end(), F(0));
  matmul_backward(dlnf.data(), grad(P_WTE), static_cast<F*>(nullptr), dlogits.data(), lnf_.data(),
                  param(P_WTE), N, C, V);
  const F* last = m_.layers ? layers_.back().residual3.data() : encoded_.data();
  layernorm_backward(dres.data(), grad(P_LNFW), grad(P_LNFB), dlnf.data(), last, param(P_LNFW),
                     lnf_mean_.data(), lnf_rstd_.data(), N, C);

  for (int l = m_.layers - 1; l >= 0; --l) {
    auto& a = layers_[l];
    auto& io = attn_io_[l];
    const F* residual = l == 0 ? encoded_.data() : layers_[l - 1].residual3.data();
    // residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))); dres holds d residual3.
    std::fill(dfch_gelu.begin(), dfch_gelu.end(), F(0));
    matmul_backward(dfch_gelu.data(), grad(P_FCPROJW, l), grad(P_FCPROJB, l), dres.data(),
                    a.fch_gelu.data(), param(P_FCPROJW, l), N, 4 * C, C);
    std::fill(dfch.begin(), dfch.end(), F(0));
    gelu_backward(dfch.data(), a.fch.data(), dfch_gelu.data(), dfch.size());
    std::fill(dln.begin(), dln.end(), F(0));
    matmul_backward(dln.data(), grad(P_FCW, l), grad(P_FCB, l), dfch.data(), a.ln2.data(),
                    param(P_FCW, l), N, C, 4 * C);
    layernorm_backward(dres.data(), grad(P_LN2W, l), grad(P_LN2B, l), dln.data(), a.residual2.data(),
                       param(P_LN2W, l), a.ln2_mean.data(), a.ln2_rstd.data(), N, C);
    // residual2 = residual + attproj(attention(...)); dres now holds d residual2.
    std::fill(datty.begin(), datty.end(), F(0));
    matmul_backward(datty.data(), grad(P_ATTPROJW, l), grad(P_ATTPROJB, l), dres.data(),
                    a.atty.data(), param(P_ATTPROJW, l), N, C, C);
    split_heads(io.dout.data(), datty.data(), B, T, H, hd, C, 0);
#pragma omp parallel for
    for (int bh = 0; bh < B * H; ++bh) {
      const size_t o = static_cast<size_t>(bh) * T * hd;
      attention_backward(attention_[l], T, hd, io.q.data() + o, io.k.data() + o, io.v.data() + o,
                         io.o.data() + o, io.dout.data() + o, dq.data() + o, dk.data() + o,
                         dv.data() + o);
    }
    if (m_.qk_norm.on()) {  // back through QK-norm to the projection's q and k
      std::fill(g.dq_raw.begin(), g.dq_raw.end(), F(0));
      std::fill(g.dk_raw.begin(), g.dk_raw.end(), F(0));
    }
    if (m_.qk_norm.form == QkNormForm::gain) {
      qk_norm_backward(g.dq_raw.data(), grad(P_QGAMMA, l), dq.data(), a.q_raw.data(),
                       param(P_QGAMMA, l), a.q_rrms.data(), B * H * T, hd);
      qk_norm_backward(g.dk_raw.data(), grad(P_KGAMMA, l), dk.data(), a.k_raw.data(),
                       param(P_KGAMMA, l), a.k_rrms.data(), B * H * T, hd);
    } else if (m_.qk_norm.form == QkNormForm::logit_scale) {
      qk_logit_scale_backward(g.dq_raw.data(), g.dk_raw.data(), grad(P_QKSCALE, l), dq.data(), dk.data(),
                              a.q_raw.data(), a.k_raw.data(), param(P_QKSCALE, l), a.q_rrms.data(),
                              a.k_rrms.data(), B, H, T, hd);
    }
    merge_heads(dqkv.data(), (m_.qk_norm.on() ? g.dq_raw : dq).data(), B, T, H, hd, 3 * C, 0);
    merge_heads(dqkv.data(), (m_.qk_norm.on() ? g.dk_raw : dk).data(), B, T, H, hd, 3 * C, C);
    merge_heads(dqkv.data(), dv.data(), B, T, H, hd, 3 * C, 2 * C);
    std::fill(dln.begin(), dln.end(), F(0));
    matmul_backward(dln.data(), grad(P_QKVW, l), grad(P_QKVB, l), dqkv.data(), a.ln1.data(),
                    param(P_QKVW, l), N, C, 3 * C);
    layernorm_backward(dres.data(), grad(P_LN1W, l), grad(P_LN1B, l), dln.data(), residual,
                       param(P_LN1W, l), a.ln1_mean.data(), a.ln1_rstd.data(), N, C);
    // dres now holds d residual (the input of layer l).
  }
  encoder_backward(grad(P_WTE), grad(P_WPE), dres.data(), inputs_.data(), B, T, C);
}

template class Gpt2<float>;
template class Gpt2<double>;

}  // namespace qattn::cpu
