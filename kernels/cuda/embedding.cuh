#pragma once
// Token and position embeddings on the GPU; contracts as kernels/cpu/embedding.hpp. All pointers
// are device pointers; work is queued on `stream`.
#include <cuda_runtime.h>

namespace ntp::cuda {

// out[bt, :] = wte[local_row[tokens[bt]], :], or zeros when this rank does not own the token.
void embedding_forward(float* out, const int* tokens, const float* wte, const int* local_row, int BT, int C,
                       cudaStream_t stream);
// dwte[local_row[tokens[bt]], :] += dout[bt, :] for owned tokens. Deterministic: the first
// position of each token sums all its positions in order, then adds once (no atomics).
void embedding_backward(float* dwte, const float* dout, const int* tokens, const int* local_row, int BT, int C,
                        cudaStream_t stream);
// out[b, t, :] += wpe[t, :]
void position_embedding_forward(float* out, const float* wpe, int B, int T, int C, cudaStream_t stream);
// dwpe[t, :] += sum_b dout[b, t, :]  (b in order)
void position_embedding_backward(float* dwpe, const float* dout, int B, int T, int C, cudaStream_t stream);

}  // namespace ntp::cuda
