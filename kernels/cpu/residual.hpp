#pragma once
namespace ntp::cpu {

// out = a + b
void residual_forward(float* out, const float* a, const float* b, long N);
// da += dout; db += dout
void residual_backward(float* da, float* db, const float* dout, long N);

}  // namespace ntp::cpu
