#pragma once
// GELU, tanh approximation (GPT-2), on the GPU; contracts as kernels/cpu/gelu.hpp.
#include <cuda_runtime.h>

namespace ntp::cuda {

void gelu_forward(float* out, const float* inp, long N, cudaStream_t stream);
// dinp += gelu'(inp) * dout
void gelu_backward(float* dinp, const float* inp, const float* dout, long N, cudaStream_t stream);

}  // namespace ntp::cuda
