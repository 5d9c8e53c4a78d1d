#pragma once
// Causal multi-head self-attention on the GPU; contracts as kernels/cpu/attention.hpp:
// qkv [B, T, NH, 3, HS] (per head: its Q, K, V features side by side), out [B, T, NH, HS],
// att [B, NH, T, T] softmax probabilities (zero above the diagonal), scale 1/sqrt(HS).
// Score and value products go through cublasSgemmStridedBatched, one call per batch row b with
// the NH heads as the batch; the causal softmax is one warp per score row. `handle` must be
// bound to `stream`. The _bf16 twins (--precision bf16) run the same products on bf16 operands.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace ntp::cuda {

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int HS,
                       cublasHandle_t handle, cudaStream_t stream);
// Accumulates (+=) into dqkv. scratch holds B*NH*T*T floats and is overwritten.
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att, int B,
                        int T, int NH, int HS, cublasHandle_t handle, cudaStream_t stream);

// As attention_forward/attention_backward, with bf16 GEMM operands (cublasGemmStridedBatchedEx,
// fp32 accumulation and results): qkv, dout, and each batch row's att and datt are cast to bf16
// into `bf16_scratch` (attention_bf16_scratch(B, T, NH, HS) elements, overwritten) for the
// products; the softmax, its backward, att, out and dqkv stay fp32.
void attention_forward_bf16(float* out, float* att, const float* qkv, int B, int T, int NH, int HS,
                            __nv_bfloat16* bf16_scratch, cublasHandle_t handle, cudaStream_t stream);
void attention_backward_bf16(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att,
                             int B, int T, int NH, int HS, __nv_bfloat16* bf16_scratch, cublasHandle_t handle,
                             cudaStream_t stream);
std::size_t attention_bf16_scratch(int B, int T, int NH, int HS);

}  // namespace ntp::cuda
