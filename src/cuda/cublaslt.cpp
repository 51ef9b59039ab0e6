#include "cublaslt.hpp"

#include <spdlog/spdlog.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "column_sum.cuh"

namespace qattn::cuda {

namespace {
constexpr size_t kWorkspaceBytes = 32u << 20;  // cuBLASLt's recommendation for Hopper

void cublas_check(cublasStatus_t s, const char* what, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("cuBLASLt error at cublaslt.cpp:") + std::to_string(line) +
                             " (" + what + "): " + cublasLtGetStatusString(s));
  }
}
#define CUBLAS_CHECK(call) cublas_check((call), #call, __LINE__)

// Largest power of two (at most 256) dividing the address: the heuristic must
// only return algorithms that accept the buffers as they are aligned.
int alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  const uintptr_t low = a & (~a + 1);
  return static_cast<int>(low < 256 ? low : 256);
}

template <typename T>
void set_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}
}  // namespace

Matmuls::Matmuls(cudaStream_t stream) : stream_(stream) {
  CUBLAS_CHECK(cublasLtCreate(&handle_));
  CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
}

Matmuls::~Matmuls() {
  for (auto& [key, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.d);
    cublasLtMatmulDescDestroy(p.desc);
  }
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

Matmuls::Plan& Matmuls::plan_for(const Gemm& g) {
  const int align_c = g.c ? alignment_of(g.c) : 256;
  const Key key{g.trans_a, g.trans_b, g.m, g.n, g.k, g.lda, g.ldb, g.d_fp32, g.c != nullptr,
                static_cast<int>(g.epilogue), alignment_of(g.a), alignment_of(g.b), align_c,
                alignment_of(g.d)};
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;

  Plan p{};
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, g.epilogue);
  if (g.aux) {
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(g.m));
  }
  if (g.epilogue == CUBLASLT_EPILOGUE_BGRADB) {
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(CUDA_R_32F));
  }
  // Stored shapes: op(A) (m, k) means A is (k, m) when transposed.
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, g.trans_a ? g.k : g.m,
                                          g.trans_a ? g.m : g.k, g.lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, g.trans_b ? g.n : g.k,
                                          g.trans_b ? g.k : g.n, g.ldb));
  CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&p.d, g.d_fp32 ? CUDA_R_32F : CUDA_R_16BF, g.m, g.n, g.m));

  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspaceBytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws, sizeof(ws)));
  const uint32_t aligns[4] = {static_cast<uint32_t>(std::get<10>(key)),
                              static_cast<uint32_t>(std::get<11>(key)),
                              static_cast<uint32_t>(std::get<12>(key)),
                              static_cast<uint32_t>(std::get<13>(key))};
  const cublasLtMatmulPreferenceAttributes_t align_attrs[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i) {
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, align_attrs[i], &aligns[i],
                                                      sizeof(uint32_t)));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, pref, 1,
                                              &result, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  p.found = found > 0;
  if (!p.found && g.epilogue == CUBLASLT_EPILOGUE_BGRADB) {  // backward_weight's column sums serve
    spdlog::warn("cuBLASLt has no algorithm with the bias-gradient epilogue for m={} n={} k={}: "
                 "the bias gradient runs as a separate column sum",
                 g.m, g.n, g.k);
  }
  p.algo = result.algo;
  return plans_.emplace(key, p).first->second;
}

void Matmuls::run(const Gemm& g) {
  Plan& p = plan_for(g);
  if (!p.found) {
    throw std::runtime_error("cuBLASLt: no algorithm for m=" + std::to_string(g.m) +
                             " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) +
                             " epilogue=" + std::to_string(static_cast<int>(g.epilogue)));
  }
  if (g.bias) set_attr(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
  if (g.aux) set_attr(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
  const float alpha = 1.0f, beta = g.c ? 1.0f : 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, g.a, p.a, g.b, p.b, &beta,
                              g.c ? g.c : g.d, p.d, g.d, p.d, &p.algo, workspace_,
                              kWorkspaceBytes, stream_));
}

// Row-major X (rows, cols) is column-major X^T (cols, rows) with ld = cols; each
// call below is written in that column-major view.

void Matmuls::forward(bf16* out, const bf16* inp, const bf16* w, const bf16* bias,
                      const bf16* residual, int N, int IC, int OC) {
  // out^T (OC, N) = w (stored (IC, OC)) ^T . inp^T (IC, N)
  run({true, false, OC, N, IC, w, IC, inp, IC, residual, out, false,
       bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, bias, nullptr});
}

void Matmuls::forward_gelu(bf16* out, bf16* pre_gelu, const bf16* inp, const bf16* w,
                           const bf16* bias, int N, int IC, int OC) {
  run({true, false, OC, N, IC, w, IC, inp, IC, nullptr, out, false,
       CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias, pre_gelu});
}

void Matmuls::backward_input(bf16* dinp, const bf16* dout, const bf16* w, const bf16* pre_gelu,
                             int N, int IC, int OC) {
  // dinp^T (IC, N) = w (stored (IC, OC)) . dout^T (OC, N)
  run({false, false, IC, N, OC, w, IC, dout, OC, nullptr, dinp, false,
       pre_gelu ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT, nullptr,
       const_cast<bf16*>(pre_gelu)});
}

void Matmuls::backward_weight(float* dw, float* dbias, const bf16* dout, const bf16* inp, int N,
                              int IC, int OC, float* scratch) {
  // dw^T (IC, OC) += inp^T (IC, N) . dout (stored (OC, N)) ^T. The bias
  // gradient is the sum of op(B) = dout over k = N: BGRADB's reduction, into
  // the (OC) fp32 vector (D's type), which the epilogue overwrites.
  Gemm g{false, true, IC, OC, N, inp, IC, dout, OC, dw, dw, true, CUBLASLT_EPILOGUE_DEFAULT,
         nullptr, nullptr};
  if (dbias) {
    Gemm with_bias = g;
    with_bias.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    with_bias.bias = scratch;
    if (plan_for(with_bias).found) {
      run(with_bias);
      add_partial_sums(dbias, scratch, 1, OC, OC, stream_);
      return;
    }
    bias_backward(dbias, dout, N, OC, scratch, stream_);
  }
  run(g);
}

}  // namespace qattn::cuda
