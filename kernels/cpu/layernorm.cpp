#include "kernels/cpu/layernorm.hpp"

#include <omp.h>

#include <cmath>
#include <vector>

namespace ntp::cpu {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int BT, int C) {
  constexpr float eps = 1e-5f;
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < BT; bt++) {
    const float* x = inp + static_cast<size_t>(bt) * C;
    float m = 0.0f;
    for (int i = 0; i < C; i++) m += x[i];
    m /= C;
    float v = 0.0f;  // two-pass variance: no cancellation from E[x^2] - E[x]^2
    for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
    v /= C;
    const float s = 1.0f / std::sqrt(v + eps);
    float* o = out + static_cast<size_t>(bt) * C;
    for (int i = 0; i < C; i++) o[i] = (x[i] - m) * s * weight[i] + bias[i];
    mean[bt] = m;
    rstd[bt] = s;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int BT, int C) {
  // dweight/dbias reduce over BT: per-thread partials over a static row split, merged in thread
  // order (deterministic for a fixed thread count).
  const int nt = omp_get_max_threads();
  std::vector<float> part(static_cast<size_t>(nt) * 2 * C, 0.0f);
#pragma omp parallel num_threads(nt)
  {
    float* pw = part.data() + static_cast<size_t>(omp_get_thread_num()) * 2 * C;
    float* pb = pw + C;
#pragma omp for schedule(static)
    for (int bt = 0; bt < BT; bt++) {
      const float* x = inp + static_cast<size_t>(bt) * C;
      const float* g = dout + static_cast<size_t>(bt) * C;
      float* dx = dinp + static_cast<size_t>(bt) * C;
      const float m = mean[bt], s = rstd[bt];
      float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
      for (int i = 0; i < C; i++) {
        const float dnorm = weight[i] * g[i];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * (x[i] - m) * s;
      }
      dnorm_mean /= C;
      dnorm_norm_mean /= C;
      for (int i = 0; i < C; i++) {
        const float norm = (x[i] - m) * s;
        pb[i] += g[i];
        pw[i] += norm * g[i];
        dx[i] += (weight[i] * g[i] - dnorm_mean - norm * dnorm_norm_mean) * s;
      }
    }
  }
  for (int t = 0; t < nt; t++) {
    const float* pw = part.data() + static_cast<size_t>(t) * 2 * C;
    for (int i = 0; i < C; i++) {
      dweight[i] += pw[i];
      dbias[i] += pw[C + i];
    }
  }
}

}  // namespace ntp::cpu
