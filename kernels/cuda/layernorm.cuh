#pragma once
// LayerNorm over the last dimension (eps 1e-5) on the GPU; contracts as kernels/cpu/layernorm.hpp.
#include <cuda_runtime.h>

#include <cstddef>

namespace ntp::cuda {

// out = (inp - mean) * rstd * weight + bias; saves mean[BT] and rstd[BT]. One warp per row.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int BT, int C, cudaStream_t stream);
// Accumulates (+=) into dinp[BT, C], dweight[C], dbias[C]. dweight/dbias are reduced over rows
// deterministically through `scratch` (layernorm_backward_scratch(BT, C) floats).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int BT, int C, float* scratch,
                        cudaStream_t stream);
std::size_t layernorm_backward_scratch(int BT, int C);

}  // namespace ntp::cuda
