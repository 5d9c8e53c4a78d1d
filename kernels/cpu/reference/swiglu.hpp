#pragma once
// Frozen naive reference, single-threaded, for tests only. Same contract as kernels/cpu/swiglu.hpp.
namespace ntp::ref {

void swiglu_forward(float* out, const float* gate, const float* up, long N);
void swiglu_backward(float* dgate, float* dup, const float* gate, const float* up, const float* dout, long N);

}  // namespace ntp::ref
