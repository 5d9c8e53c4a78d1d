#include "kernels/cpu/adamw.hpp"

#include <omp.h>

#include <cmath>
#include <vector>

namespace ntp::cpu {

void adamw_update(float* params, const float* grads, float* m, float* v, long n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, float grad_scale, int t) {
  const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(t));
  const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(t));
#pragma omp parallel for schedule(static)
  for (long i = 0; i < n; i++) {
    const float g = grads[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    params[i] -= lr * ((mi / bc1) / (std::sqrt(vi / bc2) + eps) + weight_decay * params[i]);
  }
}

double sum_squares(const float* x, long n) {
  // Per-thread partials summed in thread order: deterministic for a fixed thread count
  // (an OpenMP reduction clause leaves the combining order unspecified).
  std::vector<double> part(omp_get_max_threads(), 0.0);
#pragma omp parallel
  {
    double s = 0.0;
#pragma omp for schedule(static)
    for (long i = 0; i < n; i++) s += static_cast<double>(x[i]) * x[i];
    part[omp_get_thread_num()] = s;
  }
  double total = 0.0;
  for (double s : part) total += s;
  return total;
}

}  // namespace ntp::cpu
