#include "kernels/cpu/layernorm.hpp"

#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/detail/vec_math.hpp"

namespace ntp::cpu {

namespace {

constexpr float kEps = 1e-5f;

// One row: returns {mean, rstd} and writes the normalised, scaled, shifted row.
void forward_row_scalar(float* o, float* mean, float* rstd, const float* x, const float* w, const float* b, int C) {
  float m = 0.0f;
  for (int i = 0; i < C; i++) m += x[i];
  m /= C;
  float v = 0.0f;  // two-pass variance: no cancellation from E[x^2] - E[x]^2
  for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
  v /= C;
  const float s = 1.0f / std::sqrt(v + kEps);
  for (int i = 0; i < C; i++) o[i] = (x[i] - m) * s * w[i] + b[i];
  *mean = m;
  *rstd = s;
}

__attribute__((noinline)) float forward_tail_sum(const float* x, float m, int i0, int C, bool centred) {
  float a = 0.0f;
  for (int i = i0; i < C; i++) a += centred ? (x[i] - m) * (x[i] - m) : x[i];
  return a;
}
__attribute__((noinline)) void forward_tail_out(float* o, const float* x, const float* w, const float* b, float m,
                                                float s, int i0, int C) {
  for (int i = i0; i < C; i++) o[i] = (x[i] - m) * s * w[i] + b[i];
}

NTP_AVX2 void forward_row_avx2(float* o, float* mean, float* rstd, const float* x, const float* w, const float* b,
                               int C) {
  int i = 0;
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= C; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(x + i));
  float m = detail::hsum8(acc) + forward_tail_sum(x, 0.0f, i, C, false);
  m /= C;
  const __m256 vm = _mm256_set1_ps(m);
  acc = _mm256_setzero_ps();
  for (i = 0; i + 8 <= C; i += 8) {
    const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), vm);
    acc = _mm256_add_ps(acc, _mm256_mul_ps(d, d));
  }
  float v = detail::hsum8(acc) + forward_tail_sum(x, m, i, C, true);
  v /= C;
  const float s = 1.0f / std::sqrt(v + kEps);
  const __m256 vs = _mm256_set1_ps(s);
  for (i = 0; i + 8 <= C; i += 8) {
    const __m256 n = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm), vs);
    _mm256_storeu_ps(o + i, _mm256_fmadd_ps(n, _mm256_loadu_ps(w + i), _mm256_loadu_ps(b + i)));
  }
  forward_tail_out(o, x, w, b, m, s, i, C);
  *mean = m;
  *rstd = s;
}

// One row of the backward: dx += ..., and the row's contribution to the per-thread partials
// pw (dweight) and pb (dbias).
void backward_row_scalar(float* dx, float* pw, float* pb, const float* g, const float* x, const float* w, float m,
                         float s, int C) {
  float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
  for (int i = 0; i < C; i++) {
    const float dnorm = w[i] * g[i];
    dnorm_mean += dnorm;
    dnorm_norm_mean += dnorm * (x[i] - m) * s;
  }
  dnorm_mean /= C;
  dnorm_norm_mean /= C;
  for (int i = 0; i < C; i++) {
    const float norm = (x[i] - m) * s;
    pb[i] += g[i];
    pw[i] += norm * g[i];
    dx[i] += (w[i] * g[i] - dnorm_mean - norm * dnorm_norm_mean) * s;
  }
}

// Scalar tails of the AVX2 row loops, kept out of line: inlined into an FMA-enabled function the
// compiler could contract w*g - mean into an fma, whose unrounded product no longer cancels the
// rounded one summed into the mean (at C = 1 that error is then scaled by rstd ~ 316).
__attribute__((noinline)) void backward_tail_sums(float* dm, float* dnm, const float* g, const float* x,
                                                  const float* w, float m, float s, int i0, int C) {
  for (int i = i0; i < C; i++) {
    const float dnorm = w[i] * g[i];
    *dm += dnorm;
    *dnm += dnorm * (x[i] - m) * s;
  }
}
__attribute__((noinline)) void backward_tail_update(float* dx, float* pw, float* pb, const float* g, const float* x,
                                                    const float* w, float m, float s, float dm, float dnm, int i0,
                                                    int C) {
  for (int i = i0; i < C; i++) {
    const float norm = (x[i] - m) * s;
    pb[i] += g[i];
    pw[i] += norm * g[i];
    dx[i] += (w[i] * g[i] - dm - norm * dnm) * s;
  }
}

NTP_AVX2 void backward_row_avx2(float* dx, float* pw, float* pb, const float* g, const float* x, const float* w,
                                float m, float s, int C) {
  const __m256 vm = _mm256_set1_ps(m), vs = _mm256_set1_ps(s);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= C; i += 8) {
    const __m256 dnorm = _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(g + i));
    const __m256 norm = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm), vs);
    a0 = _mm256_add_ps(a0, dnorm);
    a1 = _mm256_add_ps(a1, _mm256_mul_ps(dnorm, norm));
  }
  float dnorm_mean = detail::hsum8(a0), dnorm_norm_mean = detail::hsum8(a1);
  backward_tail_sums(&dnorm_mean, &dnorm_norm_mean, g, x, w, m, s, i, C);
  dnorm_mean /= C;
  dnorm_norm_mean /= C;
  const __m256 vdm = _mm256_set1_ps(dnorm_mean), vdnm = _mm256_set1_ps(dnorm_norm_mean);
  int j = 0;
  for (; j + 8 <= C; j += 8) {
    const __m256 gi = _mm256_loadu_ps(g + j);
    const __m256 norm = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm), vs);
    _mm256_storeu_ps(pb + j, _mm256_add_ps(_mm256_loadu_ps(pb + j), gi));
    _mm256_storeu_ps(pw + j, _mm256_add_ps(_mm256_loadu_ps(pw + j), _mm256_mul_ps(norm, gi)));
    // Rounded products, as the scalar form computes them (no fma across the cancellation).
    const __m256 t = _mm256_sub_ps(_mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(w + j), gi), vdm),
                                   _mm256_mul_ps(norm, vdnm));
    _mm256_storeu_ps(dx + j, _mm256_add_ps(_mm256_loadu_ps(dx + j), _mm256_mul_ps(t, vs)));
  }
  backward_tail_update(dx, pw, pb, g, x, w, m, s, dnorm_mean, dnorm_norm_mean, j, C);
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int BT, int C) {
  const bool avx2 = detail::has_avx2_fma();
#pragma omp parallel for schedule(static) if (long(BT) * C >= detail::kParallelMinElems)
  for (int bt = 0; bt < BT; bt++) {
    const size_t off = static_cast<size_t>(bt) * C;
    if (avx2)
      forward_row_avx2(out + off, mean + bt, rstd + bt, inp + off, weight, bias, C);
    else
      forward_row_scalar(out + off, mean + bt, rstd + bt, inp + off, weight, bias, C);
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int BT, int C) {
  // dweight/dbias reduce over BT: per-thread partials over a static row split, merged in thread
  // order (deterministic for a fixed thread count).
  const bool avx2 = detail::has_avx2_fma();
  const int nt = long(BT) * C >= detail::kParallelMinElems ? omp_get_max_threads() : 1;
  std::vector<float> part(static_cast<size_t>(nt) * 2 * C, 0.0f);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    float* pw = part.data() + static_cast<size_t>(omp_get_thread_num()) * 2 * C;
    float* pb = pw + C;
#pragma omp for schedule(static)
    for (int bt = 0; bt < BT; bt++) {
      const size_t off = static_cast<size_t>(bt) * C;
      if (avx2)
        backward_row_avx2(dinp + off, pw, pb, dout + off, inp + off, weight, mean[bt], rstd[bt], C);
      else
        backward_row_scalar(dinp + off, pw, pb, dout + off, inp + off, weight, mean[bt], rstd[bt], C);
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
