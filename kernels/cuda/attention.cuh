#pragma once
// Causal multi-head self-attention on the GPU; contracts as kernels/cpu/attention.hpp:
// qkv [B, T, NH, 3, HS] (per head: its Q, K, V features side by side), out [B, T, NH, HS],
// att [B, NH, T, T] softmax probabilities (zero above the diagonal), scale 1/sqrt(HS).
// Score and value products go through cublasSgemmStridedBatched, one call per batch row b with
// the NH heads as the batch; the causal softmax is one warp per score row. `handle` must be
// bound to `stream`.
#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace ntp::cuda {

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int HS,
                       cublasHandle_t handle, cudaStream_t stream);
// Accumulates (+=) into dqkv. scratch holds B*NH*T*T floats and is overwritten.
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att, int B,
                        int T, int NH, int HS, cublasHandle_t handle, cudaStream_t stream);

}  // namespace ntp::cuda
