#include "kernels/cuda/matmul.cuh"

#include "kernels/cuda/detail/column_sum.cuh"
#include "kernels/cuda/detail/common.cuh"
#include "kernels/cuda/detail/gemm.cuh"

namespace ntp::cuda {

namespace {
using detail::gemm_rowmajor;
using detail::kThreads;

__global__ void bias_forward_kernel(float* out, const float* bias, long n, int OC) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x)
    out[i] += bias[i % OC];
}

}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int BT, int C, int OC,
                    WeightLayout layout, cublasHandle_t handle, cudaStream_t stream) {
  if (BT <= 0 || OC <= 0) return;
  if (layout == WeightLayout::OutIn)  // out = inp @ W^T, W [OC, C]
    gemm_rowmajor(handle, false, true, BT, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
  else  // out = inp @ W, W [C, OC]
    gemm_rowmajor(handle, false, false, BT, OC, C, 1.0f, inp, C, weight, OC, 0.0f, out, OC);
  if (bias != nullptr) bias_forward(out, bias, BT, OC, stream);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int BT, int C, int OC, WeightLayout layout, float* scratch,
                     cublasHandle_t handle, cudaStream_t stream) {
  if (BT <= 0 || OC <= 0 || C <= 0) return;
  if (layout == WeightLayout::OutIn) {
    // dinp [BT, C] += dout [BT, OC] @ W [OC, C];  dW [OC, C] += dout^T @ inp
    if (dinp != nullptr) gemm_rowmajor(handle, false, false, BT, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
    gemm_rowmajor(handle, true, false, OC, C, BT, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  } else {
    // dinp [BT, C] += dout @ W^T, W [C, OC];  dW [C, OC] += inp^T @ dout
    if (dinp != nullptr) gemm_rowmajor(handle, false, true, BT, C, OC, 1.0f, dout, OC, weight, OC, 1.0f, dinp, C);
    gemm_rowmajor(handle, true, false, C, OC, BT, 1.0f, inp, C, dout, OC, 1.0f, dweight, OC);
  }
  if (dbias != nullptr) bias_backward(dbias, dout, BT, OC, scratch, stream);
}

void bias_forward(float* out, const float* bias, int BT, int OC, cudaStream_t stream) {
  const long n = long(BT) * OC;
  if (n <= 0) return;
  bias_forward_kernel<<<detail::grid_for(n), kThreads, 0, stream>>>(out, bias, n, OC);
  NTP_CUDA_LAUNCHED();
}

std::size_t bias_backward_scratch(int BT, int OC) { return detail::column_sum_scratch(BT, OC); }

void bias_backward(float* dbias, const float* dout, int BT, int OC, float* scratch, cudaStream_t stream) {
  detail::column_sum_add(dbias, dout, BT, OC, scratch, stream);
}

}  // namespace ntp::cuda
