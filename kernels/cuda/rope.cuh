#pragma once
// Rotary position embeddings on the GPU; contracts as kernels/cpu/rope.hpp (angles in double).
#include <cuda_runtime.h>

namespace ntp::cuda {

void rope_forward(float* x, int B, int T, int NH, int HS, float theta, cudaStream_t stream);
void rope_backward(float* dx, int B, int T, int NH, int HS, float theta, cudaStream_t stream);

}  // namespace ntp::cuda
