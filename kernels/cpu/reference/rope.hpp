#pragma once
// Frozen naive reference, single-threaded, for tests only. Same contract as kernels/cpu/rope.hpp.
namespace ntp::ref {

void rope_forward(float* x, int B, int T, int NH, int HS, float theta);
void rope_backward(float* dx, int B, int T, int NH, int HS, float theta);

}  // namespace ntp::ref
