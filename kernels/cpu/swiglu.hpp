#pragma once
// SwiGLU (Llama's MLP activation): out = silu(gate) * up, silu(x) = x sigmoid(x). gate and up are
// the two column-parallel projections, elementwise partners.
namespace ntp::cpu {

void swiglu_forward(float* out, const float* gate, const float* up, long N);
// dgate += dout * up * silu'(gate);  dup += dout * silu(gate).
void swiglu_backward(float* dgate, float* dup, const float* gate, const float* up, const float* dout, long N);

}  // namespace ntp::cpu
