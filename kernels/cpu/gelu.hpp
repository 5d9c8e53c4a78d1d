#pragma once
// GELU, tanh approximation (GPT-2).
namespace ntp::cpu {

void gelu_forward(float* out, const float* inp, long N);
// dinp += gelu'(inp) * dout
void gelu_backward(float* dinp, const float* inp, const float* dout, long N);

}  // namespace ntp::cpu
