#include "kernels/cuda/swiglu.cuh"

#include "kernels/cuda/detail/common.cuh"

namespace ntp::cuda {

namespace {
using detail::kThreads;

__global__ void forward_kernel(float* out, const float* gate, const float* up, long n) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) {
    const float x = gate[i];
    out[i] = x / (1.0f + expf(-x)) * up[i];
  }
}

__global__ void backward_kernel(float* dgate, float* dup, const float* gate, const float* up, const float* dout,
                                long n) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) {
    const float x = gate[i];
    const float sig = 1.0f / (1.0f + expf(-x));
    dgate[i] += dout[i] * up[i] * sig * (1.0f + x * (1.0f - sig));
    dup[i] += dout[i] * x * sig;
  }
}
}  // namespace

void swiglu_forward(float* out, const float* gate, const float* up, long N, cudaStream_t stream) {
  if (N <= 0) return;
  forward_kernel<<<detail::grid_for(N), kThreads, 0, stream>>>(out, gate, up, N);
  NTP_CUDA_LAUNCHED();
}

void swiglu_backward(float* dgate, float* dup, const float* gate, const float* up, const float* dout, long N,
                     cudaStream_t stream) {
  if (N <= 0) return;
  backward_kernel<<<detail::grid_for(N), kThreads, 0, stream>>>(dgate, dup, gate, up, dout, N);
  NTP_CUDA_LAUNCHED();
}

}  // namespace ntp::cuda
