#pragma once
// Residual connection on the GPU; contracts as kernels/cpu/residual.hpp.
#include <cuda_runtime.h>

namespace ntp::cuda {

// out = a + b
void residual_forward(float* out, const float* a, const float* b, long N, cudaStream_t stream);
// da += dout; db += dout
void residual_backward(float* da, float* db, const float* dout, long N, cudaStream_t stream);

}  // namespace ntp::cuda
