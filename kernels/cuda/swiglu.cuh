#pragma once
// SwiGLU on the GPU; contracts as kernels/cpu/swiglu.hpp.
#include <cuda_runtime.h>

namespace ntp::cuda {

void swiglu_forward(float* out, const float* gate, const float* up, long N, cudaStream_t stream);
void swiglu_backward(float* dgate, float* dup, const float* gate, const float* up, const float* dout, long N,
                     cudaStream_t stream);

}  // namespace ntp::cuda
