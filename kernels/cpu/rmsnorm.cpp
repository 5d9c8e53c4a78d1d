#include "kernels/cpu/rmsnorm.hpp"

#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/detail/vec_math.hpp"

namespace ntp::cpu {

namespace {
constexpr float kEps = 1e-5f;

float row_sum_squares(const float* x, int C) {
  float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
  for (int i = 0; i < C; i++) ss += x[i] * x[i];
  return ss;
}

// One row of the backward: dx += ..., and its share of dweight into the thread's partial pw.
void backward_row(float* dx, float* pw, const float* g, const float* x, const float* w, float s, int C) {
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (int i = 0; i < C; i++) dot += w[i] * g[i] * x[i];
  const float k = s * s * s * dot / C;
#pragma omp simd
  for (int i = 0; i < C; i++) {
    pw[i] += g[i] * x[i] * s;
    dx[i] += s * w[i] * g[i] - x[i] * k;
  }
}
}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int BT, int C) {
#pragma omp parallel for schedule(static) if (long(BT) * C >= detail::kParallelMinElems)
  for (int bt = 0; bt < BT; bt++) {
    const float* x = inp + static_cast<size_t>(bt) * C;
    float* o = out + static_cast<size_t>(bt) * C;
    const float s = 1.0f / std::sqrt(row_sum_squares(x, C) / C + kEps);
#pragma omp simd
    for (int i = 0; i < C; i++) o[i] = x[i] * s * weight[i];
    rstd[bt] = s;
  }
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int BT, int C) {
  // dweight reduces over BT: per-thread partials over a static row split, merged in thread order
  // (deterministic for a fixed thread count), as layernorm_backward.
  const int nt = long(BT) * C >= detail::kParallelMinElems ? omp_get_max_threads() : 1;
  std::vector<float> part(static_cast<size_t>(nt) * C, 0.0f);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    float* pw = part.data() + static_cast<size_t>(omp_get_thread_num()) * C;
#pragma omp for schedule(static)
    for (int bt = 0; bt < BT; bt++) {
      const size_t off = static_cast<size_t>(bt) * C;
      backward_row(dinp + off, pw, dout + off, inp + off, weight, rstd[bt], C);
    }
  }
  for (int t = 0; t < nt; t++)
    for (int i = 0; i < C; i++) dweight[i] += part[static_cast<size_t>(t) * C + i];
}

}  // namespace ntp::cpu
