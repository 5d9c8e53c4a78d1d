#include "kernels/cpu/reference/adamw.hpp"

#include <cmath>

namespace ntp::ref {

void adamw_update(float* params, const float* grads, float* m, float* v, long n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, float grad_scale, int t) {
  for (long i = 0; i < n; i++) {
    float g = grads[i] * grad_scale;
    m[i] = beta1 * m[i] + (1.0f - beta1) * g;
    v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
    float m_hat = m[i] / (1.0f - std::pow(beta1, static_cast<float>(t)));
    float v_hat = v[i] / (1.0f - std::pow(beta2, static_cast<float>(t)));
    params[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + weight_decay * params[i]);
  }
}

double sum_squares(const float* x, long n) {
  double s = 0.0;
  for (long i = 0; i < n; i++) s += static_cast<double>(x[i]) * x[i];
  return s;
}

}  // namespace ntp::ref
