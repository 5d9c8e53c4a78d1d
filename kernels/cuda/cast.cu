#include "kernels/cuda/cast.cuh"

#include "kernels/cuda/detail/common.cuh"

namespace ntp::cuda {

namespace {
using detail::kThreads;

__global__ void to_bf16_kernel(__nv_bfloat16* out, const float* in, long n) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(in[i]);
}
}  // namespace

void cast_to_bf16(__nv_bfloat16* out, const float* in, long N, cudaStream_t stream) {
  if (N <= 0) return;
  to_bf16_kernel<<<detail::grid_for(N), kThreads, 0, stream>>>(out, in, N);
  NTP_CUDA_LAUNCHED();
}

}  // namespace ntp::cuda
