#include "kernels/cuda/adamw.cuh"

#include <cmath>

#include "kernels/cuda/detail/common.cuh"

namespace ntp::cuda {

namespace {
using detail::kThreads;
constexpr int kPartials = 1024;  // blocks of the first sum_squares stage (fixed: determinism)

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, long n, float lr, float beta1,
                             float beta2, float eps, float wd, float scale, float bc1, float bc2) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) {
    const float gi = g[i] * scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * p[i]);
  }
}

// Block b sums x[i]^2 over i = b*kThreads + threadIdx.x + k*kPartials*kThreads.
__global__ void sumsq_partials_kernel(double* partials, const float* x, long n) {
  __shared__ double shared[32];
  double s = 0.0;
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) {
    const double xi = x[i];
    s += xi * xi;
  }
  s = detail::block_sum(s, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void sumsq_final_kernel(double* out, const double* partials, int count) {
  __shared__ double shared[32];
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
  s = detail::block_sum(s, shared);
  if (threadIdx.x == 0) *out = s;
}
}  // namespace

void adamw_update(float* params, const float* grads, float* m, float* v, long n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, float grad_scale, int t, cudaStream_t stream) {
  if (n <= 0) return;
  // Bias corrections computed on the host exactly as the CPU kernel does (float pow).
  const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(t));
  const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(t));
  adamw_kernel<<<detail::grid_for(n), kThreads, 0, stream>>>(params, grads, m, v, n, lr, beta1, beta2, eps,
                                                             weight_decay, grad_scale, bc1, bc2);
  NTP_CUDA_LAUNCHED();
}

std::size_t sum_squares_scratch() { return kPartials + 1; }

double sum_squares(const float* x, long n, double* scratch, cudaStream_t stream) {
  if (n <= 0) return 0.0;
  sumsq_partials_kernel<<<kPartials, kThreads, 0, stream>>>(scratch + 1, x, n);
  NTP_CUDA_LAUNCHED();
  sumsq_final_kernel<<<1, kThreads, 0, stream>>>(scratch, scratch + 1, kPartials);
  NTP_CUDA_LAUNCHED();
  double result = 0.0;
  NTP_CUDA_CHECK(cudaMemcpyAsync(&result, scratch, sizeof(double), cudaMemcpyDeviceToHost, stream));
  NTP_CUDA_CHECK(cudaStreamSynchronize(stream));
  return result;
}

}  // namespace ntp::cuda
