#include "adamw.cuh"

namespace qattn::cuda {

__global__ void adamw_kernel(bf16* params, float* master, float* m, float* v, const float* grads,
                             size_t n, AdamWArgs a) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = grads[i] * a.grad_mult;
  const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * g;
  const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * g * g;
  m[i] = mi;
  v[i] = vi;
  const float m_hat = mi / a.bias_correction1, v_hat = vi / a.bias_correction2;
  const float w = master[i] - a.lr * (m_hat / (sqrtf(v_hat) + a.eps) + a.weight_decay * master[i]);
  master[i] = w;
  params[i] = __float2bfloat16(w);
}

__global__ void copy_master_kernel(bf16* params, const float* master, size_t n) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) params[i] = __float2bfloat16(master[i]);
}

void adamw_update(bf16* params, float* master, float* m, float* v, const float* grads, size_t n,
                  const AdamWArgs& a, cudaStream_t stream) {
  if (n == 0) return;
  adamw_kernel<<<ceil_div(static_cast<long long>(n), 512), 512, 0, stream>>>(params, master, m, v,
                                                                            grads, n, a);
  CUDA_CHECK_LAUNCH();
}

void copy_master_to_params(bf16* params, const float* master, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  copy_master_kernel<<<ceil_div(static_cast<long long>(n), 512), 512, 0, stream>>>(params, master,
                                                                                  n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace qattn::cuda
