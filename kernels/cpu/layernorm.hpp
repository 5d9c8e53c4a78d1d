#pragma once
// LayerNorm over the last dimension (eps 1e-5), as GPT-2.
namespace ntp::cpu {

// out = (inp - mean) * rstd * weight + bias; saves mean[BT] and rstd[BT] for the backward pass.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int BT, int C);
// Accumulates (+=) into dinp[BT, C], dweight[C], dbias[C].
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int BT, int C);

}  // namespace ntp::cpu
