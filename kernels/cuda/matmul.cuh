#pragma once
// Dense layer through cuBLAS (fp32, cublasSgemm); contracts as kernels/cpu/matmul.hpp. inp is
// [BT, C], out [BT, OC], all row-major device buffers. cuBLAS is column-major: a row-major
// [R, K] buffer is the column-major [K, R] matrix, so each product is computed transposed
// (C^T = B^T A^T). `handle` must already be bound to `stream` (cublasSetStream).
// The _bf16 twins (--precision bf16) run the same products on bf16 operands (cublasGemmEx).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cpu/matmul.hpp"

namespace ntp::cuda {

using WeightLayout = cpu::WeightLayout;

// out = inp @ W (+ bias[OC] when bias != nullptr). Overwrites out.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int BT, int C, int OC,
                    WeightLayout layout, cublasHandle_t handle, cudaStream_t stream);
// Accumulates (+=): dinp [BT, C] (skipped if nullptr), dweight (layout of weight), dbias [OC]
// (skipped if nullptr; reduced through `scratch`, bias_backward_scratch(BT, OC) floats).
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int BT, int C, int OC, WeightLayout layout, float* scratch,
                     cublasHandle_t handle, cudaStream_t stream);

// As matmul_forward/matmul_backward, with bf16 GEMM operands and fp32 accumulation and results:
// inp, weight and dout are cast to bf16 into `bf16_scratch` (matmul_bf16_scratch(BT, C, OC)
// elements, overwritten) before each call's GEMMs, and out, dinp, dweight and dbias stay fp32.
// Autocast-style: the fp32 buffers (the master weights among them) are the source of truth and
// the bf16 copies last one call, so the optimizer and every other kernel see fp32 only.
void matmul_forward_bf16(float* out, const float* inp, const float* weight, const float* bias, int BT, int C, int OC,
                         WeightLayout layout, __nv_bfloat16* bf16_scratch, cublasHandle_t handle, cudaStream_t stream);
void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, int BT, int C, int OC, WeightLayout layout, float* scratch,
                          __nv_bfloat16* bf16_scratch, cublasHandle_t handle, cudaStream_t stream);
std::size_t matmul_bf16_scratch(int BT, int C, int OC);

// out[bt, :] += bias[:]
void bias_forward(float* out, const float* bias, int BT, int OC, cudaStream_t stream);
// dbias[:] += sum_bt dout[bt, :]  (deterministic, through `scratch`)
void bias_backward(float* dbias, const float* dout, int BT, int OC, float* scratch, cudaStream_t stream);
std::size_t bias_backward_scratch(int BT, int OC);

}  // namespace ntp::cuda
