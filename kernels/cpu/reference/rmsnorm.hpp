#pragma once
// Frozen naive reference, single-threaded, for tests only. Same contract as kernels/cpu/rmsnorm.hpp.
namespace ntp::ref {

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int BT, int C);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int BT, int C);

}  // namespace ntp::ref
