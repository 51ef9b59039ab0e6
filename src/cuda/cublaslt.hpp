// Every dense matmul of the model through cuBLASLt: bf16 operands, fp32
// accumulation, fused epilogues (bias, residual add through C, GELU with the
// pre-activation saved, GELU backward, bias gradient). One handle and one
// workspace for the backend's lifetime; descriptors and the heuristic's
// algorithm are cached per shape (and pointer alignment), so a step does no
// planning after the first.
#pragma once
#include <cublasLt.h>

#include <map>
#include <tuple>

#include "common.cuh"

namespace qattn::cuda {

class Matmuls {
 public:
  explicit Matmuls(cudaStream_t stream);
  ~Matmuls();
  Matmuls(const Matmuls&) = delete;
  Matmuls& operator=(const Matmuls&) = delete;

  // out (N, OC) = inp (N, IC) . w (OC, IC)^T + bias (OC) + residual (N, OC).
  // bias and residual may be null.
  void forward(bf16* out, const bf16* inp, const bf16* w, const bf16* bias, const bf16* residual,
               int N, int IC, int OC);
  // pre_gelu (N, OC) = inp . w^T + bias; out (N, OC) = gelu(pre_gelu) (tanh form).
  void forward_gelu(bf16* out, bf16* pre_gelu, const bf16* inp, const bf16* w, const bf16* bias,
                    int N, int IC, int OC);
  // dinp (N, IC) = dout (N, OC) . w (OC, IC); when pre_gelu (N, IC) is given the
  // result is multiplied by gelu'(pre_gelu): the gradient before the GELU.
  void backward_input(bf16* dinp, const bf16* dout, const bf16* w, const bf16* pre_gelu, int N,
                      int IC, int OC);
  // dw (OC, IC) fp32 += dout (N, OC)^T . inp (N, IC). When dbias is given,
  // also dbias (OC) fp32 += the column sums of dout, from the matmul's
  // bias-gradient epilogue (which writes them into scratch, then a small kernel
  // adds them), or from column_sum's kernels where cuBLASLt has no algorithm
  // with that epilogue for the shape. scratch: bias_backward_scratch_floats(N, OC)
  // floats (column_sum.cuh); null without dbias.
  void backward_weight(float* dw, float* dbias, const bf16* dout, const bf16* inp, int N, int IC,
                       int OC, float* scratch);

 private:
  // Column-major D (m, n) = op(A) (m, k) . op(B) (k, n) + beta C, C laid out as D.
  struct Gemm {
    bool trans_a, trans_b;
    int m, n, k;
    const bf16* a;
    int lda;
    const bf16* b;
    int ldb;
    const void* c;  // null: beta = 0
    void* d;
    bool d_fp32;
    cublasLtEpilogue_t epilogue;
    const void* bias;  // (m) input, or (n) fp32 output of the bias-gradient epilogue
    void* aux;         // (m, n) GELU pre-activation, ld m
  };
  using Key = std::tuple<bool, bool, int, int, int, int, int, bool, bool, int, int, int, int, int>;
  struct Plan {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;  // C shares D's layout
    cublasLtMatmulAlgo_t algo;
    bool found;  // the heuristic returned an algorithm
  };
  void run(const Gemm& g);
  Plan& plan_for(const Gemm& g);  // cached, including a shape with no algorithm

  cudaStream_t stream_;
  cublasLtHandle_t handle_;
  void* workspace_;
  std::map<Key, Plan> plans_;
};

}  // namespace qattn::cuda
