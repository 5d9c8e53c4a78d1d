#include "kernels/cpu/reference/rmsnorm.hpp"

#include <cmath>

namespace ntp::ref {

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int BT, int C) {
  for (int bt = 0; bt < BT; bt++) {
    const float* x = inp + bt * C;
    float ss = 0.0f;
    for (int i = 0; i < C; i++) ss += x[i] * x[i];
    const float s = 1.0f / std::sqrt(ss / C + 1e-5f);
    for (int i = 0; i < C; i++) out[bt * C + i] = x[i] * s * weight[i];
    rstd[bt] = s;
  }
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int BT, int C) {
  for (int bt = 0; bt < BT; bt++) {
    const float* x = inp + bt * C;
    const float* g = dout + bt * C;
    const float s = rstd[bt];
    // y_i = w_i x_i s, s = (mean(x^2) + eps)^(-1/2): dx_j = s w_j g_j - x_j s^3 / C * sum_i w_i g_i x_i
    float dot = 0.0f;
    for (int i = 0; i < C; i++) dot += weight[i] * g[i] * x[i];
    for (int i = 0; i < C; i++) {
      dweight[i] += g[i] * x[i] * s;
      dinp[bt * C + i] += s * weight[i] * g[i] - x[i] * s * s * s * dot / C;
    }
  }
}

}  // namespace ntp::ref
