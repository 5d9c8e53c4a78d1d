#include "kernels/cpu/attention.hpp"

#include <cblas.h>

#include <cmath>

#include "kernels/cpu/detail/vec_math.hpp"

namespace ntp::cpu {

namespace {

// Causal softmax of one score row in place: columns [0, n) normalised, [n, T) zeroed.
void softmax_row_scalar(float* row, int n, int T) {
  float mx = row[0];
  for (int j = 1; j < n; j++) mx = row[j] > mx ? row[j] : mx;
  float sum = 0.0f;
  for (int j = 0; j < n; j++) {
    row[j] = std::exp(row[j] - mx);
    sum += row[j];
  }
  const float inv = 1.0f / sum;
  for (int j = 0; j < n; j++) row[j] *= inv;
  for (int j = n; j < T; j++) row[j] = 0.0f;
}

NTP_AVX2 void softmax_row_avx2(float* row, int n, int T) {
  int j = 0;
  __m256 vmx = _mm256_set1_ps(-INFINITY);
  for (; j + 8 <= n; j += 8) vmx = _mm256_max_ps(vmx, _mm256_loadu_ps(row + j));
  float mx = detail::hmax8(vmx);
  for (; j < n; j++) mx = row[j] > mx ? row[j] : mx;
  const __m256 m = _mm256_set1_ps(mx);
  __m256 vs = _mm256_setzero_ps();
  for (j = 0; j + 8 <= n; j += 8) {
    const __m256 e = detail::exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), m));
    _mm256_storeu_ps(row + j, e);
    vs = _mm256_add_ps(vs, e);
  }
  float sum = detail::hsum8(vs);
  for (; j < n; j++) {
    row[j] = std::exp(row[j] - mx);
    sum += row[j];
  }
  const float inv = 1.0f / sum;
  const __m256 vinv = _mm256_set1_ps(inv);
  for (j = 0; j + 8 <= n; j += 8) _mm256_storeu_ps(row + j, _mm256_mul_ps(_mm256_loadu_ps(row + j), vinv));
  for (; j < n; j++) row[j] *= inv;
  for (j = n; j < T; j++) row[j] = 0.0f;
}

// Softmax backward of one row in place: d = a * (d - sum_j a d) on [0, n), zero on [n, T).
void softmax_bwd_row_scalar(float* d, const float* a, int n, int T) {
  float dot = 0.0f;
  for (int j = 0; j < n; j++) dot += a[j] * d[j];
  for (int j = 0; j < n; j++) d[j] = a[j] * (d[j] - dot);
  for (int j = n; j < T; j++) d[j] = 0.0f;
}

NTP_AVX2 void softmax_bwd_row_avx2(float* d, const float* a, int n, int T) {
  int j = 0;
  __m256 vdot = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) vdot = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(d + j), vdot);
  float dot = detail::hsum8(vdot);
  for (; j < n; j++) dot += a[j] * d[j];
  const __m256 vd = _mm256_set1_ps(dot);
  for (j = 0; j + 8 <= n; j += 8)
    _mm256_storeu_ps(d + j, _mm256_mul_ps(_mm256_loadu_ps(a + j), _mm256_sub_ps(_mm256_loadu_ps(d + j), vd)));
  for (; j < n; j++) d[j] = a[j] * (d[j] - dot);
  for (j = n; j < T; j++) d[j] = 0.0f;
}

}  // namespace

// Per (b, head): Q, K, V are [T, HS] views into qkv with row stride ld = NH*3*HS; out/dout are
// [T, HS] views with row stride NH*HS; att/scratch blocks are dense [T, T]. The QK^T product is
// computed in full and masked afterwards: simpler than triangular blocking, at most 2x the flops
// of the (small) score GEMM.

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int HS) {
  const int ld = NH * 3 * HS, ldo = NH * HS;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const bool avx2 = detail::has_avx2_fma();
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const float* q = qkv + static_cast<size_t>(b) * T * ld + static_cast<size_t>(h) * 3 * HS;
      const float* k = q + HS;
      const float* v = q + 2 * HS;
      float* a = att + (static_cast<size_t>(b) * NH + h) * T * T;
      float* o = out + static_cast<size_t>(b) * T * ldo + static_cast<size_t>(h) * HS;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, scale, q, ld, k, ld, 0.0f, a, T);
      for (int t = 0; t < T; t++) {  // causal softmax of row t over columns 0..t
        if (avx2)
          softmax_row_avx2(a + static_cast<size_t>(t) * T, t + 1, T);
        else
          softmax_row_scalar(a + static_cast<size_t>(t) * T, t + 1, T);
      }
      // out = att @ V (zeros above the diagonal keep it causal)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T, 1.0f, a, T, v, ld, 0.0f, o, ldo);
    }
  }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att, int B,
                        int T, int NH, int HS) {
  const int ld = NH * 3 * HS, ldo = NH * HS;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const bool avx2 = detail::has_avx2_fma();
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const size_t qoff = static_cast<size_t>(b) * T * ld + static_cast<size_t>(h) * 3 * HS;
      const float* q = qkv + qoff;
      const float* k = q + HS;
      const float* v = q + 2 * HS;
      float* dq = dqkv + qoff;
      float* dk = dq + HS;
      float* dv = dq + 2 * HS;
      const float* a = att + (static_cast<size_t>(b) * NH + h) * T * T;
      float* d = scratch + (static_cast<size_t>(b) * NH + h) * T * T;
      const float* g = dout + static_cast<size_t>(b) * T * ldo + static_cast<size_t>(h) * HS;
      // dV += att^T @ dout;  datt = dout @ V^T
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, 1.0f, a, T, g, ldo, 1.0f, dv, ld);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, 1.0f, g, ldo, v, ld, 0.0f, d, T);
      // Softmax backward in place: dpre = att * (datt - sum_j att * datt); zero above the diagonal.
      for (int t = 0; t < T; t++) {
        if (avx2)
          softmax_bwd_row_avx2(d + static_cast<size_t>(t) * T, a + static_cast<size_t>(t) * T, t + 1, T);
        else
          softmax_bwd_row_scalar(d + static_cast<size_t>(t) * T, a + static_cast<size_t>(t) * T, t + 1, T);
      }
      // pre = scale * Q K^T:  dQ += scale * dpre @ K;  dK += scale * dpre^T @ Q
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T, scale, d, T, k, ld, 1.0f, dq, ld);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, scale, d, T, q, ld, 1.0f, dk, ld);
    }
  }
}

}  // namespace ntp::cpu
