#include "kernels/cpu/reference/layernorm.hpp"

#include <cmath>

namespace ntp::ref {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int BT, int C) {
  float eps = 1e-5f;
  for (int bt = 0; bt < BT; bt++) {
    const float* x = inp + bt * C;
    float m = 0.0f;
    for (int i = 0; i < C; i++) m += x[i];
    m = m / C;
    float v = 0.0f;
    for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
    v = v / C;
    float s = 1.0f / std::sqrt(v + eps);
    for (int i = 0; i < C; i++) out[bt * C + i] = s * (x[i] - m) * weight[i] + bias[i];
    mean[bt] = m;
    rstd[bt] = s;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int BT, int C) {
  for (int bt = 0; bt < BT; bt++) {
    const float* dout_bt = dout + bt * C;
    const float* inp_bt = inp + bt * C;
    float* dinp_bt = dinp + bt * C;
    float mean_bt = mean[bt];
    float rstd_bt = rstd[bt];

    // the two reduce operations
    float dnorm_mean = 0.0f;
    float dnorm_norm_mean = 0.0f;
    for (int i = 0; i < C; i++) {
      float norm_bti = (inp_bt[i] - mean_bt) * rstd_bt;
      float dnorm_i = weight[i] * dout_bt[i];
      dnorm_mean += dnorm_i;
      dnorm_norm_mean += dnorm_i * norm_bti;
    }
    dnorm_mean = dnorm_mean / C;
    dnorm_norm_mean = dnorm_norm_mean / C;

    // accumulate all the gradients
    for (int i = 0; i < C; i++) {
      float norm_bti = (inp_bt[i] - mean_bt) * rstd_bt;
      float dnorm_i = weight[i] * dout_bt[i];
      dbias[i] += dout_bt[i];
      dweight[i] += norm_bti * dout_bt[i];
      float dval = 0.0f;
      dval += dnorm_i;                     // term 1
      dval -= dnorm_mean;                  // term 2
      dval -= norm_bti * dnorm_norm_mean;  // term 3
      dval *= rstd_bt;                     // final scale
      dinp_bt[i] += dval;
    }
  }
}

}  // namespace ntp::ref
