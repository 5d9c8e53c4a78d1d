#pragma once
// Frozen naive reference, single-threaded, for tests only. Same contract as kernels/cpu/matmul.hpp.
#include "kernels/cpu/matmul.hpp"  // WeightLayout

namespace ntp::ref {

using ntp::cpu::WeightLayout;

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int BT, int C, int OC,
                    WeightLayout layout);
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int BT, int C, int OC, WeightLayout layout);

void bias_forward(float* out, const float* bias, int BT, int OC);
void bias_backward(float* dbias, const float* dout, int BT, int OC);

}  // namespace ntp::ref
