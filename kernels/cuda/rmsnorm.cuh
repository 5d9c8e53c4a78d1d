#pragma once
// RMSNorm over the last dimension (eps 1e-5) on the GPU; contracts as kernels/cpu/rmsnorm.hpp.
#include <cuda_runtime.h>

#include <cstddef>

namespace ntp::cuda {

// One warp per row.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int BT, int C,
                     cudaStream_t stream);
// Accumulates into dinp and dweight; dweight is reduced over rows deterministically through
// `scratch` (rmsnorm_backward_scratch(BT, C) floats).
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int BT, int C, float* scratch, cudaStream_t stream);
std::size_t rmsnorm_backward_scratch(int BT, int C);

}  // namespace ntp::cuda
