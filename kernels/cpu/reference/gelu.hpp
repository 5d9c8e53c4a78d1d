#pragma once
// Frozen naive reference, single-threaded, for tests only. Same contract as kernels/cpu/gelu.hpp.
namespace ntp::ref {

void gelu_forward(float* out, const float* inp, long N);
void gelu_backward(float* dinp, const float* inp, const float* dout, long N);

}  // namespace ntp::ref
