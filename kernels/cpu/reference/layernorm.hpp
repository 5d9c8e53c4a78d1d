#pragma once
// Frozen naive reference, single-threaded, for tests only. Same contract as kernels/cpu/layernorm.hpp.
namespace ntp::ref {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int BT, int C);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int BT, int C);

}  // namespace ntp::ref
