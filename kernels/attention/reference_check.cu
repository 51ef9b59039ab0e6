// Host code only: the CPU reference of one head and the error sums against it.
#include <algorithm>
#include <cmath>

#include "attention/reference_check.hpp"
#include "qattn/cpu/attention.hpp"

namespace qattn::cuda {

std::vector<double> head_slice(const std::vector<__nv_bfloat16>& x, const AttentionShape& s,
                               int nslots, int slot, int b, int h) {
  std::vector<double> out(static_cast<size_t>(s.T) * s.d);
  for (int t = 0; t < s.T; ++t)
    for (int k = 0; k < s.d; ++k)
      out[static_cast<size_t>(t) * s.d + k] = __bfloat162float(
          x[(((static_cast<size_t>(b) * s.T + t) * nslots + slot) * s.H + h) * s.d + k]);
  return out;
}

namespace {

// L_i = log sum_{j <= i} exp(c q_i.k_j).
std::vector<double> reference_lse(int T, int d, const std::vector<double>& q,
                                  const std::vector<double>& k) {
  const double c = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> lse(T), s(T);
  for (int i = 0; i < T; ++i) {
    double m = -INFINITY;
    for (int j = 0; j <= i; ++j) {
      double dot = 0;
      for (int x = 0; x < d; ++x)
        dot += q[static_cast<size_t>(i) * d + x] * k[static_cast<size_t>(j) * d + x];
      s[j] = c * dot;
      m = std::max(m, s[j]);
    }
    double sum = 0;
    for (int j = 0; j <= i; ++j) sum += std::exp(s[j] - m);
    lse[i] = m + std::log(sum);
  }
  return lse;
}

void accumulate(const std::vector<double>& x, const std::vector<double>& ref, double& err,
                double& ref_sq) {
  for (size_t i = 0; i < x.size(); ++i) {
    err += (x[i] - ref[i]) * (x[i] - ref[i]);
    ref_sq += ref[i] * ref[i];
  }
}

}  // namespace

void AttentionErrorSums::add(const AttentionErrorSums& o) {
  err_o += o.err_o, ref_o += o.ref_o, err_lse += o.err_lse, ref_lse += o.ref_lse;
  err_dq += o.err_dq, ref_dq += o.ref_dq, err_dk += o.err_dk, ref_dk += o.ref_dk;
  err_dv += o.err_dv, ref_dv += o.ref_dv;
}

AttentionErrors relative_errors(const AttentionErrorSums& s) {
  return {std::sqrt(s.err_o / s.ref_o), std::sqrt(s.err_lse / s.ref_lse),
          std::sqrt(s.err_dq / s.ref_dq), std::sqrt(s.err_dk / s.ref_dk),
          std::sqrt(s.err_dv / s.ref_dv)};
}

AttentionErrorSums compare_head_with_cpu(const AttentionConfig& cfg, const AttentionShape& s, int b,
                                         int h, const std::vector<__nv_bfloat16>& qkv,
                                         const std::vector<__nv_bfloat16>& dout,
                                         const std::vector<__nv_bfloat16>& o,
                                         const std::vector<__nv_bfloat16>& dqkv, const float* lse) {
  const auto q = head_slice(qkv, s, 3, 0, b, h), k = head_slice(qkv, s, 3, 1, b, h),
             v = head_slice(qkv, s, 3, 2, b, h), dy = head_slice(dout, s, 1, 0, b, h);
  const size_t n = static_cast<size_t>(s.T) * s.d;
  std::vector<double> ref_o(n), ref_dq(n), ref_dk(n), ref_dv(n);
  cpu::attention_forward(cfg, s.T, s.d, q.data(), k.data(), v.data(), ref_o.data());
  cpu::attention_backward(cfg, s.T, s.d, q.data(), k.data(), v.data(), ref_o.data(), dy.data(),
                          ref_dq.data(), ref_dk.data(), ref_dv.data());
  AttentionErrorSums e;
  accumulate(head_slice(o, s, 1, 0, b, h), ref_o, e.err_o, e.ref_o);
  accumulate(head_slice(dqkv, s, 3, 0, b, h), ref_dq, e.err_dq, e.ref_dq);
  accumulate(head_slice(dqkv, s, 3, 1, b, h), ref_dk, e.err_dk, e.ref_dk);
  accumulate(head_slice(dqkv, s, 3, 2, b, h), ref_dv, e.err_dv, e.ref_dv);
  if (lse != nullptr) {
    const float* row = lse + (static_cast<size_t>(b) * s.H + h) * s.T;
    accumulate(std::vector<double>(row, row + s.T), reference_lse(s.T, s.d, q, k), e.err_lse,
               e.ref_lse);
  }
  return e;
}

}  // namespace qattn::cuda
