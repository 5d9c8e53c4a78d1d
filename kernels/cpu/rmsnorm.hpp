#pragma once
// RMSNorm over the last dimension (eps 1e-5), as Llama: no mean subtraction, no bias.
namespace ntp::cpu {

// out = inp * rstd * weight with rstd = 1 / sqrt(mean(inp^2) + eps); saves rstd[BT].
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int BT, int C);
// dinp += d out/d inp . dout;  dweight += sum over rows of dout * inp * rstd.
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int BT, int C);

}  // namespace ntp::cpu
