#pragma once
// Frozen naive reference, single-threaded, for tests only. Same contract as kernels/cpu/residual.hpp.
namespace ntp::ref {

void residual_forward(float* out, const float* a, const float* b, long N);
void residual_backward(float* da, float* db, const float* dout, long N);

}  // namespace ntp::ref
