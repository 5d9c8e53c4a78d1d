#include "kernels/cuda/gelu.cuh"

#include "kernels/cuda/detail/common.cuh"

namespace ntp::cuda {

namespace {
using detail::kThreads;
constexpr float kScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kCubic = 0.044715f;

__global__ void forward_kernel(float* out, const float* inp, long n) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanhf(kScale * (x + kCubic * x * x * x)));
  }
}

__global__ void backward_kernel(float* dinp, const float* inp, const float* dout, long n) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) {
    const float x = inp[i];
    const float th = tanhf(kScale * (x + kCubic * x * x * x));
    const float sech2 = 1.0f - th * th;  // as the CPU kernel: no coshf overflow for large |x|
    const float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * kScale * (1.0f + 3.0f * kCubic * x * x);
    dinp[i] += grad * dout[i];
  }
}
}  // namespace

void gelu_forward(float* out, const float* inp, long N, cudaStream_t stream) {
  if (N <= 0) return;
  forward_kernel<<<detail::grid_for(N), kThreads, 0, stream>>>(out, inp, N);
  NTP_CUDA_LAUNCHED();
}

void gelu_backward(float* dinp, const float* inp, const float* dout, long N, cudaStream_t stream) {
  if (N <= 0) return;
  backward_kernel<<<detail::grid_for(N), kThreads, 0, stream>>>(dinp, inp, dout, N);
  NTP_CUDA_LAUNCHED();
}

}  // namespace ntp::cuda
