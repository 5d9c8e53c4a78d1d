#include "kernels/cuda/matmul.cuh"

#include "kernels/cuda/detail/column_sum.cuh"
#include "kernels/cuda/detail/common.cuh"
#include "kernels/cuda/detail/gemm.cuh"

namespace ntp::cuda {

namespace {
using detail::gemm_operand;
using detail::gemm_rowmajor;
using detail::kThreads;

__global__ void bias_forward_kernel(float* out, const float* bias, long n, int OC) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x)
    out[i] += bias[i % OC];
}

// The dense layer over operand type T (float: fp32 GEMMs; __nv_bfloat16: bf16 GEMMs, operands
// cast into `scratch`). Accumulation and outputs are fp32 either way.
template <typename T>
void forward(float* out, const float* inp, const float* weight, const float* bias, int BT, int C, int OC,
             WeightLayout layout, T* scratch, cublasHandle_t handle, cudaStream_t stream) {
  if (BT <= 0 || OC <= 0) return;
  const T* x = gemm_operand(inp, long(BT) * C, scratch, stream);
  const T* w = gemm_operand(weight, long(C) * OC, scratch, stream);
  if (layout == WeightLayout::OutIn)  // out = inp @ W^T, W [OC, C]
    gemm_rowmajor(handle, false, true, BT, OC, C, 1.0f, x, C, w, C, 0.0f, out, OC);
  else  // out = inp @ W, W [C, OC]
    gemm_rowmajor(handle, false, false, BT, OC, C, 1.0f, x, C, w, OC, 0.0f, out, OC);
  if (bias != nullptr) bias_forward(out, bias, BT, OC, stream);
}

template <typename T>
void backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
              int BT, int C, int OC, WeightLayout layout, float* bias_scratch, T* scratch, cublasHandle_t handle,
              cudaStream_t stream) {
  if (BT <= 0 || OC <= 0 || C <= 0) return;
  const T* g = gemm_operand(dout, long(BT) * OC, scratch, stream);
  const T* x = gemm_operand(inp, long(BT) * C, scratch, stream);
  const T* w = dinp != nullptr ? gemm_operand(weight, long(C) * OC, scratch, stream) : nullptr;
  if (layout == WeightLayout::OutIn) {
    // dinp [BT, C] += dout [BT, OC] @ W [OC, C];  dW [OC, C] += dout^T @ inp
    if (dinp != nullptr) gemm_rowmajor(handle, false, false, BT, C, OC, 1.0f, g, OC, w, C, 1.0f, dinp, C);
    gemm_rowmajor(handle, true, false, OC, C, BT, 1.0f, g, OC, x, C, 1.0f, dweight, C);
  } else {
    // dinp [BT, C] += dout @ W^T, W [C, OC];  dW [C, OC] += inp^T @ dout
    if (dinp != nullptr) gemm_rowmajor(handle, false, true, BT, C, OC, 1.0f, g, OC, w, OC, 1.0f, dinp, C);
    gemm_rowmajor(handle, true, false, C, OC, BT, 1.0f, x, C, g, OC, 1.0f, dweight, OC);
  }
  if (dbias != nullptr) bias_backward(dbias, dout, BT, OC, bias_scratch, stream);
}

}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int BT, int C, int OC,
                    WeightLayout layout, cublasHandle_t handle, cudaStream_t stream) {
  float* no_scratch = nullptr;  // fp32 GEMMs read the buffers themselves
  forward(out, inp, weight, bias, BT, C, OC, layout, no_scratch, handle, stream);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int BT, int C, int OC, WeightLayout layout, float* scratch,
                     cublasHandle_t handle, cudaStream_t stream) {
  float* no_scratch = nullptr;
  backward(dinp, dweight, dbias, dout, inp, weight, BT, C, OC, layout, scratch, no_scratch, handle, stream);
}

std::size_t matmul_bf16_scratch(int BT, int C, int OC) {
  using detail::operand_elems;
  return operand_elems(std::size_t(BT) * C) + operand_elems(std::size_t(C) * OC) + operand_elems(std::size_t(BT) * OC);
}

void matmul_forward_bf16(float* out, const float* inp, const float* weight, const float* bias, int BT, int C, int OC,
                         WeightLayout layout, __nv_bfloat16* bf16_scratch, cublasHandle_t handle, cudaStream_t stream) {
  forward(out, inp, weight, bias, BT, C, OC, layout, bf16_scratch, handle, stream);
}

void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, int BT, int C, int OC, WeightLayout layout, float* scratch,
                          __nv_bfloat16* bf16_scratch, cublasHandle_t handle, cudaStream_t stream) {
  backward(dinp, dweight, dbias, dout, inp, weight, BT, C, OC, layout, scratch, bf16_scratch, handle, stream);
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
