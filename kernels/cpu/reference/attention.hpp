#pragma once
// Frozen naive reference, single-threaded, for tests only. Same contract as kernels/cpu/attention.hpp.
namespace ntp::ref {

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int HS);
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att, int B,
                        int T, int NH, int HS);

}  // namespace ntp::ref
