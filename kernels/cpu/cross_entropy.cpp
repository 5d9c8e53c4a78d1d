#include "kernels/cpu/cross_entropy.hpp"

#include <cmath>

#include "kernels/cpu/detail/vec_math.hpp"

namespace ntp::cpu {

namespace {

float row_max_scalar(const float* x, int Vl) {
  float mx = -INFINITY;
  for (int j = 0; j < Vl; j++) mx = x[j] > mx ? x[j] : mx;
  return mx;
}

NTP_AVX2 float row_max_avx2(const float* x, int Vl) {
  __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
  int j = 0;
  for (; j + 16 <= Vl; j += 16) {
    m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + j));
    m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + j + 8));
  }
  float mx = detail::hmax8(_mm256_max_ps(m0, m1));
  for (; j < Vl; j++) mx = x[j] > mx ? x[j] : mx;
  return mx;
}

// sum_j exp(x[j] - mx), accumulated in double: the sum runs over up to the full vocabulary.
double row_expsum_scalar(const float* x, float mx, int Vl) {
  double s = 0.0;
  for (int j = 0; j < Vl; j++) s += std::exp(x[j] - mx);
  return s;
}

NTP_AVX2 double row_expsum_avx2(const float* x, float mx, int Vl) {
  const __m256 m = _mm256_set1_ps(mx);
  __m256d s0 = _mm256_setzero_pd(), s1 = s0;
  int j = 0;
  for (; j + 8 <= Vl; j += 8) {
    const __m256 e = detail::exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), m));
    s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  double s = detail::hsum4d(_mm256_add_pd(s0, s1));
  for (; j < Vl; j++) s += std::exp(x[j] - mx);
  return s;
}

// d[j] = exp(x[j] - mx) * scale, reading x[j] before writing d[j] (d may alias x).
void row_softmax_scaled_scalar(float* d, const float* x, float mx, float inv, float dloss, int Vl) {
  for (int j = 0; j < Vl; j++) d[j] = std::exp(x[j] - mx) * inv * dloss;
}

NTP_AVX2 void row_softmax_scaled_avx2(float* d, const float* x, float mx, float inv, float dloss, int Vl) {
  const __m256 m = _mm256_set1_ps(mx), vi = _mm256_set1_ps(inv), vd = _mm256_set1_ps(dloss);
  int j = 0;
  for (; j + 8 <= Vl; j += 8)
    _mm256_storeu_ps(d + j, _mm256_mul_ps(_mm256_mul_ps(detail::exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), m)), vi), vd));
  for (; j < Vl; j++) d[j] = std::exp(x[j] - mx) * inv * dloss;
}

}  // namespace

void crossentropy_local_max(float* row_max, const float* logits, int BT, int Vl) {
  const bool avx2 = detail::has_avx2_fma();
#pragma omp parallel for schedule(static) if (long(BT) * Vl >= detail::kParallelMinOptimizer)
  for (int bt = 0; bt < BT; bt++) {
    const float* x = logits + static_cast<size_t>(bt) * Vl;
    row_max[bt] = avx2 ? row_max_avx2(x, Vl) : row_max_scalar(x, Vl);
  }
}

void crossentropy_local_sums(float* sums, const float* logits, const float* row_max, const int* targets,
                             const int* local_row, int BT, int Vl) {
  const bool avx2 = detail::has_avx2_fma();
#pragma omp parallel for schedule(static) if (long(BT) * Vl >= detail::kParallelMinOptimizer)
  for (int bt = 0; bt < BT; bt++) {
    const float* x = logits + static_cast<size_t>(bt) * Vl;
    const double s = avx2 ? row_expsum_avx2(x, row_max[bt], Vl) : row_expsum_scalar(x, row_max[bt], Vl);
    const int row = local_row[targets[bt]];
    sums[2 * bt] = static_cast<float>(s);
    sums[2 * bt + 1] = row >= 0 ? x[row] : 0.0f;
  }
}

void crossentropy_loss(float* losses, const float* row_max, const float* sums, int BT) {
  for (int bt = 0; bt < BT; bt++) losses[bt] = std::log(sums[2 * bt]) + row_max[bt] - sums[2 * bt + 1];
}

void crossentropy_backward(float* dlogits, const float* logits, const float* row_max, const float* sums,
                           const int* targets, const int* local_row, float dloss, int BT, int Vl) {
  // Elementwise read-then-write per j, so dlogits may alias logits.
  const bool avx2 = detail::has_avx2_fma();
#pragma omp parallel for schedule(static) if (long(BT) * Vl >= detail::kParallelMinOptimizer)
  for (int bt = 0; bt < BT; bt++) {
    const float* x = logits + static_cast<size_t>(bt) * Vl;
    float* d = dlogits + static_cast<size_t>(bt) * Vl;
    const float mx = row_max[bt];
    const float inv = 1.0f / sums[2 * bt];
    if (avx2)
      row_softmax_scaled_avx2(d, x, mx, inv, dloss, Vl);
    else
      row_softmax_scaled_scalar(d, x, mx, inv, dloss, Vl);
    const int row = local_row[targets[bt]];
    if (row >= 0) d[row] -= dloss;
  }
}

}  // namespace ntp::cpu
